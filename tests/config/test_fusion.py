"""Which trials may train in one fused group (ablate/config/fusion.py), and why a trial may not, without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ablate.config import TrialConfig, fusion, parse_spec
from ablate.config.errors import SpecError


def trial(seed: int = 0, **over) -> TrialConfig:
    base = dict(architecture="mixer", d_model=32, layers=1, context=64, lr=3e-3, batch_size=8, precision="fp32",
                dataset={"source": "ablate:tinystories-sample"}, tokenizer={"vocab_size": 384},
                budget={"steps": 50}, seed=seed)
    base.update(over)
    return TrialConfig(**base)


@pytest.mark.parametrize("over,says", [
    ({"budget": {"steps": 50, "gpus": 4}}, "torchrun"),
    ({"on_oom": "shrink"}, "micro-batch"),
    ({"mode": "memory_probe"}, "memory probe"),
    ({"architecture": "gpt", "heads": 4}, "dropout 0.1"),
    ({"architecture": "llama", "heads": 4, "options": {"dropout": 0.2}}, "dropout 0.2"),
])
def test_a_trial_that_cannot_fuse_says_why_and_trains_alone(over, says):
    t = trial(**over)
    assert says in fusion.refusal(t)
    assert fusion.group_key(t, "seeds") is None
    assert fusion.groups({1: t, 2: trial(1, **over)}, "seeds") == [[1], [2]]


def test_a_wall_clock_budget_fuses_read_as_a_solo_runs_steps():
    assert fusion.refusal(trial(budget={"wall_clock": "10m"})) is None  # ablate/train/members.py reads it


def test_every_family_at_its_defaults_but_gpt_fuses():
    for arch, extra in [("mixer", {}), ("llama", {"heads": 4}), ("hybrid", {"heads": 4}), ("metaformer", {"heads": 4}),
                        ("mod", {"heads": 4}), ("gpt", {"heads": 4, "options": {"dropout": 0.0}})]:
        assert fusion.refusal(trial(architecture=arch, **extra)) is None, arch


def test_seeds_group_only_seeds_and_shapes_also_the_shape_free_hyperparameters():
    runs = {1: trial(0), 2: trial(1), 3: trial(0, lr=1e-3), 4: trial(1, lr=1e-3), 5: trial(0, d_model=48),
            6: trial(2, weight_decay=0.1, warmup_steps=5, schedule="cosine")}
    assert fusion.groups(runs, "seeds") == [[1, 2], [3, 4], [5], [6]]
    assert fusion.groups(runs, "shapes") == [[1, 2, 3, 4, 6], [5]]
    assert fusion.groups(runs, "off") == [[r] for r in runs]
    assert fusion.groups(runs, "shapes", most=2) == [[1, 2], [3, 4], [5], [6]]


def test_auto_fuses_on_a_gpu_only_a_step_small_enough_to_be_launch_bound():
    small, big = trial(), trial(d_model=1024, layers=24, context=2048, batch_size=64)
    assert fusion.step_flops(small) < fusion.AUTO_MAX_STEP_FLOPS < fusion.step_flops(big)
    assert fusion.pays(small, gpus=1) and not fusion.pays(big, gpus=1) and not fusion.pays(small, gpus=0)
    runs = {1: small, 2: trial(1), 3: big, 4: trial(1, d_model=1024, layers=24, context=2048, batch_size=64)}
    assert fusion.groups(runs, "auto", fuses=lambda t: fusion.pays(t, 1)) == [[1, 2], [3], [4]]
    assert fusion.groups(runs, "auto", fuses=lambda t: fusion.pays(t, 0)) == [[1], [2], [3], [4]]


def test_fuse_is_how_a_sweep_runs_not_what_it_is():
    data = {"name": "f", "dataset": {"source": "ablate:tinystories-sample"}, "budget": {"steps": 10},
            "defaults": {"architecture": "mixer", "d_model": 32, "layers": 1, "context": 64, "lr": 1e-3,
                         "batch_size": 8}}
    assert parse_spec(data).fingerprint() == parse_spec({**data, "fuse": "seeds"}).fingerprint()
    with pytest.raises(SpecError, match="fuse: Input should be 'off', 'seeds', 'shapes' or 'auto'"):
        parse_spec({**data, "fuse": "everything"})


def test_grouping_loads_no_torch():
    code = ("import sys; from ablate.config import TrialConfig, fusion; "
            "t = TrialConfig(architecture='llama', heads=4, d_model=32, layers=1, context=64, lr=1e-3, batch_size=8, "
            "dataset={'source': 'ablate:tinystories-sample'}, budget={'steps': 5}); "
            "fusion.groups({1: t}, 'auto', fuses=lambda x: fusion.pays(x, 1)); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
