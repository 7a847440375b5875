"""The runs table of `ablate sweep status` and `ablate sweep run`, read in an 80x24 terminal."""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

from rich.console import Console

from ablate.cli import print_status_csv, runs_table
from ablate.cli.status import STATUS_HEADER

OOM = "out of memory: tried to allocate 2.00 GiB (GPU 0; 11.76 GiB total capacity; 9.80 GiB already allocated)"
CRASH = "trainer exited with code 1: CUDA error: an illegal memory access was encountered\nTraceback ..."


def _run(rid: int, architecture: str, d_model: int, heads: int | None, status: str, step: int | None = None,
         train: float | None = None, eval_: float | None = None, error: str | None = None) -> SimpleNamespace:
    """A run row as results.status.status_rows gives it: one sweep's axes (layers, lr, batch fixed), its latest
    points."""
    done = status == "completed"
    return SimpleNamespace(
        id=rid, architecture=architecture, objective="clm", options={}, d_model=d_model, layers=2, heads=heads,
        context=256, lr=0.003, batch_size=16, seed=0, epochs=None, status=status, budget_kind="steps", budget_amount=2000, train_seconds=None,
        last_elapsed_seconds=None, steps=step if done else None, last_step=step,
        final_train_loss=train if done else None, last_train_loss=train, final_eval_loss=eval_ if done else None,
        last_eval_loss=eval_, error=error, finished_at=None)


ROWS = [_run(1041, "mixer", 256, None, "completed", 2000, 2.4312, 2.5121),
        _run(1042, "mixer", 512, None, "running", 1350, 2.2012, 2.3410),
        _run(1043, "llama", 256, 4, "failed", 120, 5.1234, None, CRASH),
        _run(1044, "llama", 512, 8, "oom", 0, None, None, OOM),
        _run(1045, "llama", 512, 8, "pending")]


def _rendered(table, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_the_runs_table_reads_whole_in_80_columns():
    text = _rendered(runs_table(ROWS, title="sweep masked-mixers-1: 1/5 finished"))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and len(lines) <= 24, text
    for status in ("completed", "running", "failed", "oom", "pending"):
        assert status in text, text
    for value in ("2000", "1350", "120", "2.431", "2.512", "2.201", "2.341", "5.123"):
        assert value in text, text  # steps and losses whole, never cut
    assert "trainer exited with" in text and "out of memory: tried" in text, text  # the reason's start
    assert "…" not in "".join(line[:-30] for line in lines), text  # only the reason, at the right, gives way
    header = lines[2].split()  # the dashboard's order: run, status, progress, the axes, then steps to reason
    assert header[:6] == ["run", "status", "used", "arch", "d", "H"], header
    assert header[-4:] == ["steps", "train", "eval", "reason"], header
    assert "mixer" in text and "llama" in text and "512" in text  # the varying axes stay
    title = " ".join(lines[:2])  # the same in every row: said once, in the title
    assert "layers=2" in title and "lr=0.003 batch_size=16 seed=0" in title, text
    assert " 68% " in text and "100%" in text  # the budget used: 1350 of 2000 steps
    assert "options" not in text and "opts" not in header  # blank in every row: left out, unsaid
    assert "1 completed, 1 failed, 1 oom, 1 pending, 1 running" in text


def test_a_column_that_varies_stays_and_a_wide_terminal_shows_the_whole_reason():
    rows = [*ROWS[:2], _run(1046, "mixer", 512, None, "completed", 2000, 2.1, 2.2)]
    rows[2].lr = 0.001
    text = _rendered(runs_table(rows), width=160)
    lines = text.splitlines()
    assert lines[2].split() == ["run", "status", "used", "d", "lr", "steps", "train", "eval", "reason"], text
    assert "0.003" in text and "0.001" in text
    assert " ".join(lines[:2]).split() == ["architecture=mixer", "objective=clm", "layers=2", "context=256",
                                           "batch_size=16", "seed=0"], text
    text = _rendered(runs_table(ROWS), width=170)  # 108 characters of reason beside the 10 columns
    assert OOM in text and CRASH.splitlines()[0] in text


def test_the_csv_keeps_every_column(capsys):
    print_status_csv(ROWS)
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert tuple(rows[0]) == STATUS_HEADER and len(rows) == len(ROWS)
    assert rows[0]["layers"] == "2" and rows[0]["lr"] == "0.003" and rows[0]["batch_size"] == "16"
    assert rows[0]["progress"] == "1.0" and rows[1]["progress"] == "0.675" and rows[4]["progress"] == ""
    assert rows[0]["architecture"] == "mixer" and rows[0]["options"] == "" and rows[0]["heads"] == ""
    assert rows[3]["reason"] == OOM and rows[2]["reason"] == CRASH.splitlines()[0][:200]
