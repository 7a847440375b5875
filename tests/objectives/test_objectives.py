"""Contract tests of every objective: no leakage, the autoencoder's bottleneck, learning, the real trainer."""

from __future__ import annotations

import math

import pytest
import torch

from ablate import store
from ablate.config.errors import SpecError
from ablate.config import TrialConfig, parse_spec, registry
from ablate.objectives import base as objectives
from ablate.train import TrainerSettings, train

VOCAB, T = 50, 12
# the objectives over token streams; classification reads labelled documents (tests/objectives/test_classification.py)
TOKEN_OBJECTIVES = tuple(o for o in registry.objectives() if o != "classification")
ARCHS = ("mixer", "llama")


def trial(arch: str = "mixer", objective: str = "clm", **over) -> TrialConfig:
    base = dict(architecture=arch, objective=objective, d_model=32, layers=4, context=T, lr=3e-3, batch_size=4,
                precision="fp32", dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 16}},
                tokenizer={"vocab_size": 384}, budget={"steps": 20}, eval={"at": [0.5]}, warmup=0.1)
    if arch == "llama":
        base["heads"] = 4
    base.update(over)
    return TrialConfig(**base)


def model_of(t: TrialConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return objectives.model_for(t, VOCAB).eval()


def ids(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))


def perturbed(x: torch.Tensor, position: int) -> torch.Tensor:
    y = x.clone()
    y[:, position] = (y[:, position] + 7) % VOCAB
    return y


def changed(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not torch.allclose(a, b, atol=1e-5)


# ---------------------------------------------------------------- leakage


@pytest.mark.parametrize("arch", ARCHS)
def test_bidirectional_logits_never_see_their_own_token_but_see_both_sides(arch):
    model = model_of(trial(arch, "bidirectional"))
    x = ids()
    with torch.no_grad():
        base = model(x)
        for j in range(T):
            other = model(perturbed(x, j))
            assert not changed(base[:, j], other[:, j]), f"position {j} sees its own token"
            if 0 < j < T - 1:
                assert changed(base[:, j - 1], other[:, j - 1]), "no information from the right"
                assert changed(base[:, j + 1], other[:, j + 1]), "no information from the left"


@pytest.mark.parametrize("arch", ARCHS)
def test_multi_token_predictions_never_see_their_targets(arch):
    t = trial(arch, "multi_token", objective_options={"n_tokens": 3})
    model = model_of(t)
    x = ids()
    # recompute the chained passes; pass i's logits at position p predict token p + 1 + i
    with torch.no_grad():
        def passes(inp):
            out, cur = [], inp
            for _ in range(3):
                logits = model(cur)
                out.append(logits)
                cur = logits.argmax(-1)
            return out

        base = passes(x)
        for j in range(1, T):
            other = passes(perturbed(x, j))
            for i in range(3):
                p = j - 1 - i
                if p >= 0:
                    assert not changed(base[i][:, p], other[i][:, p]), f"pass {i} at {p} sees its target {j}"
    labels = x.clone()
    total, count = objectives.loss_function(t)(model, x, labels)
    assert int(count) == sum(2 * (T - 1 - i) for i in range(3)) and torch.isfinite(total)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_step_predictions_see_only_the_given_half(arch):
    t = trial(arch, "one_step")
    model = model_of(t)
    given = model.given(T)
    assert given == T // 2 and model.mask_layer == 2
    x = ids()
    with torch.no_grad():
        base = model(x)
        for j in range(given, T):  # no token of the prediction half reaches any prediction
            assert not changed(base[:, given - 1:], model(perturbed(x, j))[:, given - 1:]), f"token {j} leaks"
        assert changed(base[:, given - 1:], model(perturbed(x, 0))[:, given - 1:]), "the given half is unused"
    _, count = objectives.loss_function(t)(model, x, x.clone())
    assert int(count) == 2 * (T - given)  # loss only on the prediction half


@pytest.mark.parametrize("arch", ARCHS)
def test_autoencoder_decoder_sees_the_input_only_through_one_vector(arch, monkeypatch):
    model = model_of(trial(arch, "autoencoder"))
    x = ids()
    with torch.no_grad():
        base = model(x)
        assert torch.allclose(base, model.decode(model.encode(x), T))
        # scramble every encoder state except the last position's: the reconstruction must not move
        real = model.encoder.hidden_from_embeds

        def noisy(e):
            h = real(e)
            noise = torch.randn_like(h)
            noise[:, -1] = 0
            return h + noise

        monkeypatch.setattr(model.encoder, "hidden_from_embeds", noisy)
        assert torch.allclose(base, model(x), atol=1e-5)
        monkeypatch.undo()
        assert changed(base, model(perturbed(x, 0))), "the code must depend on the input"


# ---------------------------------------------------------------- learning


CASES = [(a, o) for o in TOKEN_OBJECTIVES for a in ARCHS if registry.objective(o).unsupported(a) is None]


@pytest.mark.parametrize("arch,objective", CASES)
def test_loss_falls_on_a_fixed_batch(arch, objective):
    t = trial(arch, objective)
    torch.manual_seed(0)
    model = objectives.model_for(t, VOCAB)
    loss_fn = objectives.loss_function(t)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = ids(batch=4, seed=3)
    losses = []
    for _ in range(40):
        total, count = loss_fn(model, x, x.clone())
        loss = total / count
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 1.0, (objective, losses[0], losses[-1])


@pytest.mark.parametrize("objective", [o for o in TOKEN_OBJECTIVES if o != "clm"])
def test_each_objective_trains_through_the_real_trainer_and_records_its_loss(tmp_path, sqlite_url, objective):
    t = trial("mixer", objective, context=64, budget={"steps": 20})
    engine = store.connect(sqlite_url)
    spec = parse_spec({"name": f"obj-{objective.replace('_', '-')}", "dataset": t.dataset.model_dump(),
                       "budget": {"steps": 20}, "grid": [{"architecture": "mixer", "d_model": 32}],
                       "defaults": {"layers": 2, "context": 8, "lr": 1e-3, "batch_size": 1}})
    _, (run_id,) = store.register_sweep(engine, spec, [t])
    out = train(t, TrainerSettings(artifacts=tmp_path / "art", db_url=sqlite_url, run_id=run_id, progress=False))
    assert out["status"] == "completed" and out["steps"] == 20
    run = store.get_run(engine, run_id)
    assert run.status == "completed" and math.isfinite(run.final_eval_loss)
    assert run.final_eval_loss < math.log(384)  # better than a uniform guess after 20 steps
    assert run.flops_per_token > 0


# ---------------------------------------------------------------- specs


def spec_with_objective(arch: str, objective: str, **block) -> dict:
    grid = {"architecture": arch, "d_model": 32, "objective": objective, **block}
    if arch != "mixer":
        grid["heads"] = 4
    return {"name": "obj", "dataset": {"source": "ablate:tinystories-sample"}, "budget": {"steps": 5},
            "defaults": {"layers": 2, "context": 16, "lr": 1e-3, "batch_size": 2}, "grid": [grid]}


@pytest.mark.parametrize("data,needles", [
    (spec_with_objective("gpt", "bidirectional"), ["grid[0].objective", "'llama', 'mixer', not 'gpt'", "objective: clm"]),
    (spec_with_objective("mixer", "multi_token", objective_options={"n_token": 3}),
     ["grid[0].objective_options", "no option 'n_token'", "did you mean 'n_tokens'"]),
    (spec_with_objective("mixer", "multi_token", objective_options={"n_tokens": 1}),
     ["grid[0].objective_options", "n_tokens", "greater than or equal to 2"]),
    (spec_with_objective("mixer", "one_step", objective_options={"mask_layer": 2}),
     ["grid[0].objective_options", "mask_layer=2 must be below layers=2"]),
    (spec_with_objective("mixer", "retrieval"), ["grid[0].objective", "unknown objective 'retrieval'"]),
])
def test_objective_misuse_is_refused_with_the_field_and_the_fix(tmp_path, data, needles):
    import yaml

    from ablate.config import load_trials

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_trials(path)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_objective_options_change_the_fingerprint_and_empty_ones_do_not():
    plain = trial("mixer", "multi_token")
    assert plain.fingerprint() == trial("mixer", "multi_token", objective_options={}).fingerprint()
    assert plain.fingerprint() != trial("mixer", "multi_token", objective_options={"n_tokens": 3}).fingerprint()


@pytest.mark.parametrize("arch,objective", CASES)
def test_the_host_target_count_is_the_count_the_loss_returns(arch, objective):
    # the trainer divides a step's loss by this count before any forward pass: it must be the loss's own
    t = trial(arch, objective, objective_options={"n_tokens": 3} if objective == "multi_token" else {})
    model = model_of(t)
    x = ids(batch=3)
    labels = x.clone()
    labels[0, T - 4:] = -100  # a padded row
    labels[2, T // 2 + 1:] = -100
    with torch.no_grad():
        _, count = objectives.loss_function(t)(model, x, labels)
    assert objectives.target_counter(t)(labels) == int(count)


# ---------------------------------------------------------------- the registry is the one place

TOY_OPTIONS = '''
from pydantic import Field

from ablate.config.units import Frozen, Whole

ARCHITECTURES = ("mixer",)


class Options(Frozen):
    extra: Whole = Field(5, ge=1, description="parameters the toy adds to the model")


def check_trial(trial):
    if trial.layers > 3:
        raise ValueError("objective 'toy' is for shallow models: layers <= 3")


def param_counts(trial, total, inter, vocab, family):
    return total + trial.objective_settings().extra, inter
'''

TOY_MODEL = '''
import torch
from torch import nn

from ablate.objectives import clm


class Toy(nn.Module):
    def __init__(self, trial, vocab_size):
        super().__init__()
        self.model = clm.build(trial, vocab_size)
        self.extra = nn.Parameter(torch.zeros(trial.objective_settings().extra))

    def forward(self, input_ids):
        return self.model(input_ids)


def build(trial, vocab_size):
    return Toy(trial, vocab_size)


loss, count = clm.loss, clm.count
'''


@pytest.fixture
def toy_objective(tmp_path, monkeypatch) -> None:
    """An objective from outside the package: its two files and one register line, nothing else."""
    (tmp_path / "toy_objective_options.py").write_text(TOY_OPTIONS)
    (tmp_path / "toy_objective.py").write_text(TOY_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry.OBJECTIVES, "entries", dict(registry.objectives()))  # the table as it was, after the test
    registry.register_objective("toy", "toy_objective", "toy_objective_options", "a toy with extra parameters")


def test_a_registered_objective_validates_plans_builds_and_is_refused_where_unsupported(toy_objective, tmp_path,
                                                                                        capsys):
    import yaml

    from ablate.cli import trial_param_counts, main
    from ablate.config import load_trials

    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(spec_with_objective("mixer", "toy", objective_options={"extra": 7})))
    _, (t,) = load_trials(path)
    assert t.objective_settings().extra == 7 and "objective_options.extra" in t.axes()
    clm_total, clm_inter = trial_param_counts(t.model_copy(update={"objective": "clm", "objective_options": {}}))
    assert trial_param_counts(t) == (clm_total + 7, clm_inter)  # the toy's param_counts, applied by `plan`
    assert main(["plan", str(path)]) == 0 and "toy(extra=7)" in capsys.readouterr().out
    built = trial("mixer", "toy", layers=2, objective_options={"extra": 3})
    assert sum(p.numel() for p in objectives.model_for(built, 384).parameters()) == trial_param_counts(built)[0]
    assert objectives.target_counter(built) is objectives.count_next_tokens  # its torch module's, found by name

    for data, needle in [
        (spec_with_objective("llama", "toy"), "grid[0].objective: objective 'toy' is built for architectures "
                                              "'mixer', not 'llama'; use one of those or objective: clm"),
        (spec_with_objective("mixer", "toy", layers=4), "grid[0].objective: objective 'toy' is for shallow models"),
        (spec_with_objective("mixer", "toy", objective_options={"extras": 1}), "did you mean 'extra'"),
        (spec_with_objective("mixer", "toyy"), "unknown objective 'toyy' (did you mean 'toy'?)"),
    ]:
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(SpecError) as info:
            load_trials(path)
        assert needle in str(info.value), (needle, str(info.value))
