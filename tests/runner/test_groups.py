"""Fused groups on a host (ablate/runner/groups.py): the owed runs put in groups, and a sweep whose seeds train in
one process per cell through the real sweep flow, its runs ordinary rows marked fused, its report saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ablate import runner, store

REPO = Path(__file__).resolve().parents[2]


def seeds_spec(tmp_path: Path, seeds: int = 2, **top) -> Path:
    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    data.update(budget={"steps": 12, "hardware": "cpu"}, eval={"at": [0.5]}, tokenizer={"vocab_size": 512},
                dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"}, **top)
    data["defaults"]["context"] = 64
    for block in data["grid"]:
        block["seeds"] = seeds
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_owed_runs_are_grouped_by_cell_and_a_run_owed_alone_stays_alone(sqlite_url, tmp_path):
    _, _, ids = runner.register(seeds_spec(tmp_path, seeds=3), sqlite_url)
    engine = store.connect(sqlite_url)
    groups = runner.plan_groups(engine, ids, "seeds", gpus=0)
    assert sorted(len(g) for g in groups) == [3, 3, 3, 3] and sorted(r for g in groups for r in g) == sorted(ids)
    configs = {r.id: r.config for r in runner.sweep_runs(engine, "smoke")}
    for group in groups:  # one cell each: every field but the seed alike
        assert len({str({k: v for k, v in configs[r].items() if k != "seed"}) for r in group}) == 1
    assert runner.plan_groups(engine, ids, "off", gpus=0) == [[r] for r in ids]
    assert runner.plan_groups(engine, ids, "auto", gpus=0) == [[r] for r in ids]  # no GPU: fusing would not pay
    assert runner.plan_groups(engine, ids[:1], "seeds", gpus=0) == [ids[:1]]


@pytest.mark.slow
def test_a_sweep_that_fuses_seeds_trains_each_cell_in_one_process_and_its_report_says_so(prefect_api, tmp_path):
    """The smoke grid at 2 seeds (8 runs) with `fuse: seeds`: four trainer processes, one per cell, each run an
    ordinary completed row with its own curve, its notes naming its group; `ablate report` reads them as any runs
    and says they were fused. `--fuse off` (the flow's `fuse`) trains the next sweep's runs alone."""
    from ablate.runner import warm
    from flows.sweep import sweep

    forked: list[list[str]] = []
    spawn = warm.WarmTrainer.spawn
    url = f"sqlite:///{tmp_path / 'r.db'}"
    art = str(tmp_path / "art")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ABLATE_WARM_TRAINER", raising=False)
        mp.setattr(warm.WarmTrainer, "spawn", lambda self, argv, *a: forked.append(argv) or spawn(self, argv, *a))
        result = sweep(spec=str(seeds_spec(tmp_path, fuse="seeds")), db_url=url, artifacts=art)
    assert len(result) == 8 and set(result.values()) == {"completed"}
    assert len(forked) == 4 and all(argv[:1] == ["--run-ids"] for argv in forked)
    runs = runner.sweep_runs(store.connect(url), "smoke")
    groups = {tuple(r.notes["fused"]["runs"]) for r in runs}
    assert len(groups) == 4 and all(len(g) == 2 for g in groups)
    for r in runs:
        assert r.status == "completed" and r.steps == 12 and r.final_eval_loss is not None
    from ablate.cli import main

    assert main(["report", "smoke", "--db", url, "--out", str(tmp_path / "report")]) == 0
    assert "Fused: run(s)" in (tmp_path / "report" / "report.md").read_text()

    again = sweep(spec=str(seeds_spec(tmp_path, fuse="seeds", name="alone")), db_url=url, artifacts=art, fuse="off")
    assert set(again.values()) == {"completed"}
    assert not any("fused" in (r.notes or {}) for r in runner.sweep_runs(store.connect(url), "alone"))


def test_slots_take_the_gpus_in_turn_and_never_name_one_the_host_lacks():
    """`sweep run --gpu-slots 2` on a one-GPU host pointed its second slot at GPU 1, which did not exist (found on
    the lent H200); slots past the GPU groups share them (`--trials-per-gpu`)."""
    assert runner.slot_devices(2, 1, 1) == [[0], [0]]
    assert runner.slot_devices(4, 1, 2) == [[0], [1], [0], [1]]
    assert runner.slot_devices(3, 2, 4) == [[0, 1], [2, 3], [0, 1]]
    assert runner.slot_devices(2, 1, 0) == [None, None]  # no GPU: no CUDA_VISIBLE_DEVICES at all


def test_trainers_sharing_a_gpu_take_their_share_of_its_sms_where_mps_runs(tmp_path, monkeypatch):
    from ablate.runner.host import sharing_env

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert sharing_env(4) == {}  # no MPS daemon here: time-sliced, memory capped by the trainer itself
    (tmp_path / "control").touch()  # the daemon's control socket (stands in for nvidia-cuda-mps-control)
    assert sharing_env(4) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"} and sharing_env(1) == {}
