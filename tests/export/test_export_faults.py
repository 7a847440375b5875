"""An export under faults: one export at a time into a target, a W&B folder shared by two sweeps that hold the same
trials, an export killed while writing, and a target that cannot be written are each handled, in one line."""

from __future__ import annotations


import pytest
import sqlalchemy as sa

from ablate import store
from ablate.cli import main
from ablate.config.errors import AblateError
from ablate.export import export_sweep, lock_for
from ablate.export.ledger import NAME, exclusive
from tests.export.readers import wandb_runs
from tests.export.test_export import _uri
from tests.ui.conftest import build


@pytest.mark.parametrize("to", ["tensorboard", "mlflow"])
def test_a_second_export_into_the_same_target_is_refused_while_one_writes(to, tmp_path):
    pytest.importorskip(to)
    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    uri = _uri(to, tmp_path)
    with exclusive(lock_for(to, uri, "widths"), "held by the test"):  # as an export in another process holds it
        with pytest.raises(AblateError, match="another export is writing into .* now; two at once would send"):
            export_sweep("widths", to, uri, db["url"])
        if to == "mlflow":
            assert not (tmp_path / "mlflow.db").exists()  # refused before MLflow made (or migrated) its store
        else:
            assert not [p for p in (tmp_path / "tensorboard" / "widths").iterdir() if p.name != NAME]
    assert export_sweep("widths", to, uri, db["url"]).updated == 8  # released with the process: the next one goes


@pytest.mark.slow
def test_wandb_keys_what_it_sent_by_sweep_and_drops_what_a_killed_export_left(tmp_path):
    pytest.importorskip("wandb")
    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    uri = _uri("wandb", tmp_path)
    assert export_sweep("widths", "wandb", uri, db["url"]).updated == 8
    with store.connect(db["url"]).begin() as conn:  # a second sweep holding the same trials (same fingerprints)
        conn.execute(sa.update(store.Sweep).where(store.Sweep.name == "widths").values(name="widths-again"))
    again = export_sweep("widths-again", "wandb", uri, db["url"])
    assert (again.runs, again.updated) == (8, 8)  # sent to its own project, not "exported" as already there
    projects = {f.parent.name for f in (tmp_path / "wandb" / NAME).glob("*/*.json")}
    assert projects == {"widths", "widths-again"}

    # an export killed after W&B wrote a run's folder and before the ledger recorded it
    fp = next(iter(wandb_runs(tmp_path / "wandb")))
    (tmp_path / "wandb" / NAME / "widths-again" / f"{fp}.json").unlink()
    folders = lambda: sorted((tmp_path / "wandb" / "wandb").glob(f"offline-run-*-{fp}"))  # noqa: E731
    kept, partial = folders()  # the first sweep's (recorded) and the second's (now unrecorded: partial)
    assert export_sweep("widths-again", "wandb", uri, db["url"]).updated == 1
    now = folders()
    assert len(now) == 2 and kept in now and partial not in now  # the partial one gone, the run sent again


def test_a_target_that_cannot_be_written_is_one_line_naming_the_fix(tmp_path, capsys):
    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    a_file = tmp_path / "afile"
    a_file.write_text("")
    for to, uri in (("tensorboard", str(a_file)), ("wandb", str(a_file)), ("tensorboard", "/proc/no-such-place")):
        with pytest.raises(AblateError) as caught:
            export_sweep("widths", to, uri, db["url"])
        said = str(caught.value)
        assert said.startswith(f"cannot write the {to} export at {uri}") and "give --uri a folder you can write" in said
        assert "\n" not in said
    assert main(["export", "widths", "--to", "tensorboard", "--uri", str(a_file), "--db", db["url"]]) == 2
    err = capsys.readouterr().err
    assert "cannot write the tensorboard export" in err and "Traceback" not in err


def test_an_mlflow_store_error_is_one_line(tmp_path):
    pytest.importorskip("mlflow")
    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    (tmp_path / "notes.db").write_text("not a database, but text someone keeps here\n" * 100)
    with pytest.raises(AblateError) as caught:
        export_sweep("widths", "mlflow", f"sqlite:///{tmp_path / 'notes.db'}", db["url"])
    said = str(caught.value)
    assert said.startswith(f"exporting to mlflow at sqlite:///{tmp_path / 'notes.db'} failed: ") and "\n" not in said
    assert (tmp_path / "notes.db").read_text().startswith("not a database")  # left as it was
