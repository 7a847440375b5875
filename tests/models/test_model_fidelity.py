"""Model details as the studies ran them (masked-mixers-1.md), beyond the shared contract in test_models.py.

The mixer's position input is one fixed scalar channel, its parallel maps each run on the input, the GPT
keeps transformers' dropout, and the two sweeps of those sections plan to the published grids.
"""

from __future__ import annotations

import pytest
import torch
from conftest import REPO
from tests.models.test_models import BATCH, CONTEXT, VOCAB, Case, make_model, make_trial, tokens
from torch.utils.flop_counter import FlopCounterMode

from ablate import cli
from ablate.models import mixer_options
from ablate.models.mixer import SequenceMixing
from ablate.config import load_trials

pytestmark = pytest.mark.fidelity  # a campaign across the house: `pytest -m fidelity`


def block_inputs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """What each mixer block receives on a forward pass of x."""
    seen: list[torch.Tensor] = []
    hooks = [block.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach())) for block in model.blocks]
    with torch.no_grad():
        model(x)
    for hook in hooks:
        hook.remove()
    return seen


# ---------------------------------------------------------------- positional


@pytest.mark.parametrize("positional", ["first", "every"])
def test_position_channel_is_the_studies_fixed_scalar(positional):
    """One unlearned channel, -context/2 .. context/2-1, beside d_model token channels; `every` rewrites it."""
    case = Case("mixer", {"positional": positional}, {"layers": 3})
    model = make_model(case).eval()
    expected = torch.arange(-CONTEXT // 2, CONTEXT // 2, dtype=torch.float32)  # -8 .. 7
    assert torch.equal(model.positions, expected)
    assert "positions" not in dict(model.named_parameters()) and "positions" not in model.state_dict()
    assert mixer_options.param_count(make_trial(case), VOCAB) == sum(p.numel() for p in model.parameters())

    inputs = block_inputs(model, tokens())
    assert all(h.shape == (BATCH, CONTEXT, 33) for h in inputs), "blocks run at d_model + 1"
    for i, h in enumerate(inputs):
        is_positions = torch.equal(h[..., -1], expected.expand(BATCH, CONTEXT))
        assert is_positions == (i == 0 or positional == "every"), f"block {i} input's last channel"
    assert model.hidden_states(tokens()).shape == (BATCH, CONTEXT, 32), "the LM head reads the token channels"
    short = block_inputs(model, tokens()[:, :5])[0]
    assert torch.equal(short[..., -1], expected[:5].expand(BATCH, 5)), "a shorter window is a prefix of the positions"


@pytest.mark.parametrize("positional", ["learned_first", "learned_every"])
def test_learned_positional_embedding_is_still_an_option(positional):
    case = Case("mixer", {"positional": positional})
    model = make_model(case).eval()
    assert model.positions is None and model.wpe.weight.shape == (CONTEXT, 32) and model.wpe.weight.requires_grad
    assert mixer_options.param_count(make_trial(case), VOCAB) == sum(p.numel() for p in model.parameters())
    x = tokens()
    first, second = block_inputs(model, x)
    with torch.no_grad():
        after_first = model.blocks[0](first)
        torch.testing.assert_close(first, model.embed(x) + model.wpe.weight)
        added = after_first + model.wpe.weight if positional == "learned_every" else after_first
    torch.testing.assert_close(second, added)


# ---------------------------------------------------------------- parallel maps


@pytest.mark.parametrize("expand", [1, 2])
def test_parallel_maps_each_run_on_the_input(expand):
    """n maps cost n times one map's matmuls (the study's 'slower per step'); the closed form counts the same."""
    torch.manual_seed(0)
    x = torch.randn(BATCH, 1, CONTEXT, 8)
    flops, outputs = {}, {}
    for n in (1, 3):
        mixing = SequenceMixing(CONTEXT, expand=expand, parallel=n)
        with FlopCounterMode(display=False) as counter:
            outputs[n] = mixing(x)
        flops[n] = counter.get_total_flops()
        if n == 3:
            singles = []
            for i in range(n):  # each map alone, with its own weights
                one = SequenceMixing(CONTEXT, expand=expand)
                one.load_state_dict({k: v[i : i + 1] for k, v in mixing.state_dict().items()})
                singles.append(one(x))
            torch.testing.assert_close(outputs[n], sum(singles), atol=1e-5, rtol=1e-5)
    assert flops[3] == 3 * flops[1], f"3 parallel maps ran {flops[3]} FLOPs, one map {flops[1]}"

    for n in (1, 3):  # the closed form: mixing FLOPs + 2 * mixing params = matmuls + a bias (or sum) per map
        trial = make_trial(Case("mixer", {"parallel_convs": n, "expand": expand}, {"d_model": 8, "layers": 1}))
        actual = mixer_options.mixing_flops_per_token(trial) + 2 * mixer_options.inter_token_params(trial)
        per_token = flops[n] / (BATCH * CONTEXT)
        assert actual == per_token + n * 8 * (expand + 1 if expand > 1 else 1)


def test_flat_parallel_maps_get_equal_gradients():
    """Why the option changes cost, not learning: a sum of linear maps gets the same gradient in every map."""
    torch.manual_seed(0)
    mixing = SequenceMixing(CONTEXT, parallel=3)
    mixing(torch.randn(BATCH, 1, CONTEXT, 8)).square().sum().backward()
    grad = mixing.weight.grad
    assert grad.abs().sum() > 0 and torch.equal(grad[0], grad[1]) and torch.equal(grad[0], grad[2])


# ---------------------------------------------------------------- gpt


@pytest.mark.parametrize("variant", ["openai", "gpt2"])
def test_gpt_defaults_to_transformers_dropout(variant):
    model = make_model(Case("gpt", {"variant": variant}))
    # residual, embedding and attention dropout (tests/models/test_gpt_fidelity.py: where transformers drops out)
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
    x = tokens()
    with torch.no_grad():
        assert torch.equal(model.eval()(x), model(x)), "eval is deterministic"
        assert not torch.equal(model.train()(x), model(x)), "training drops out"


# ---------------------------------------------------------------- sweeps


@pytest.mark.parametrize("sweep,d_model,option,values", [
    ("tinystories-parallel-convs", 512, "parallel_convs", [1, 2, 4]),
    ("tinystories-positional", 1024, "positional", ["none", "first", "every"]),
])
def test_study_sweeps_plan_to_the_published_grid(sweep, d_model, option, values):
    path = REPO / "sweeps" / f"{sweep}.yaml"
    assert cli.main(["plan", str(path)]) == 0
    spec, trials = load_trials(path)
    assert [t.effective_options()[option] for t in trials] == values
    assert {(t.architecture, t.d_model, t.layers, t.context, t.batch_size) for t in trials} == {("mixer", d_model, 8, 512, 16)}
    assert (spec.budget.kind, spec.budget.amount, spec.budget.hardware) == ("wall_clock", 12 * 3600, "rtx3060")
