"""Reading a results DB never runs the plugin code stored in it: a stored trial's plugin stands in by the facts
recorded at registration (ablate/plugins/recorded.py); only the trainer, and `ablate generate` when told to, run
a stored source, and only after checking its text against its identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import store
from ablate.config import TrialConfig, load_trials, parse_spec, registry
from ablate.config.errors import AblateError
from ablate.config.identity import file_identity
from ablate.plugins import load, recorded, stored
from ablate.store.schema import PluginSource
from tests.helpers import cli_env
from tests.plugins.test_plugins import sweep_file, write_plugin


def registered(tmp_path: Path, url: str, tag: str) -> tuple[sa.Engine, TrialConfig, int]:
    """A sweep of one plugin run registered in `url` by this process, then the plugin forgotten, as in a process
    that only reads the DB (`tag`: code no other test registers, so that this DB alone holds its source)."""
    write_plugin(tmp_path, tag=tag)
    path = sweep_file(tmp_path, ["./conv_plugin.py"], architectures=("conv-test",))
    _, (trial,) = load_trials(path)
    engine = store.connect(url)
    _, (run_id,) = store.register_sweep(engine, parse_spec(yaml.safe_load(path.read_text()), base_dir=tmp_path),
                                        [trial], plugins=stored.records_of([trial]))
    del registry.FAMILIES.entries["conv-test"]
    load._FILES.clear()
    return engine, trial, run_id


def tamper(engine: sa.Engine, identity: str, marker: Path, original: str) -> None:
    """Change the stored source in place (its identity left as it was): code that leaves `marker` when it runs."""
    evil = f"open({str(marker)!r}, 'w').write('ran')\n" + original
    with engine.begin() as conn:
        conn.execute(sa.update(PluginSource).where(PluginSource.identity == identity).values(text=evil))


def test_a_stored_trial_reads_by_its_recorded_facts_and_the_trainer_loads_exactly_its_source(tmp_path, sqlite_url):
    engine, trial, run_id = registered(tmp_path, sqlite_url, "read-facts")
    identity = trial.code.split("@", 1)[1]
    copy = Path(tempfile.gettempdir()) / f"ablate-plugins-{os.getuid()}" / identity.replace(":", "-") / "conv_plugin.py"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text("raise SystemExit('not the registered code')\n")  # a stale or tampered copy
    (tmp_path / "conv_plugin.py").unlink()

    read = TrialConfig.model_validate(store.get_run(engine, run_id).config)
    family = registry.check_architecture("conv-test")
    assert family.source.kind == "recorded" and family.source.identity == identity
    assert family.description == "a causal depthwise-convolution mixer"
    assert read.code == trial.code and read.fingerprint() == trial.fingerprint()
    assert read.axes() == trial.axes() and read.effective_options() == {"kernel": 3}  # the default, recorded
    assert copy.read_text().startswith("raise SystemExit")  # reading wrote no code, and ran none
    assert recorded.unloaded(read) == [("conv-test", identity)]
    with pytest.raises(AblateError, match="reading commands never run code from the results DB"):
        family.model_module().build(read, 384)

    ready = stored.ensure(read)  # the trainer: exactly the registered source, over the tampered copy
    family = registry.check_architecture("conv-test")
    assert family.source.kind == "file" and family.source.identity == identity
    assert family.source.where == str(tmp_path / "conv_plugin.py")  # recorded as registered, run from the copy
    assert file_identity(copy.read_text()) == identity and not recorded.unloaded(ready)


def test_registering_a_plugin_trial_without_its_source_is_refused_and_writes_nothing(tmp_path, sqlite_url):
    """The store receives plugin sources from its caller: one that forgot them would leave runs no worker can
    build, so the registration is refused before any row is written; with the records it stores the source."""
    write_plugin(tmp_path, tag="forgot-source")
    path = sweep_file(tmp_path, ["./conv_plugin.py"], architectures=("conv-test",))
    spec, (trial,) = load_trials(path)
    engine = store.connect(sqlite_url)
    with pytest.raises(AblateError, match="plugin 'conv-test', whose source was neither given nor stored"):
        store.register_sweep(engine, spec, [trial])
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(store.Sweep)) == 0
    records = stored.records_of([trial])
    assert [s.identity for s in records.sources] == [trial.code.split("@", 1)[1]]
    assert records.facts[("conv-test", records.sources[0].identity)]["kind"] == "architecture"
    store.register_sweep(engine, spec, [trial], plugins=records)
    store.register_sweep(engine, spec, [trial])  # stored once: a later registration needs no records
    with engine.connect() as conn:
        assert conn.scalar(sa.select(PluginSource.text)) == (tmp_path / "conv_plugin.py").read_text()
    del registry.FAMILIES.entries["conv-test"]
    load._FILES.clear()


def test_a_tampered_stored_source_is_refused_in_one_line_before_any_of_it_runs(tmp_path, sqlite_url):
    engine, trial, run_id = registered(tmp_path, sqlite_url, "tampered-db")
    identity = trial.code.split("@", 1)[1]
    marker = tmp_path / "ran"
    tamper(engine, identity, marker, (tmp_path / "conv_plugin.py").read_text())
    read = TrialConfig.model_validate(store.get_run(engine, run_id).config)
    with pytest.raises(AblateError) as caught:
        stored.ensure(read)
    assert f"the source stored for {identity} in the results DB is other code" in str(caught.value)
    assert "\n" not in str(caught.value) and not marker.exists()


def test_generate_loads_a_plugin_run_only_from_the_file_it_was_trained_with(tmp_path, sqlite_url):
    engine, trial, run_id = registered(tmp_path, sqlite_url, "given-file")
    read = TrialConfig.model_validate(store.get_run(engine, run_id).config)
    with pytest.raises(AblateError, match="--plugin PATH"):
        stored.load_for(read, "sampling run 1")
    ready = stored.load_for(read, "sampling run 1", plugin=str(tmp_path / "conv_plugin.py"))
    assert registry.check_architecture("conv-test").source.kind == "file" and ready.code == trial.code
    write_plugin(tmp_path, tag="edited since", file="edited.py")
    del registry.FAMILIES.entries["conv-test"]
    recorded.stand_in(trial.code)
    with pytest.raises(AblateError, match="is not the code sampling run 1 was trained with"):
        stored.load_for(read, "sampling run 1", plugin=str(tmp_path / "edited.py"))


READER = """
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from ablate import store
from ablate.ui.app import make_app
client = TestClient(make_app(store.reader(sys.argv[1]), artifacts=Path(sys.argv[2])), base_url="http://127.0.0.1")
out = {path: client.get(path).json() for path in ("/api/study?sweep=plug", "/api/runs?sweep=plug", "/api/run/1",
                                                   "/api/run/1/sample")}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_reading_commands_never_run_a_stored_source_edited_in_a_copy_of_the_db(tmp_path, sqlite_url):
    engine, trial, run_id = registered(tmp_path, sqlite_url, "hostile-copy")
    marker = tmp_path / "ran"
    tamper(engine, trial.code.split("@", 1)[1], marker, (tmp_path / "conv_plugin.py").read_text())
    checkpoint = tmp_path / "art" / "run" / "checkpoint.pt"  # a sample must get as far as loading the model
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")
    with engine.begin() as conn:
        conn.execute(sa.update(store.Run).where(store.Run.id == run_id).values(
            status="completed", checkpoint_path=str(checkpoint)))
    elsewhere = tmp_path / "colleague"
    elsewhere.mkdir()

    def ablate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ablate.cli", *args, "--db", sqlite_url], cwd=elsewhere, text=True,
                              capture_output=True, env=cli_env(HF_HUB_OFFLINE="1"), timeout=300)

    report = ablate("report", "plug", "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    assert "conv-test" in (tmp_path / "report" / "report.md").read_text()
    for args in (["sweep", "status", "plug"], ["export", "plug", "--to", "tensorboard", "--uri", str(tmp_path / "tb")], ["sql", "select count(*) from runs"]):
        done = ablate(*args)
        assert done.returncode == 0, done.stderr
    refused = ablate("generate", str(run_id), "--prompt", "Once", "--artifacts", str(tmp_path / "art"))
    assert refused.returncode != 0 and "--plugin PATH" in refused.stderr and "Traceback" not in refused.stderr
    opted = ablate("generate", str(run_id), "--prompt", "Once", "--artifacts", str(tmp_path / "art"),
                   "--run-stored-plugin")
    assert opted.returncode != 0 and "is other code" in opted.stderr and "Traceback" not in opted.stderr
    served = subprocess.run([sys.executable, "-c", READER, sqlite_url, str(tmp_path / "art")], cwd=elsewhere,
                            text=True, capture_output=True, env=cli_env(HF_HUB_OFFLINE="1"), timeout=300)
    assert served.returncode == 0, served.stderr
    pages = json.loads(served.stdout.splitlines()[-1])
    assert pages["/api/study?sweep=plug"]["tables"][0]["title"] == "architecture=conv-test"
    assert pages["/api/run/1"]["config"]["architecture"] == "conv-test"
    assert "reading commands never run code" in pages["/api/run/1/sample"]["error"]
    assert not marker.exists()


def test_recorded_options_read_whatever_names_the_facts_hold():
    """Facts are data from a DB: option names pydantic keeps for itself or that are no identifiers still read."""
    model = recorded._options_model("x", {"schema": 2, "copy": 3, "kernel": 4, "not a name": 5, "_private": 6})
    assert model(kernel=5, other=1).model_dump(mode="json") == {"schema": 2, "copy": 3, "kernel": 5, "other": 1}
