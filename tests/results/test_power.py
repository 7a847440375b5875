"""Power planning with known answers: the fixed design's seeds for an effect in seed-spreads are the textbook ones,
the seed spread is the pooled within-configuration SD of the DB's earlier runs, and `ablate plan` prints the seeds a
claim's SESOI needs (or why it cannot yet)."""

from __future__ import annotations

import math
import statistics

import pytest
import yaml

from ablate import runner, store
from ablate.cli import main
from ablate.results.power import seed_spread, seeds_for

SPEC = {"name": "widths", "dataset": {"source": "ablate:tinystories-sample"}, "budget": {"steps": 100, "hardware": "cpu"},
        "defaults": {"layers": 1, "context": 64, "batch_size": 4, "lr": 1e-3},
        "grid": [{"architecture": "mixer", "d_model": [32, 64], "seeds": 3}],
        "report": {"orderings": [{"claim": "wider is better", "better": {"d_model": 64}, "worse": {"d_model": 32}}],
                   "min_steps": 10}}


@pytest.mark.parametrize("effect,n", [(0.5, 64), (0.8, 26), (1.0, 17), (2.0, 6)])
def test_the_fixed_designs_seeds_are_cohens(effect, n):
    """Cohen (1988), table 2.4.1: two-sided alpha 0.05, power 0.8, n a group for d = 0.5, 0.8, 1, 2."""
    assert seeds_for(effect, 0.05, 0.8) == n


def test_a_tiny_effect_needs_more_than_the_planner_counts():
    assert seeds_for(0.01, 0.05, 0.8) is None


def _filled(tmp_path, spreads: dict[int, list[float]]) -> str:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    path = tmp_path / "widths.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    _, _, ids = runner.register(path, url)
    engine = store.connect(url)
    for rid in ids:
        run = store.get_run(engine, rid)
        loss = spreads[run.d_model][run.seed]
        store.update_run(engine, rid, status="completed", final_eval_loss=loss, final_train_loss=loss, steps=100)
    return url


def test_the_seed_spread_is_pooled_within_configurations_not_between_them(tmp_path):
    url = _filled(tmp_path, {32: [3.00, 3.02, 3.04], 64: [2.00, 2.01, 2.05]})
    spread = seed_spread(store.reader(url), {"mixer", "llama"})
    want = math.sqrt((statistics.variance([3.00, 3.02, 3.04]) + statistics.variance([2.00, 2.01, 2.05])) / 2)
    assert spread.sd == pytest.approx(want) and spread.configurations == 2 and spread.architectures == ("mixer",)
    assert seed_spread(store.reader(url), {"llama"}).sd is None


def test_plan_prints_the_seeds_a_sesoi_needs_from_the_dbs_spread(tmp_path, capsys):
    url = _filled(tmp_path, {32: [3.00, 3.02, 3.04], 64: [2.00, 2.01, 2.05]})
    sd = math.sqrt((statistics.variance([3.00, 3.02, 3.04]) + statistics.variance([2.00, 2.01, 2.05])) / 2)
    planned = tmp_path / "next.yaml"
    planned.write_text(yaml.safe_dump({**SPEC, "name": "next", "report": {**SPEC["report"], "sesoi": 0.02},
                                       "grid": [{"architecture": "mixer", "d_model": [32, 64]}],
                                       "adaptive": {"seeds": {"min": 2, "max": 10}}}))
    assert main(["plan", str(planned), "--db", url]) == 0
    out = " ".join(capsys.readouterr().out.split())
    n = seeds_for(0.02 / sd, 0.05, 0.8)
    assert "power planning: to detect 0.02 nats with 80% power at alpha 0.05" in out, out
    assert f"a fixed design needs {n} seeds a side: the seed SD is {sd:.3g} nats, pooled over 2 earlier " \
           "configuration(s) of mixer" in out
    assert (n > 10) == ("raise it to at least" in out)
    empty = tmp_path / "empty.db"
    assert main(["plan", str(planned), "--db", f"sqlite:///{tmp_path / 'none.db'}"]) == 0
    assert "power planning: no earlier runs to read the seed spread from" in capsys.readouterr().out
    assert not empty.exists() and not (tmp_path / "none.db").exists()  # plan creates no database
    assert main(["plan", str(tmp_path / "widths.yaml"), "--db", url]) == 0  # no SESOI: no planning line
    assert "power planning" not in capsys.readouterr().out
