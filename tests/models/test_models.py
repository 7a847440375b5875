"""The architecture contract: every family, several option sets, the same checks.

Tiny sizes throughout (d_model 32, 2 layers, context 16, vocab 64) so the file runs in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from ablate import models
from ablate.models.contract import FamilyModule, FamilyOptions, LanguageModel, ModelWithParts
from ablate.models.mixer import SequenceMixing
from ablate.models.mod import RoutedLayer
from ablate.objectives.base import causal_lm_loss
from ablate.objectives.stack_options import WITH_PARTS
from ablate.config import TrialConfig

VOCAB, BATCH, CONTEXT = 64, 2, 16


@dataclass(frozen=True)
class Case:
    architecture: str
    options: dict[str, Any] = field(default_factory=dict)
    trial: dict[str, Any] = field(default_factory=dict)  # extra TrialConfig fields, e.g. kv_heads
    is_causal: bool = True  # in eval mode; False documents a known leak, which the suite asserts

    def __str__(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in {**self.options, **self.trial}.items())
        return f"{self.architecture}[{opts}]" if opts else self.architecture


# every built-in family at its defaults, from the registry's list (a new family is collected without editing this
# file), then option sets that exercise its variants
CASES = [Case(name) for name in models.ZOO] + [
    Case("llama", {"tie_weights": True, "intermediate": 48}, {"kv_heads": 2}),
    Case("gpt", {"variant": "gpt2", "tie_weights": False}),
    Case("mixer", {"expand": 2}),
    Case("mixer", {"parallel_convs": 2, "kernel": 3}),
    Case("mixer", {"mixer_heads": 2, "kernel": 2}),
    Case("mixer", {"mixer_heads": 2, "head_dim": 8, "expand": 2, "parallel_convs": 2}),
    Case("mixer", {"positional": "first", "embed_linear": True, "tie_weights": True, "ffn_mult": 2}),
    Case("mixer", {"positional": "every", "norm": False, "activation": "none"}),
    Case("hybrid", {"placement": "parallel", "tie_weights": True, "intermediate": 48}, {"kv_heads": 2}),
    Case("metaformer", {"token_mixer": "metric"}),
    Case("metaformer", {"token_mixer": "metric", "metric_form": "symmetric", "tie_weights": True}),
    Case("metaformer", {"token_mixer": "quadratic"}),
    Case("metaformer", {"token_mixer": "pool", "ffn_mult": 2}),
    Case("metaformer", {"token_mixer": "identity"}),
    Case("metaformer", {"token_mixer": "none", "bias": False, "ffn_mult": 2}),
    Case("metaformer", {"token_mixer": "quadratic", "bias": False}),
    Case("mod", {"every": 1, "capacity": 0.5, "intermediate": 48, "tie_weights": True}, {"kv_heads": 2}),
    Case("mod", {"capacity": 0.3, "capacity_rounding": "floor", "first_routed": 0, "output": "block", "tie_weights": True}),
]  # mod's softmax router and top-k inference are refused as non-causal (tests/models/test_causality.py)


def make_trial(case: Case) -> TrialConfig:
    fields = dict(d_model=32, layers=2, heads=4, context=CONTEXT, lr=1e-3, batch_size=BATCH)
    fields.update(case.trial)
    return TrialConfig(architecture=case.architecture, options=case.options, dataset={"source": "x"},
                       budget={"steps": 1}, **fields)


def make_model(case: Case, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return models.build(make_trial(case), VOCAB)


def tokens(seed: int = 0, length: int = CONTEXT) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(seed))


def sequence_mixings(model: torch.nn.Module) -> list[SequenceMixing]:
    return [m for m in model.modules() if isinstance(m, SequenceMixing)]


def routed_layers(model: torch.nn.Module) -> list[RoutedLayer]:
    return [m for m in model.modules() if isinstance(m, RoutedLayer)]


@pytest.fixture(params=CASES, ids=str)
def case(request) -> Case:
    return request.param


# ---------------------------------------------------------------- the contract


def test_family_exposes_the_contract(case):
    family, sizes = models.family(case.architecture), models.options_module(case.architecture)
    assert isinstance(family, FamilyModule), f"{case.architecture} lacks build"
    assert isinstance(sizes, FamilyOptions), f"{case.architecture}'s options module lacks part of the contract"
    for name in ("Options", "param_count", "inter_token_params", "mixing_flops_per_token"):
        assert getattr(family, name) is getattr(sizes, name), f"{case.architecture} does not re-export {name}"
    trial = make_trial(case)
    assert isinstance(sizes.mixing_flops_per_token(trial), float)
    assert 0 <= sizes.inter_token_params(trial) <= sizes.param_count(trial, VOCAB)
    model = make_model(case)
    assert isinstance(model, LanguageModel)
    assert isinstance(model, ModelWithParts) == (case.architecture in WITH_PARTS), (
        f"{case.architecture}: objectives/stack_options.WITH_PARTS must list exactly the families whose models have parts")


def test_the_contract_check_refuses_what_lacks_a_part():
    """The Protocols are checks that can fail: a model without hidden_states, a module without build."""
    assert not isinstance(torch.nn.Linear(2, 2), LanguageModel)
    assert not isinstance(models.options_module("mixer"), FamilyModule)
    assert not isinstance(torch.nn.Linear(2, 2), ModelWithParts)


def test_shapes(case):
    model = make_model(case).eval()
    x = tokens()
    assert model(x).shape == (BATCH, CONTEXT, VOCAB)
    assert model.hidden_states(x).shape == (BATCH, CONTEXT, 32)


def test_param_count_is_exact(case):
    model = make_model(case)
    sizes = models.options_module(case.architecture)
    assert sizes.param_count(make_trial(case), VOCAB) == sum(p.numel() for p in model.parameters())


def _changes_before(model, x: torch.Tensor, t: int, seed: int) -> float:
    """Largest change of logits at positions <= t when every token after t is replaced."""
    y = x.clone()
    y[:, t + 1 :] = tokens(seed)[:, t + 1 :]
    with torch.no_grad():
        return (model(x)[:, : t + 1] - model(y)[:, : t + 1]).abs().max().item()


def test_causality(case):
    model = make_model(case).eval()
    with torch.no_grad():  # masked weights become non-zero: the mask must be in the computation, not the init
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
        for layer in routed_layers(model):  # decisive routers, so that the aux router's selection is mixed
            for linear in (layer.router, layer.aux_router[0], layer.aux_router[2]):
                torch.nn.init.normal_(linear.weight)
                if linear.bias is not None:
                    torch.nn.init.zeros_(linear.bias)
    x = tokens()
    positions = [0, 3, CONTEXT // 2, CONTEXT - 2]
    if case.is_causal:
        for t in positions:
            assert _changes_before(model, x, t, seed=t + 1) <= 1e-5, f"future tokens changed outputs at <= {t}"
        for layer in routed_layers(model):  # the aux router must make a real, mixed selection
            assert 0 < layer.last_selected.sum() < layer.last_selected.numel()
    else:
        leaks = [_changes_before(model, x, t, seed) for t in range(2, CONTEXT - 2) for seed in range(1, 4)]
        assert max(leaks) > 1e-4, "this option is documented as non-causal but did not leak"


def test_shorter_sequence_is_a_prefix(case):
    if not case.is_causal:
        pytest.skip("non-causal option: a prefix need not match")
    model = make_model(case).eval()
    x = tokens()
    with torch.no_grad():
        full, short = model(x), model(x[:, :10])
    torch.testing.assert_close(short, full[:, :10], atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_parameter_and_skip_masked_entries(case):
    model = make_model(case).train()
    logits = model(tokens())
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens(seed=9).reshape(-1))  # every position
    aux = model.auxiliary_loss() if hasattr(model, "auxiliary_loss") else None  # as the trainer adds it
    (loss if aux is None else loss + aux).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} received no gradient"
    for mixing in sequence_mixings(model):
        for p, masked in mixing.causal_masks():
            assert torch.all(p.grad[masked] == 0), "masked (upper-triangle) weights received gradient"
            if mixing.expand == 1:
                assert torch.all(p.grad[~masked] != 0), "an unmasked sequence weight received no gradient"


def test_training_lowers_the_loss_and_keeps_masked_weights_zero(case):
    model = make_model(case).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x = tokens()
    losses = []
    for _ in range(30):
        total, count = causal_lm_loss(model(x), x)
        loss = total / count
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], f"loss went {losses[0]:.3f} -> {losses[-1]:.3f}"
    for mixing in sequence_mixings(model):
        for p, masked in mixing.causal_masks():
            assert torch.all(p[masked] == 0), "masked weights moved away from zero"


def test_state_dict_round_trip(case):
    model, other = make_model(case, seed=0).eval(), make_model(case, seed=1).eval()
    other.load_state_dict(model.state_dict())
    x = tokens()
    with torch.no_grad():
        assert torch.equal(model(x), other(x))


def test_bf16_autocast(case):
    model = make_model(case).train()
    x = tokens()
    with torch.no_grad():
        total, count = causal_lm_loss(model(x), x)
        reference = (total / count).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    total, count = causal_lm_loss(logits, x)
    loss = total / count
    loss.backward()
    assert math.isfinite(loss.item()) and abs(loss.item() - reference) < 0.1
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------- family specifics


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("kernel", [1, 2, 3, 4])
def test_mixer_kernel_matches_the_studies_conv1d(kernel):
    """Our matmul formulation equals Conv1d(context, context, kernel, padding='same') with tril per tap."""
    torch.manual_seed(0)
    mixing = SequenceMixing(CONTEXT, kernel=kernel)
    x = torch.randn(BATCH, CONTEXT, 32)
    weight = rearrange(torch.tril(mixing.weight[0, :, 0]), "k o i -> o i k")  # Conv1d's (out, in, k)
    expected = F.conv1d(x, weight, mixing.bias[0, 0], padding="same")
    torch.testing.assert_close(mixing(x[:, None])[:, 0], expected, atol=1e-5, rtol=1e-5)


def test_mod_gathered_and_masked_paths_agree():
    """The training path (gather the top-k, RoPE at original positions) equals the masked full-sequence path."""
    model = make_model(Case("mod", {"capacity": 0.25})).eval()
    layer = routed_layers(model)[0]
    x = torch.randn(BATCH, CONTEXT, 32)
    scores = layer.router(x)[..., 0]
    index = scores.topk(4, dim=1).indices.sort(dim=1).values
    selected = torch.zeros(BATCH, CONTEXT, dtype=torch.bool).scatter(1, index, True)
    with torch.no_grad():
        torch.testing.assert_close(layer._through_gathered(x, scores, index), layer._through_masked(x, scores, selected))


def test_mod_trains_with_top_k_and_hands_its_aux_loss_to_the_trainer():
    model = make_model(Case("mod", {"capacity": 0.25, "every": 1})).train()
    logits = model(tokens())
    for layer in routed_layers(model):
        assert torch.all(layer.last_selected.sum(dim=1) == math.ceil(0.25 * CONTEXT))
    aux = model.auxiliary_loss()
    assert aux.requires_grad and aux.item() > 0
    assert model.auxiliary_loss() is None, "collecting the aux loss clears it"
    logits.sum().backward()  # the main loss alone does not reach the aux router: the trainer must add aux
    assert all(p.grad is None for layer in routed_layers(model) for p in layer.aux_router.parameters())
    with torch.no_grad():
        model(tokens())
    assert model.auxiliary_loss() is None, "no aux loss without grad"
    model.eval()(tokens())
    assert model.auxiliary_loss() is None, "no aux loss in eval mode"


def test_mod_can_run_the_blogs_code_capacity_layers_and_output_form():
    """The blog's code (joey00072/ohara mixture_of_depth.py): top_k = int(capacity * T), [MoD, Block, MoD, ...],
    and out = x + w * block(x) with the block's output including x; ours by default: ceil, [Block, MoD, ...],
    x + w * (block(x) - x)."""
    from ablate.models.mod_options import Options

    assert Options(capacity=0.12, capacity_rounding="floor").capacity_tokens(512) == 61
    assert Options(capacity=0.12).capacity_tokens(512) == 62 and Options(capacity=0.01).capacity_tokens(16) == 1
    blog = make_model(Case("mod", {"capacity": 0.25, "first_routed": 0, "output": "block"}, {"layers": 4}))
    ours = make_model(Case("mod", {"capacity": 0.25}, {"layers": 4}))
    assert [isinstance(m, RoutedLayer) for m in blog.layers] == [True, False, True, False]
    assert [isinstance(m, RoutedLayer) for m in ours.layers] == [False, True, False, True]
    x = torch.randn(BATCH, CONTEXT, 32)
    for model, adds_input in ((blog, False), (ours, True)):
        layer = routed_layers(model)[0].train()
        with torch.no_grad():
            out = layer(x)
            index = layer.router(x)[..., 0].topk(4, dim=1).indices.sort(dim=1).values  # int(0.25 * 16) = 4
            from ablate.models.llama import rotary

            gather = index[..., None].expand(-1, -1, 32)
            xs = x.gather(1, gather)
            block = layer.block(xs, *rotary(index, 8))  # (B, C, D): the block's output, x included
            weight = torch.sigmoid(layer.router(xs)[..., 0])[..., None]
            expected = x.scatter_add(1, gather, weight * (block - xs if adds_input else block))
        torch.testing.assert_close(out, expected)


def _aux_router_grads(model, scale: float) -> list[torch.Tensor]:
    """Aux-router gradients of scale * (loss + model.auxiliary_loss()), as a GradScaler backpropagates them."""
    model.zero_grad()
    total, count = causal_lm_loss(model(tokens()), tokens())
    (scale * (total / count + model.auxiliary_loss())).backward()
    return [p.grad.clone() for layer in routed_layers(model) for p in layer.aux_router.parameters()]


def test_mod_aux_loss_gradient_scales_with_the_loss_scale():
    """An fp16 GradScaler multiplies the loss by its scale and divides gradients by it: the aux loss must scale too."""
    model = make_model(Case("mod", {"capacity": 0.25})).train()
    plain, scaled = _aux_router_grads(model, 1.0), _aux_router_grads(model, 65536.0)
    assert all(g.abs().sum() > 0 for g in plain)
    for g, s in zip(plain, scaled):
        torch.testing.assert_close(s / 65536.0, g)


@pytest.mark.parametrize("architecture", ["llama", "gpt", "hybrid", "mod"])
def test_families_that_need_heads_say_so(architecture):
    with pytest.raises(ValueError, match="heads"):
        make_trial(Case(architecture, trial={"heads": None}))


def test_list_families_describes_every_option():
    listed = {f["name"]: f for f in models.list_families()}
    assert set(listed) == set(models.families())
    for name, entry in listed.items():
        assert entry["description"]
        options = {o["name"]: o for o in entry["options"]}
        assert set(options) == set(models.options_model(name).model_fields)
        assert all({"type", "default"} <= set(o) for o in options.values())
    expand = {o["name"]: o for o in listed["mixer"]["options"]}["expand"]
    assert (expand["type"], expand["default"]) == ("int", 1)
    placement = {o["name"]: o for o in listed["hybrid"]["options"]}["placement"]
    assert placement["type"] == "'sequential' | 'parallel'"
