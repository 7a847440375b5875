"""The csv module writing what pandas' to_csv writes: runs.csv and claims.csv of a report, made without pandas."""

from __future__ import annotations

import csv
import datetime as dt
import io
import random
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from ablate.results import csvtext

KINDS = {
    "ints": lambda r: r.randint(-10**6, 10**6),
    "floats": lambda r: r.choice([r.uniform(-1, 1) * 10.0 ** r.randint(-30, 30), 0.0, 1e16, 3.0]),
    "bools": lambda r: r.random() < 0.5,
    "texts": lambda r: r.choice(["mixer", "a,b", 'say "hi"', "two\nlines", "", " x"]),
    "lists": lambda r: r.choice([[1, 2], {"a": 1}, (3,)]),
    "big": lambda r: r.choice([2**63 - 1, 2**70, -(2**63)]),
    "nan": lambda r: float("nan"),
    "seconds": lambda r: dt.datetime(2026, 11, 30, r.randint(0, 23), r.randint(0, 59), r.randint(0, 59)),
    "millis": lambda r: dt.datetime(2026, 11, 30, 1, 2, 3, 1000 * r.randint(0, 999)),
    "micros": lambda r: dt.datetime(2026, 11, 30, 1, 2, 3, r.randint(0, 999_999)),
    "days": lambda r: dt.datetime(2026, 11, r.randint(1, 30)),
}


def _column(r: random.Random, n: int) -> list:
    """n values of one to three kinds, some gaps (None) or none."""
    kinds = r.sample(sorted(KINDS), r.choice([1, 1, 2, 3]))
    gaps = r.choice([0.0, 0.0, 0.3, 1.0])
    return [None if r.random() < gaps else KINDS[r.choice(kinds)](r) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_a_column_of_any_mix_of_values_is_written_as_pandas_writes_it(tmp_path, seed):
    # 40 random columns of 1-3 kinds with and without gaps: the file the csv module writes is pandas' file
    r = random.Random(seed)
    n = r.choice([1, 3, 50])
    columns = [f"c{i}" for i in range(40)]
    values = [_column(r, n) for _ in columns]
    rows = list(zip(*values))
    ours = tmp_path / "ours.csv"
    csvtext.write_records_csv(rows, columns, ours)
    theirs = pd.DataFrame.from_records(rows, columns=columns).to_csv(index=False, lineterminator="\n")
    assert ours.read_text() == theirs
    for column in values:  # a varying config field: the column pandas makes of a dict of lists
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows((cell, 0) for cell in csvtext.cells(column))
        assert text.getvalue() == pd.DataFrame({"x": column, "y": 0}).to_csv(index=False, header=False,
                                                                               lineterminator="\n")


def test_numpy_statistics_are_written_as_the_python_numbers_they_are(tmp_path):
    rows = [(np.float64(0.25), np.int64(3), np.True_, None), (None, np.int64(4), np.False_, np.float64(1e-9))]
    ours = tmp_path / "ours.csv"
    csvtext.write_records_csv(rows, ["mean", "n", "below", "p"], ours)
    assert ours.read_text() == pd.DataFrame.from_records(rows, columns=["mean", "n", "below", "p"]).to_csv(
        index=False, lineterminator="\n")
    assert ours.read_text().splitlines()[1:] == ["0.25,3,True,", ",4,False,1e-09"]


def test_a_chunk_of_datetimes_is_written_at_the_precision_it_needs_as_pandas_writes_its_chunks():
    midnight, second = dt.datetime(2026, 1, 2), dt.datetime(2026, 1, 2, 3, 4, 5)
    assert csvtext.cells([midnight, None]) == ["2026-01-02", ""]
    assert csvtext.cells([midnight, second]) == ["2026-01-02 00:00:00", "2026-01-02 03:04:05"]
    assert csvtext.cells([second.replace(microsecond=5000)]) == ["2026-01-02 03:04:05.005"]
    assert csvtext.cells([second, second.replace(microsecond=5)]) == ["2026-01-02 03:04:05.000000",
                                                                      "2026-01-02 03:04:05.000005"]


def test_a_report_writes_its_csv_files_without_importing_pandas(tmp_path):
    # pandas costs 64 MiB resident: a report that never needs it (runs.csv, claims.csv) leaves it unimported
    from tests.report.test_report_scale import fake_sweep, grid

    url, _ = fake_sweep(tmp_path, "nopd", grid([32, 64], [1e-3, 2e-3], 3), points=8)
    code = ("import sys; from pathlib import Path; from ablate.report import build_report; "
            f"r = build_report('nopd', {url!r}, Path({str(tmp_path / 'out')!r}), formats=('md', 'csv')); "
            "print(sorted(p.name for p in r.files), 'pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "'runs.csv'" in out and "'claims.csv'" in out and out.strip().endswith("False")


def test_a_field_two_sweeps_both_vary_is_in_each_sweeps_rows(tmp_path):
    # runs.csv of two sweeps (`ablate report a b`): a config field each varies is filled in the rows of both
    import sqlalchemy as sa

    from ablate import store
    from ablate.results.views import load_views
    from tests.report.test_report_scale import fake_sweep, grid

    url = f"sqlite:///{tmp_path / 'two.db'}"
    by_sweep = {}
    for name in ("first", "second"):
        url, ids = fake_sweep(tmp_path, name, grid([32], [1e-3], 2), points=8, url=url)
        with store.connect(url).begin() as conn:
            for warmup, rid in enumerate(ids):
                config = conn.execute(sa.select(store.Run.config).where(store.Run.id == rid)).scalar_one()
                conn.execute(sa.update(store.Run).where(store.Run.id == rid)
                             .values(config={**config, "warmup_steps": warmup}))
        by_sweep[name] = [v.row for v in load_views(store.reader(url), name)[1]]
    csvtext.write_runs_csv(by_sweep, tmp_path / "runs.csv")
    rows = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert [(r["sweep"], r["warmup_steps"]) for r in rows] == [(s, str(w)) for s in by_sweep for w in range(4)]
