"""Orchestration with real Prefect: the sweep flow end to end, skip/resume rules, outcomes as results."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import runner, store
from ablate.config.errors import AblateError
from ablate.config import TrialConfig
from tests.waiting import Deadline

REPO = Path(__file__).resolve().parents[2]


def smoke_spec(tmp_path: Path, **budget) -> Path:
    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    data["budget"] = {"steps": 12, "hardware": "cpu", **budget}
    for block in data["grid"]:  # one seed per cell: 4 trials
        block.pop("seeds", None)
    data["dataset"], data["tokenizer"] = {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"}, {"vocab_size": 512}  # the small sample: fast
    data["defaults"]["context"] = 64
    data["eval"] = {"at": [0.5]}
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def flow_run_logs(flow_run_id, until: str, timeout: float = 30) -> list[str]:
    """The flow run's log messages, once one containing `until` has reached the API (logs are sent in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = Deadline(timeout)
    while True:
        with get_client(sync_client=True) as client:
            logs = [log.message for log in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)]
        if any(until in m for m in logs) or deadline.passed():
            assert any(until in m for m in logs), logs[:20]
            return logs
        time.sleep(0.5)


def statuses(url: str) -> dict[int, str]:
    with store.connect(url).connect() as conn:
        return dict(conn.execute(sa.select(store.Run.id, store.Run.status)).all())


def metric_count(url: str, run_id: int | None = None) -> int:
    q = sa.select(sa.func.count()).select_from(store.Metric)
    if run_id is not None:
        q = q.where(store.Metric.run_id == run_id)
    with store.connect(url).connect() as conn:
        return conn.execute(q).scalar()


@pytest.mark.slow
def test_smoke_sweep_end_to_end_then_only_what_is_owed(prefect_api, tmp_path, monkeypatch):
    from ablate.runner import warm
    from flows.sweep import sweep

    monkeypatch.delenv("ABLATE_WARM_TRAINER", raising=False)
    forked: list[list[str]] = []  # trainers forked from the warm helper (the others start as cold processes)
    spawn = warm.WarmTrainer.spawn
    monkeypatch.setattr(warm.WarmTrainer, "spawn", lambda self, argv, *a: forked.append(argv) or spawn(self, argv, *a))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    spec = smoke_spec(tmp_path)
    art = str(tmp_path / "art")
    state = sweep(spec=str(spec), db_url=url, artifacts=art, return_state=True)
    result = state.result()
    assert len(result) == 4 and set(result.values()) == {"completed"}
    assert len(forked) == 4  # local trials share this process's helper
    # the sweep's Prefect log says what it built, without the bytecode that `datasets`' function hashing (dill's
    # global-name scan) prints while it builds the token cache
    logs = flow_run_logs(state.state_details.flow_run_id, until="data 1/1")
    assert not [m for m in logs if "LOAD_GLOBAL" in m or "RETURN_VALUE" in m or "Disassembly of" in m], logs[:20]
    assert set(statuses(url).values()) == {"completed"}
    for rid in result:
        assert metric_count(url, rid) >= 3
    before = metric_count(url)

    assert sweep(spec=str(spec), db_url=url, artifacts=art) == {}  # nothing new to run
    assert metric_count(url) == before

    victim = sorted(result)[1]
    store.update_run(store.connect(url), victim, status="failed")
    again = sweep(spec=str(spec), db_url=url, artifacts=art)
    assert again == {victim: "completed"}  # only the failed one runs
    assert len(forked) == 4  # alone, it started cold: a helper is worth it only for several trials


@pytest.mark.slow
def test_killed_trial_is_resumed_by_the_next_sweep_without_duplicate_metrics(prefect_api, tmp_path):
    from flows.sweep import sweep

    url = f"sqlite:///{tmp_path / 'r.db'}"
    # long enough that the kill (at the first checkpoint, 1 s in, and 3 points) lands mid-run on a fast idle machine
    # too: ~15 s in all, idle, the kill after 2-4 s; every step more is trained by the resume, not by the kill
    steps = 1000
    spec = smoke_spec(tmp_path, steps=steps)
    spec_data = yaml.safe_load(spec.read_text())
    spec_data["grid"] = [{"architecture": "mixer", "d_model": 32}]
    spec.write_text(yaml.safe_dump(spec_data))
    _, _, (run_id,) = runner.register(spec, url)
    art = tmp_path / "art"
    # a trainer started as the runner would, killed once it has a checkpoint and metrics past it
    opts = runner.LaunchOptions(db_url=url, artifacts=art, checkpoint_every=1.0, threads=1)
    store.claim_run(store.connect(url), run_id, "test")
    proc = subprocess.Popen(runner.trainer_command(TrialConfig.model_validate(store.get_run(store.connect(url), run_id).config), run_id, opts),
                            env={**os.environ, "ABLATE_DB_URL": url, "ABLATE_CLAIMANT": "test"})
    store.update_run(store.connect(url), run_id, pid=proc.pid)
    deadline = Deadline(180)
    while not deadline.passed() and not (list(art.glob("runs/*/*/checkpoint.pt")) and metric_count(url, run_id) >= 3):
        time.sleep(0.2)
    time.sleep(0.3)
    assert proc.poll() is None, "the trainer finished before it could be killed: raise `steps`"
    proc.kill()
    proc.wait()
    assert runner.classify(store.connect(url), run_id, proc.returncode) == "preempted"
    result = sweep(spec=str(spec), db_url=url, artifacts=str(art), checkpoint_every=1.0)
    assert result == {run_id: "completed"}
    with store.connect(url).connect() as conn:
        pairs = conn.execute(sa.select(store.Metric.split, store.Metric.step).where(store.Metric.run_id == run_id)).all()
    assert len(pairs) == len(set(pairs))
    assert store.get_run(store.connect(url), run_id).steps == steps


@pytest.mark.slow
def test_diverged_and_oom_trials_are_results_while_others_complete(prefect_api, tmp_path):
    from flows.sweep import sweep

    url = f"sqlite:///{tmp_path / 'r.db'}"
    spec = smoke_spec(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["grid"] = [
        {"architecture": "mixer", "d_model": 32},
        {"architecture": "mixer", "d_model": 32, "lr": 1.0, "warmup": 0.0, "options": {"norm": False}},  # diverges
        {"architecture": "mixer", "d_model": 1024, "layers": 4},  # too big for the cap below
    ]
    data["budget"]["steps"] = 30
    spec.write_text(yaml.safe_dump(data))
    # cap between the small models' peak and the big one's
    result = sweep(spec=str(spec), db_url=url, artifacts=str(tmp_path / "art"), memory_cap_mb=900)
    assert sorted(result.values()) == ["completed", "diverged", "oom"]


@pytest.mark.slow
def test_the_sweep_flow_runs_a_study_sweep_on_a_local_corpus_and_one_gpu_by_its_parameters(prefect_api, tmp_path):
    """`prefect deployment run sweep/NAME --param source=... --param gpus=1`: a study spec that evaluates on the
    hub's validation split and trains on 2 GPUs runs here on the embedded sample, one process, the same global
    batch (before: the flow failed on the split, and no parameter could change the GPU count)."""
    from flows.sweep import sweep

    data = yaml.safe_load((REPO / "sweeps" / "tinystories-heads.yaml").read_text())
    data.update(budget={"steps": 3, "hardware": "rtx3060", "gpus": 2}, tokenizer={"vocab_size": 300}, eval={"at": [0.5]})
    data["defaults"].update(d_model=32, layers=1, heads=2, context=32, batch_size=2, precision="fp32")
    data["grid"], data["reference"] = [{"heads": [2]}], []
    spec = tmp_path / "heads.yaml"
    spec.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = sweep(spec=str(spec), db_url=url, artifacts=str(tmp_path / "art"), source="ablate:tinystories-sample",
                   holdout=20, gpus=1, hardware="cpu")
    assert list(result.values()) == ["completed"]
    run = store.get_run(store.connect(url), next(iter(result)))
    assert run.config["budget"]["gpus"] == 1 and run.config["grad_accum"] == 2 and run.config["batch_size"] == 2
    assert run.config["dataset"]["eval"]["holdout"] == 20 and run.config["eos_is_target"] is False


@pytest.mark.slow
def test_a_hardware_override_with_no_pool_is_refused_before_anything_is_registered(prefect_api, tmp_path):
    from ablate.config.errors import AblateError
    from flows.sweep import sweep

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(AblateError, match=r"no deployment trial/h100.*ablate deploy --pool h100"):
        sweep(spec=str(smoke_spec(tmp_path)), db_url=url, artifacts=str(tmp_path / "art"), use_deployments=True,
              hardware="h100")
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "art").exists()


@pytest.mark.slow
def test_a_bad_launch_parameter_of_the_sweep_flow_is_named_before_anything_is_written(prefect_api, tmp_path):
    """`prefect deployment run sweep/NAME --param threads=-1`: Prefect checks only the type; ablate names the rest."""
    from flows.sweep import sweep

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(AblateError, match=r"the sweep flow's parameters: threads: Input should be greater than or "
                                          r"equal to 1 \(got -1\)"):
        sweep(spec=str(smoke_spec(tmp_path)), db_url=url, artifacts=str(tmp_path / "art"), threads=-1)
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "art").exists()


@pytest.mark.slow
def test_a_trial_deployment_an_older_ablate_registered_is_refused_with_the_fix(prefect_api):
    """Its stored flat parameters (db_url, artifacts) would fail every trial it ran: the sweep says so once."""
    from ablate.config.launch import LaunchOptions
    from flows.deploy import _deploy, ensure_pool
    from flows.dispatch import check_deployment
    from flows.sweep import TRIAL_PARAMETERS

    ensure_pool("older", None)
    _deploy("flows/sweep.py:trial", REPO, print, name="older", work_pool_name="older",
            parameters={"db_url": None, "artifacts": "results/artifacts"})
    with pytest.raises(AblateError, match=r"trial/older was registered by an older ablate: its parameters "
                                          r"artifacts, db_url are not the trial flow's; run `ablate deploy` again"):
        check_deployment("older", TRIAL_PARAMETERS)
    _deploy("flows/sweep.py:trial", REPO, print, name="older", work_pool_name="older",
            parameters={"launch": LaunchOptions().for_trial_flow()})
    check_deployment("older", TRIAL_PARAMETERS)  # as `ablate deploy` registers it today


@pytest.mark.slow
@pytest.mark.parametrize("passed_runs", [None, 1])
def test_sweep_run_loads_and_registers_the_sweep_once(prefect_api, tmp_path, monkeypatch, capsys, passed_runs):
    """`ablate sweep run` checks the spec and data and registers the runs before Prefect starts; the sweep flow
    then runs that registration, without reading, expanding and registering the spec a second time (a sweep of
    more runs than a flow parameter can list, PASSED_RUNS, is registered again by the flow)."""
    import signal

    from ablate.cli import main
    from ablate.cli import sweep as command
    from ablate.runner import sweep as registering

    if passed_runs is not None:
        monkeypatch.setattr(command, "PASSED_RUNS", passed_runs)

    for name in ("ABLATE_DB_URL", "PREFECT_LOGGING_LEVEL", "PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):  # the command sets them for its process
        monkeypatch.delenv(name, raising=False)
    loads, registrations = [], []
    load_trials, register_sweep = registering.load_trials, store.register_sweep
    monkeypatch.setattr(registering, "load_trials", lambda path, **kw: loads.append(path) or load_trials(path, **kw))
    monkeypatch.setattr(store, "register_sweep",
                        lambda engine, spec, *a, **kw: registrations.append(spec.name) or register_sweep(engine, spec, *a, **kw))
    spec = smoke_spec(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["grid"] = [{"architecture": "mixer", "d_model": [32, 48]}]
    spec.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["sweep", "run", str(spec), "--db", url, "--artifacts", str(tmp_path / "art"), "--threads", "1"])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    times = 1 if passed_runs is None else 2
    assert loads == [str(spec)] * times and registrations == ["smoke"] * times
    assert "sweep smoke: 2 trials, steps 12 on 1x cpu each" in out.out and "sweep smoke: 2 completed" in out.out
    assert sorted(statuses(url).values()) == ["completed", "completed"]


@pytest.mark.slow
def test_sweep_run_exits_1_when_runs_it_owed_ended_cancelled(prefect_api, tmp_path, monkeypatch, capsys):
    """`ablate sweep run S && ablate report S` must not report as if the sweep had finished."""
    import signal

    from ablate.cli import main

    for name in ("ABLATE_DB_URL", "PREFECT_LOGGING_LEVEL", "PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):  # the command sets them for its process
        monkeypatch.delenv(name, raising=False)
    spec = smoke_spec(tmp_path)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["sweep", "register", str(spec), "--db", url]) == 0
    assert main(["sweep", "cancel", "smoke", "--db", url]) == 0
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["sweep", "run", str(spec), "--db", url, "--artifacts", str(tmp_path / "art"), "--threads", "1"])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    err = capsys.readouterr().err
    assert code == 1 and "sweep smoke did not finish: 4 cancelled" in err, err[-3000:]
    assert set(statuses(url).values()) == {"cancelled"}


def test_runs_to_do_rules(sqlite_url, tmp_path):
    spec = smoke_spec(tmp_path)
    _, sweep_id, ids = runner.register(spec, sqlite_url)
    engine = store.connect(sqlite_url)
    store.update_run(engine, ids[0], status="completed")
    store.update_run(engine, ids[1], status="failed", attempts=runner.MAX_ATTEMPTS)
    stale = store.utcnow() - dt.timedelta(seconds=store.stale_seconds() + 1)
    store.update_run(engine, ids[2], status="running", heartbeat_at=stale)  # its claimant died (any host)
    assert runner.runs_to_do(engine, sweep_id, ids) == [ids[2], ids[3]]
    assert runner.runs_to_do(engine, sweep_id, ids, retry_failed=True) == [ids[1], ids[2], ids[3]]
    store.update_run(engine, ids[3], status="running", heartbeat_at=store.utcnow())  # a live claimant, on any host
    assert runner.runs_to_do(engine, sweep_id, ids) == [ids[2]]


def test_trainer_command_uses_torchrun_for_several_gpus(tmp_path):
    spec = smoke_spec(tmp_path, gpus=4)
    from ablate.config import load_trials

    _, trials = load_trials(spec)
    cmd = runner.trainer_command(trials[0], 7, runner.LaunchOptions(db_url="sqlite:///x.db"))
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"] and "--nproc_per_node=4" in cmd
    assert cmd[cmd.index("--run-id") + 1] == "7"


def test_launch_options_travel_whole_to_the_trial_flow_and_the_trainer(tmp_path):
    """One declaration: the user-facing flows take its FLOW_FIELDS one by one and rebuild it; the trial flow takes
    it as one parameter (JSON on a cluster); the trainer reads it back from one argument, without the DB URL."""
    import inspect
    import json

    from ablate.config import load_trials
    from ablate.config.launch import FLOW_FIELDS, TRAINER_FIELDS, LaunchOptions
    from ablate.train.cli import launch_of, parser
    from ablate.train.state import TrainerSettings
    from flows.search import search
    from flows.sweep import sweep, trial

    opts = LaunchOptions(db_url="sqlite:///x.db", artifacts=str(tmp_path / "art"), checkpoint_every=12.5,
                         memory_cap_mb=900.0, threads=2, gpu_ids=[0, 1])  # as JSON flow parameters give them
    assert opts.artifacts == tmp_path / "art" and opts.gpu_ids == (0, 1)
    flat = json.loads(json.dumps(opts.flow_fields()))
    assert set(flat) == set(FLOW_FIELDS) and LaunchOptions(**flat) == opts.but(gpu_ids=None)
    assert set(FLOW_FIELDS) <= set(inspect.signature(sweep.fn).parameters)  # `--param checkpoint_every=2` and co.
    assert set(FLOW_FIELDS) - {"threads"} <= set(inspect.signature(search.fn).parameters)
    assert set(inspect.signature(trial.fn).parameters) == {"run_id", "launch", "retry_failed", "database", "run_ids"}
    to_trial = LaunchOptions.model_validate(json.loads(json.dumps(opts.for_trial_flow())))
    assert to_trial == opts.but(gpu_ids=None, warm=False)  # a deployment's trial: its worker pins, it starts cold

    _, trials = load_trials(smoke_spec(tmp_path))
    argv = runner.trainer_command(trials[0], 7, opts)
    assert argv[argv.index("ablate.train") + 1:argv.index("--launch")] == ["--run-id", "7"]
    assert not any("x.db" in part for part in argv)
    args = parser().parse_args(argv[argv.index("ablate.train") + 1:])
    assert args.run_id == 7 and launch_of(args) == LaunchOptions(**opts.model_dump(include=set(TRAINER_FIELDS)))
    settings = TrainerSettings.launched(launch_of(args), run_id=7)
    assert (settings.artifacts, settings.checkpoint_every, settings.memory_cap_mb, settings.threads,
            settings.progress) == (tmp_path / "art", 12.5, 900.0, 2, False)
    by_hand = parser().parse_args(["--run-id", "7", "--threads", "3", "--artifacts", "a"])  # the hand flags
    assert (launch_of(by_hand).threads, launch_of(by_hand).quiet, launch_of(by_hand).artifacts) == (3, False, Path("a"))
    assert LaunchOptions(threads=0, checkpoint_every=0) == LaunchOptions()  # `--threads 0`: the default


def test_a_bad_launch_option_names_its_flag_or_field(tmp_path):
    from ablate.cli.common import launch_of as cli_launch_of
    from ablate.train.cli import launch_of, parser

    params = {"artifacts": "a", "threads": None, "checkpoint_every": -5.0, "memory_cap_mb": None}
    with pytest.raises(AblateError, match="--checkpoint-every: Input should be greater than 0"):
        cli_launch_of(params, db_url=None)
    with pytest.raises(AblateError, match="launch options: chekpoint_every: Extra inputs are not permitted"):
        launch_of(parser().parse_args(["--run-id", "1", "--launch", '{"chekpoint_every": 3}']))


def test_run_options_the_old_name_of_launch_options_is_gone():
    """Version 0.1.0 was never released: the old name is not kept (as the old top-level paths are not)."""
    with pytest.raises(ImportError):
        from ablate.runner import RunOptions  # noqa: F401


def test_docker_compose_names_only_things_that_exist():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "prefect-server", "gpu-worker", "sweep-worker", "deployer"} <= set(services)
    assert (REPO / "Dockerfile").exists()
    for mount in services["postgres"]["volumes"]:
        src = mount.split(":")[0]
        assert src in compose["volumes"] or (REPO / src).exists(), src
    gpu = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    from ablate.cli import parse

    for name, svc in services.items():
        cmd = svc.get("command")
        if not cmd:
            continue
        text = " ".join(cmd) if isinstance(cmd, list) else cmd
        text = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)  # what compose runs when the variable is unset
        for part in text.split("&&"):
            words = part.replace("sh -c", "").split()
            if words and words[0] == "ablate":
                parse(words[1:])  # every ablate command in the file parses
            elif words and words[0] == "prefect":
                assert (Path(sys.executable).parent / "prefect").exists() or shutil.which("prefect")
                if words[1:3] == ["worker", "start"]:
                    pool = words[words.index("--pool") + 1]
                    assert pool == "sweeps" or pool.startswith("${ABLATE_POOL"), pool
    env = compose["x-ablate-env"]
    assert {"ABLATE_DB_URL", "PREFECT_API_URL", "ABLATE_ARTIFACTS"} <= set(env)
    source = "".join(p.read_text() for p in (REPO / "ablate").rglob("*.py"))
    assert "ABLATE_DB_URL" in source and "ABLATE_ARTIFACTS" in source
