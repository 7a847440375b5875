"""The eval-mode causality contract, for every family and every option value `ablate models` lists.

Eval loss, generated samples and retrieval embeddings come from eval-mode forwards, so there a model's
logits at position t must depend only on its own row's tokens at positions <= t: (a) replacing or
dropping later tokens never moves them, (b) changing the other rows of the batch never moves them.
Option values the project refuses because they cannot be evaluated causally must be refused when the
spec is read, with that reason. Tiny sizes (d_model 16, 2 layers, context 8, vocab 32) keep it fast.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest
import torch

from ablate import models
from ablate.config.errors import SpecError
from ablate.models.mod import RoutedLayer
from ablate.config import TrialConfig, expand_grid, parse_spec

VOCAB, BATCH, CONTEXT = 32, 3, 8
SIZES = dict(d_model=16, layers=2, heads=2, context=CONTEXT, lr=1e-3, batch_size=BATCH)
LENGTHS = (CONTEXT, CONTEXT - 3, 1)  # every family takes T <= context (the mixer's maps use their top-left T x T)
MISSING = "<no value chosen>"

# Two legal values of each numeric option: the one that is not the default is checked, and the default.
OTHER_VALUES: dict[str, dict[str, tuple[Any, Any]]] = {
    "llama": {"intermediate": (24, 40), "dropout": (0.0, 0.2)},  # eval mode must switch dropout off
    "gpt": {"dropout": (0.0, 0.1)},  # eval mode must switch dropout off
    "mixer": {"expand": (1, 2), "parallel_convs": (1, 2), "kernel": (1, 3), "mixer_heads": (0, 2), "head_dim": (0, 4),
              "ffn_mult": (4, 2)},
    "hybrid": {"intermediate": (24, 40)},
    "metaformer": {"ffn_mult": (4, 2), "pool_kernel": (3, 5)},
    "mod": {"capacity": (0.125, 0.5), "every": (2, 1), "intermediate": (24, 40), "first_routed": (None, 0),
            "dropout": (0.0, 0.2)},
}
# The options an option needs set to be legal, or to have any effect.
COMPANIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("mixer", "head_dim"): {"mixer_heads": 2},
    ("metaformer", "metric_form"): {"token_mixer": "metric"},
    ("metaformer", "pool_kernel"): {"token_mixer": "pool"},  # (it shapes only the unmasked pool, refused here)
    ("metaformer", "pool_features"): {"token_mixer": "pool"},
}
# Trial fields that change a family's computation beyond its options: grouped key/value heads.
TRIAL_VALUES: dict[str, dict[str, Any]] = {"llama": {"kv_heads": 1}, "hybrid": {"kv_heads": 1}, "mod": {"kv_heads": 1}}
# Option values refused when the spec is read: no causal evaluation exists for them.
# (metaformer's unmasked mode is for classification only: refused for the language models checked here)
REFUSED = {("mod", "router", "softmax"), ("mod", "inference_router", "topk"), ("metaformer", "causal", False)}


def listed_values(option: dict[str, Any], family: str) -> list[Any]:
    """The values to check for one option as `ablate models` lists it."""
    kind = option["type"]
    if kind == "bool":
        return [False, True]
    if kind.startswith("'"):  # Literal choices, written "'a' | 'b'"
        return [ast.literal_eval(choice) for choice in kind.split(" | ")]
    legal = OTHER_VALUES.get(family, {}).get(option["name"], (MISSING,))
    return [option["default"], next(v for v in legal if v != option["default"])]


def built_in_families() -> list[dict[str, Any]]:
    """The zoo as `ablate models` lists it (an installed plugin package is its author's to check: `ablate check`)."""
    return [family for family in models.list_families() if family["source"] == "built-in"]


def all_cases() -> list[tuple[str, str, Any]]:
    cases = []
    for family in built_in_families():
        for option in family["options"]:
            cases += [(family["name"], option["name"], v) for v in listed_values(option, family["name"])]
        cases += [(family["name"], f"trial.{k}", v) for k, v in TRIAL_VALUES.get(family["name"], {}).items()]
    return cases


def as_param(case: tuple[str, str, Any]) -> Any:
    family, option, value = case
    return pytest.param(*case, id=f"{family}-{option}={value}")


CASES = all_cases()
ACCEPTED = [as_param(c) for c in CASES if c not in REFUSED]


def trial_fields(family: str, option: str, value: Any) -> dict[str, Any]:
    if option.startswith("trial."):
        return dict(SIZES, **{option.removeprefix("trial."): value}, architecture=family, options={})
    return dict(SIZES, architecture=family, options={**COMPANIONS.get((family, option), {}), option: value})


def make_trial(family: str, option: str, value: Any) -> TrialConfig:
    if value == MISSING:
        pytest.fail(f"choose two legal values of {family}.{option} in OTHER_VALUES")
    return TrialConfig(dataset={"source": "x"}, budget={"steps": 1}, **trial_fields(family, option, value))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one intra-op thread is fastest, and two fight a busy machine (measured 9 s vs 114 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def eval_model(family: str, option: str, value: Any) -> torch.nn.Module:
    """The built model in eval mode, every weight nudged (so that a missing mask shows) and MoD's routers decisive."""
    torch.manual_seed(0)
    model = models.build(make_trial(family, option, value), VOCAB).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
        for layer in routed_layers(model):  # so that the aux router's selection differs between tokens
            for linear in (layer.router, layer.aux_router[0], layer.aux_router[2]):
                torch.nn.init.normal_(linear.weight)
    return model


def routed_layers(model: torch.nn.Module) -> list[RoutedLayer]:
    return [m for m in model.modules() if isinstance(m, RoutedLayer)]


def tokens(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(seed))


def changed(x: torch.Tensor, seed: int) -> torch.Tensor:
    """x with every token replaced by a different one."""
    return (x + 1 + tokens(x.shape[1], seed)[: x.shape[0]] % (VOCAB - 1)) % VOCAB  # offsets 1 .. VOCAB - 1


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)  # (B, T, V)


def tolerance(reference: torch.Tensor) -> float:
    return 1e-5 * max(1.0, reference.abs().max().item())


# ---------------------------------------------------------------- the contract


def test_every_listed_option_is_checked():
    checked = {(family, option) for family, option, _ in CASES}
    for family in built_in_families():
        for option in family["options"]:
            assert (family["name"], option["name"]) in checked


@pytest.mark.parametrize(("family", "option", "value"), ACCEPTED)
def test_later_tokens_never_move_earlier_logits(family, option, value):
    model = eval_model(family, option, value)
    full = tokens(CONTEXT, seed=1)
    reference = logits(model, full)
    tol = tolerance(reference)
    for layer in routed_layers(model):  # a uniform selection would hide a leak through it
        assert 0 < layer.last_selected.sum() < layer.last_selected.numel(), "the aux router selected all or none"
    for length in LENGTHS:
        x = full[:, :length]
        base = logits(model, x)
        torch.testing.assert_close(base, reference[:, :length], atol=tol, rtol=0,
                                   msg=lambda m: f"dropping tokens after {length - 1} moved the logits before: {m}")
        for t in sorted({0, length // 2, length - 2} & set(range(length - 1))):
            y = x.clone()
            y[:, t + 1 :] = changed(x, seed=10 + t)[:, t + 1 :]
            moved = logits(model, y)
            leak = (moved[:, : t + 1] - base[:, : t + 1]).abs().max().item()
            assert leak <= tol, f"T={length}: tokens after {t} moved logits at <= {t} by {leak:.3g} (tolerance {tol:.3g})"
            assert (moved[:, t + 1 :] - base[:, t + 1 :]).abs().max() > tol, "the changed tokens moved nothing"


@pytest.mark.parametrize(("family", "option", "value"), ACCEPTED)
def test_other_rows_never_move_a_row(family, option, value):
    model = eval_model(family, option, value)
    for length in LENGTHS:
        x = tokens(length, seed=2)
        base = logits(model, x)
        tol = tolerance(base)
        for row in range(BATCH):
            y = changed(x, seed=20 + row)
            y[row] = x[row]
            leak = (logits(model, y)[row] - base[row]).abs().max().item()
            assert leak <= tol, f"T={length}: changing the other rows moved row {row} by {leak:.3g} (tolerance {tol:.3g})"


@pytest.mark.parametrize(("family", "option", "value"), [as_param(c) for c in CASES if c in REFUSED])
def test_non_causal_values_are_refused_when_the_spec_is_read(family, option, value):
    fields = trial_fields(family, option, value)
    spec = parse_spec({"name": "refused", "dataset": {"source": "x"}, "budget": {"steps": 1},
                       "defaults": {k: v for k, v in fields.items() if k != "options"},
                       "grid": [{"options": fields["options"]}]})
    with pytest.raises(SpecError) as refused:
        expand_grid(spec)
    message = str(refused.value)
    assert f"grid[0]: options.{option}: {value} cannot be evaluated causally" in message
    assert "later tokens" in message, "the refusal must say why: outputs would depend on later tokens"
