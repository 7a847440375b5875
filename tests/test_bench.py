"""The benchmark suite's CPU version runs end to end and writes a well-formed table (it must never rot)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import patience

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_all_quick_on_cpu_writes_json_and_markdown(tmp_path):
    out = tmp_path / "bench"
    result = subprocess.run([sys.executable, "-m", "bench", "all", "--quick", "--device", "cpu", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=patience(600))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["environment"]["torch"] and data["environment"]["date"]
    assert {r["arch"] for r in data["throughput"]} == {"llama", "mixer"}
    assert all(r["tokens_per_s"] > 0 for r in data["throughput"])
    for row in data["ways"]:
        assert row["trainer/bare"] == pytest.approx(row["trainer_tok_s"] / row["bare_tok_s"])
        assert row["trainer_tok_s"] > 0 and row["studies_tok_s"] > 0
    memory = {(r["arch"], r["layers"]): r for r in data["context_memory"]}
    for (arch, layers), row in memory.items():
        assert row["256"] > row["128"] > 0  # memory grows with context
    md = (out / "results.md").read_text()
    tables = [block for block in md.split("\n## ")[1:]]
    assert len(tables) == 3
    for block in tables:
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        widths = {ln.count("|") for ln in lines}
        assert len(lines) >= 3 and len(widths) == 1, block
    assert md in result.stdout
