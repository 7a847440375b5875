"""Plugins: a file or module registers an architecture or objective through `ablate.architecture` /
`ablate.objective`; a sweep names it under `plugins:`; each trial carries the identity of that code; installed
packages are found by entry point; whatever goes wrong names the plugin and the fix, and registers nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from ablate import store
from ablate.config import TrialConfig, load_trials, registry
from ablate.config.errors import AblateError, SpecError
from ablate.plugins import load
from tests.helpers import REPO, cli_env

MIXER = '''
import torch
from pydantic import BaseModel

import ablate


class Options(BaseModel):
    kernel: int = 3


class ConvMixer(torch.nn.Module):
    """Embedding, one causal depthwise convolution over time, a head: {tag}"""

    def __init__(self, trial, vocab_size):
        super().__init__()
        self.kernel = Options(**trial.options).kernel
        self.embed = torch.nn.Embedding(vocab_size, trial.d_model)
        self.conv = torch.nn.Conv1d(trial.d_model, trial.d_model, self.kernel, groups=trial.d_model)
        self.head = torch.nn.Linear(trial.d_model, vocab_size)

    def forward(self, input_ids):
        x = self.embed(input_ids).transpose(1, 2)
        x = self.conv(torch.nn.functional.pad(x, (self.kernel - 1, 0)))
        return self.head(x.transpose(1, 2))


@ablate.architecture("{name}", options=Options, description="a causal depthwise-convolution mixer")
def build(trial, vocab_size):
    return ConvMixer(trial, vocab_size)
'''


def write_plugin(folder: Path, name: str = "conv-test", tag: str = "v1", file: str = "conv_plugin.py") -> Path:
    path = folder / file
    path.write_text(MIXER.replace("{name}", name).replace("{tag}", tag))
    return path


def sweep_file(folder: Path, plugins: list[str], architectures=("conv-test", "mixer"), **extra) -> Path:
    data = {"name": "plug", "plugins": plugins, "dataset": {"source": "ablate:tinystories-sample",
                                                           "eval": {"holdout": 16}},
            "tokenizer": {"vocab_size": 384}, "budget": {"steps": 4, "hardware": "cpu"},
            "defaults": {"d_model": 16, "layers": 1, "context": 32, "lr": 3e-3, "batch_size": 4, "precision": "fp32"},
            "grid": [{"architecture": list(architectures)}], **extra}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---------------------------------------------------------------- loading and identity


def test_a_plugin_file_registers_with_its_source_and_its_trials_carry_its_code(tmp_path):
    plugin = write_plugin(tmp_path)
    spec, trials = load_trials(sweep_file(tmp_path, ["./conv_plugin.py"]))
    family = registry.check_architecture("conv-test")
    assert family.source.kind == "file" and family.source.where == str(plugin)
    assert family.source.identity.startswith("file:") and not family.closed_form
    conv, mixer = trials
    assert conv.code == f"conv-test@{family.source.identity}" and mixer.code is None
    assert "code" not in mixer.model_dump(mode="json") or mixer.model_dump(mode="json")["code"] is None
    # the closed form is absent: planning counts on the meta device, exactly what the built model holds
    import torch

    built = sum(p.numel() for p in registry.model_module("conv-test").build(conv, 384).parameters())
    assert registry.check_architecture("conv-test").param_count(conv, 384) == built
    assert not any(p.is_meta for p in torch.nn.Linear(1, 1).parameters())  # the meta device did not leak out
    # what it does not give, the family's defaults say: unknown inter-token parameters, no mixing FLOPs; and the
    # contract check does not take the meta count for a closed form
    assert family.inter_token_params(conv) is None and family.mixing_flops_per_token(conv) == 0.0
    from ablate.plugins.check import check_trial, small_trial

    counted = {f.name: f for f in check_trial(small_trial("conv-test"))}["param count"]
    assert counted.ok is None and "no closed form" in counted.detail


def test_reading_a_sweep_twice_loads_its_plugin_once_and_an_edit_changes_the_trials_identity(tmp_path):
    plugin = write_plugin(tmp_path)
    path = sweep_file(tmp_path, ["./conv_plugin.py"])
    first = load_trials(path)[1][0]
    assert load_trials(path)[1][0].fingerprint() == first.fingerprint()
    write_plugin(tmp_path, tag="v2")  # an edit of the code, not of the sweep
    second = load_trials(path)[1][0]
    assert second.code != first.code and second.fingerprint() != first.fingerprint()
    assert registry.check_architecture("conv-test").source.where == str(plugin)  # replaced, not a clash


def test_a_runs_code_version_holds_ablates_and_the_plugins_identity_within_its_column():
    from types import SimpleNamespace

    from ablate.store.register import run_code

    assert run_code("a3421c1def06+dirty", SimpleNamespace(code=None)) == "a3421c1def06+dirty"
    assert run_code("a3421c1def06", SimpleNamespace(code="conv@file:eeb57f048595497c")) == \
        "a3421c1def06 file:eeb57f048595497c"
    long = SimpleNamespace(code="conv@package:" + "x" * 60 + "==1.0")
    assert len(run_code("a3421c1def06+dirty", long)) <= 64
    assert run_code("a", long) != run_code("a", SimpleNamespace(code="conv@package:" + "x" * 60 + "==1.1"))


def test_built_in_trials_keep_their_fingerprint():
    fields = dict(architecture="mixer", d_model=16, layers=1, context=8, lr=1e-3, batch_size=2,
                  dataset={"source": "x"}, budget={"steps": 1})
    trial = TrialConfig(**fields)
    assert trial.code is None
    assert trial.fingerprint() == TrialConfig.model_validate(
        {k: v for k, v in trial.model_dump(mode="json").items() if k != "code"}).fingerprint()


def test_a_module_plugin_and_the_public_objective_decorator(tmp_path, monkeypatch):
    (tmp_path / "myobjectives.py").write_text(textwrap.dedent('''
        import ablate

        @ablate.objective("echo-clm", architectures=["mixer"], next_token=True)
        def build(trial, vocab_size):
            """causal LM under another name"""
            from ablate import models
            return models.build(trial, vocab_size)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load.load_plugin("myobjectives")
    assert loaded.names == ("echo-clm",)
    entry = registry.objective("echo-clm")
    assert entry.architectures == ("mixer",) and entry.next_token and entry.description == "causal LM under another name"
    assert entry.source.kind == "module" and entry.source.identity.startswith("file:")
    trial = TrialConfig(architecture="mixer", objective="echo-clm", d_model=16, layers=1, context=8, lr=1e-3,
                        batch_size=2, dataset={"source": "x"}, budget={"steps": 1})
    assert trial.code == f"echo-clm@{entry.source.identity}"
    from ablate.objectives import base

    # the defaults, where the trainer asks for them: the next-token loss and count
    assert base.loss_function(trial) is base.next_token_loss and base.target_counter(trial) is base.count_next_tokens
    with pytest.raises(ValueError, match="built for architectures 'mixer', not 'llama'"):
        TrialConfig(**{**trial.model_dump(), "architecture": "llama", "heads": 2, "code": None})


# ---------------------------------------------------------------- bad input: the plugin named, nothing registered


def spec_error(tmp_path: Path, plugins: list[str]) -> str:
    with pytest.raises(SpecError) as caught:
        load_trials(sweep_file(tmp_path, plugins, architectures=("mixer",)))
    return str(caught.value)


def test_a_missing_plugin_file_is_named_with_where_it_was_looked_for(tmp_path):
    message = spec_error(tmp_path, ["./nowhere.py"])
    assert "plugins[0]: plugin ./nowhere.py: no file" in message and str(tmp_path / "nowhere.py") in message


def test_a_plugin_that_fails_to_import_shows_its_last_line_and_registers_nothing(tmp_path):
    (tmp_path / "broken.py").write_text(
        "import ablate\nfrom pydantic import BaseModel\n"
        "ablate.architecture('half', options=BaseModel, build=lambda t, v: None)\n"
        "raise RuntimeError('no weights here')\n")
    message = spec_error(tmp_path, ["./broken.py"])
    assert "plugin ./broken.py failed to import: RuntimeError: no weights here (at broken.py:4)" in message
    assert "half" not in registry.families()  # what it registered before failing is undone
    assert not [m for m in sys.modules if m.startswith("ablate_plugin_broken")]


def test_a_plugin_file_that_is_not_utf8_is_one_line_in_check_plan_and_register(tmp_path):
    (tmp_path / "latin.py").write_bytes("# caf\xe9 mixer\nimport ablate\n".encode("latin-1"))
    spec = sweep_file(tmp_path, ["./latin.py"])
    env = cli_env(HF_HUB_OFFLINE="1", ABLATE_DB_URL=f"sqlite:///{tmp_path / 'r.db'}")
    for args in (["check", "conv-test", "--plugin", str(tmp_path / "latin.py")], ["plan", str(spec)],
                 ["sweep", "register", str(spec)]):
        done = subprocess.run([sys.executable, "-m", "ablate.cli", *args], cwd=tmp_path, text=True,
                              capture_output=True, env=env, timeout=300)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr)
        assert "latin.py is not UTF-8 text (byte 0xe9 at offset 5); save it as UTF-8" in done.stderr, done.stderr


def test_a_module_that_does_not_exist_says_how_to_check(tmp_path):
    message = spec_error(tmp_path, ["no_such_plugin_module"])
    assert "plugin no_such_plugin_module failed to import: ModuleNotFoundError" in message
    assert "python -c 'import no_such_plugin_module'" in message


def test_a_name_that_clashes_with_a_built_in_or_another_plugin_is_refused(tmp_path):
    write_plugin(tmp_path, name="mixer")
    message = spec_error(tmp_path, ["./conv_plugin.py"])
    assert "architecture 'mixer' is already registered (built-in)" in message and "another name" in message
    assert registry.check_architecture("mixer").source.kind == "builtin"
    write_plugin(tmp_path, name="conv-test", file="one.py")
    write_plugin(tmp_path, name="conv-test", file="two.py")
    message = spec_error(tmp_path, ["./one.py", "./two.py"])
    assert "plugins[1]" in message and f"file {tmp_path / 'one.py'}" in message
    write_plugin(tmp_path, name="LLaMA", file="case.py")  # a name that differs from a built-in only by case
    message = spec_error(tmp_path, ["./case.py"])
    assert "architecture 'LLaMA' differs from the registered 'llama' only by case (built-in)" in message
    assert "LLaMA" not in registry.families()


def test_plugin_options_are_validated_like_a_built_in_family(tmp_path):
    write_plugin(tmp_path)
    path = sweep_file(tmp_path, ["./conv_plugin.py"], architectures=("conv-test",))
    data = yaml.safe_load(path.read_text())
    data["grid"][0]["options"] = {"kernal": 5}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="unknown conv-test option 'kernal' \\(did you mean 'kernel'\\?\\)"):
        load_trials(path)
    data["grid"][0]["options"] = {"kernel": "wide"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="option kernel: Input should be a valid integer"):
        load_trials(path)


def test_plugins_must_be_a_list_and_options_a_pydantic_model(tmp_path):
    path = sweep_file(tmp_path, [], architectures=("mixer",))
    data = yaml.safe_load(path.read_text())
    data["plugins"] = "./conv_plugin.py"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="plugins: must be a list of plugin files or modules"):
        load_trials(path)
    import ablate

    with pytest.raises(AblateError, match="options must be a pydantic BaseModel class"):
        ablate.architecture("dicty", options={"kernel": 3}, build=lambda trial, vocab: None)


# ---------------------------------------------------------------- installed packages (entry points)


def dist_info(site: Path, module: str, body: str) -> None:
    """An installed distribution as pip leaves it: a module and its dist-info with an `ablate.plugins` entry point."""
    (site / f"{module}.py").write_text(body)
    info = site / f"{module}-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[ablate.plugins]\n{module} = {module}\n")
    (info / "RECORD").write_text(f"{module}.py,,\n")
    (info / "top_level.txt").write_text(f"{module}\n")


def test_entry_points_register_installed_plugins_and_a_broken_one_only_warns(tmp_path, monkeypatch, capsys):
    dist_info(tmp_path, "goodplug", MIXER.replace("{name}", "conv-installed").replace("{tag}", "pkg"))
    dist_info(tmp_path, "badplug", "raise ImportError('needs a GPU library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match="entry point 'badplug'.*needs a GPU library"):
        load.load_entry_points()
    family = registry.check_architecture("conv-installed")
    assert family.source.kind == "package" and family.source.identity == "package:goodplug==0.3"
    from ablate.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr()
    assert "conv-installed" in out.out and "package goodplug" in out.out
    assert "skipped the installed plugin badplug" in out.err


def test_a_worker_without_an_installed_plugin_fails_the_trial_saying_what_to_install(sqlite_url, tmp_path):
    from ablate.config import parse_spec
    from ablate.runner import LaunchOptions, run_trial

    fields = dict(architecture="mixer", d_model=16, layers=1, context=8, lr=1e-3, batch_size=2,
                  dataset={"source": "ablate:tinystories-sample"}, budget={"steps": 1})
    trial = TrialConfig(**fields)
    engine = store.connect(sqlite_url)
    spec = parse_spec({"name": "gone", "dataset": fields["dataset"], "budget": fields["budget"],
                       "grid": [{"architecture": "mixer"}], "defaults": {k: fields[k] for k in
                                                                       ("d_model", "layers", "context", "lr", "batch_size")}})
    _, (run_id,) = store.register_sweep(engine, spec, [trial])
    config = {**trial.model_dump(mode="json"), "architecture": "conv-gone", "code": "conv-gone@package:convpkg==1.2"}
    store.update_run(engine, run_id, config=config, architecture="conv-gone")
    assert run_trial(run_id, LaunchOptions(db_url=sqlite_url, artifacts=tmp_path)) == "failed"
    error = store.get_run(engine, run_id).error
    assert "installed package convpkg==1.2, which is not installed here" in error and "EXTRA_REQUIREMENTS" in error


# ---------------------------------------------------------------- the whole way: plan, run, report, edit


def ablate_cli(args: list[str], cwd: Path, db: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate.cli", *args, "--db", db], cwd=cwd, text=True,
                          capture_output=True, env=cli_env(HF_HUB_OFFLINE="1"), timeout=600)


def runs_of(engine, sweep: str) -> list:
    import sqlalchemy as sa

    with store.session_factory(engine)() as session:
        return list(session.scalars(sa.select(store.Run).join(store.Sweep).where(store.Sweep.name == sweep)
                                    .order_by(store.Run.id)))


@pytest.mark.slow
def test_a_plugin_is_planned_trained_beside_a_built_in_reported_and_an_edit_makes_new_runs(tmp_path):
    home, elsewhere = tmp_path / "laptop", tmp_path / "worker"
    home.mkdir(), elsewhere.mkdir()
    write_plugin(home)
    spec = sweep_file(home, ["./conv_plugin.py"])
    db = f"sqlite:///{tmp_path / 'ablate.db'}"
    planned = ablate_cli(["plan", str(spec)], elsewhere, db)
    assert planned.returncode == 0, planned.stderr
    assert "conv-test" in planned.stdout and "counted by building it on the meta device" in planned.stdout
    ran = ablate_cli(["sweep", "run", str(spec), "--artifacts", str(tmp_path / "art")], elsewhere, db)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    engine = store.connect(db)
    runs = {r.architecture: r for r in runs_of(engine, "plug")}
    assert {r.status for r in runs.values()} == {"completed"}
    first_code = runs["conv-test"].code_version.split()[-1]
    assert first_code.startswith("file:") and len(runs["mixer"].code_version.split()) == 1

    # a worker that never saw the file trains a run from the source the DB holds
    write_plugin(home, tag="v2")
    refused = ablate_cli(["sweep", "run", str(spec), "--artifacts", str(tmp_path / "art")], elsewhere, db)
    assert refused.returncode == 2 and "a plugin's code" in refused.stderr and "--merge" in refused.stderr
    merged = ablate_cli(["sweep", "register", str(spec), "--merge"], elsewhere, db)
    assert merged.returncode == 0, merged.stderr
    (home / "conv_plugin.py").unlink()
    new = [r for r in runs_of(engine, "plug") if r.status == "pending"]
    assert len(new) == 1 and new[0].code_version.split()[-1] != first_code
    trained = subprocess.run([sys.executable, "-m", "ablate.train", "--run-id", str(new[0].id), "--db", db,
                              "--artifacts", str(tmp_path / "art"), "--quiet"], cwd=elsewhere, text=True,
                             capture_output=True, env=cli_env(HF_HUB_OFFLINE="1"), timeout=600)
    assert trained.returncode == 0, trained.stderr
    report = ablate_cli(["report", "plug", "--out", str(tmp_path / "report")], elsewhere, db)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"code=conv-test@{first_code}" in text and f"code=conv-test@{new[0].code_version.split()[-1]}" in text
    assert "Plugin code of conv-test: conv-test@" in text
    assert "architecture=mixer" in text


LEAKY = '''
import torch
from pydantic import BaseModel

import ablate


class Options(BaseModel):
    peek: int = 1


class Peeking(torch.nn.Module):
    def __init__(self, trial, vocab_size):
        super().__init__()
        self.peek = Options(**trial.options).peek
        self.embed = torch.nn.Embedding(vocab_size, trial.d_model)
        self.head = torch.nn.Linear(trial.d_model, vocab_size)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        return self.head(x + torch.roll(x, -self.peek, dims=1))  # position t also reads token t + peek


@ablate.architecture("peeking", options=Options)
def build(trial, vocab_size):
    return Peeking(trial, vocab_size)
'''


def test_registering_refuses_a_plugin_model_that_reads_the_future_naming_position_and_options(tmp_path, sqlite_url):
    from ablate import runner

    (tmp_path / "peeking.py").write_text(LEAKY)
    path = sweep_file(tmp_path, ["./peeking.py"], architectures=("peeking",))
    data = yaml.safe_load(path.read_text())
    data["grid"][0]["options"] = {"peek": [2]}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(AblateError) as caught:
        runner.register(path, sqlite_url)
    message = str(caught.value)
    assert "refused before anything was registered" in message and "architecture 'peeking'" in message
    assert '{"peek": 2}' in message and "causal (eval)" in message and "position 0" in message
    import sqlalchemy as sa

    with store.connect(sqlite_url).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Sweep)).scalar() == 0


def test_the_example_plugin_passes_the_whole_contract_and_its_closed_form_is_exact():
    from ablate.plugins.check import check_trial, small_trial

    load.load_plugin(str(REPO / "examples" / "plugins" / "shift_mixer.py"))
    findings = {f.name: f for f in check_trial(small_trial("shift-mixer", {"kernel": 3}))}
    assert not [f for f in findings.values() if f.ok is False], findings
    assert findings["param count"].ok is True and findings["causal (eval)"].ok is True
    spec, trials = load_trials(REPO / "examples" / "plugins" / "compare.yaml")
    assert {t.architecture for t in trials} == {"shift-mixer", "mixer", "llama"}


def test_the_installed_example_package_is_found_by_its_entry_point_and_plans_without_torch(tmp_path):
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("ablate-shiftmix")
    except PackageNotFoundError:
        pytest.skip("pip install examples/plugins/shiftmix-package (.ci/run does)")
    family = registry.check_architecture("shiftmix")
    assert family.source.kind == "package" and family.source.identity == f"package:ablate-shiftmix=={installed}"
    assert family.closed_form  # its torch-free options module: planning builds nothing
    path = sweep_file(tmp_path, [], architectures=("shiftmix", "mixer"))
    code = ("import sys\nfrom ablate.config import load_trials\n"
            f"trials = load_trials({str(path)!r})[1]\n"
            "from ablate.cli.plan import trial_param_counts\n"
            "print(trials[0].code, trial_param_counts(trials[0])[0], 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    code_of, params, torch_loaded = out.stdout.split()
    assert code_of == f"shiftmix@package:ablate-shiftmix=={installed}" and int(params) > 0 and torch_loaded == "False"
