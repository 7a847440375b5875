"""Spec validation holes: each bad sweep file is refused with one clear message naming the field or file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.config.errors import AblateError, SpecError
from ablate.config import expand_grid, load_spec, load_trials, parse_spec
from ablate.config.yamlfile import MAX_SPEC_DEPTH

from tests.config.test_spec import BASE, spec_with  # the same minimal valid spec
from tests.waiting import patience

pytestmark = pytest.mark.hardening  # a campaign across the house: `pytest -m hardening`


def write(folder: Path, data: dict | str, name: str = "s.yaml") -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def refused(path: Path, *needles: str, kind: type[Exception] = SpecError) -> str:
    """load_trials refuses the file with an error holding every needle; returns the message."""
    with pytest.raises(kind) as info:
        load_trials(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"
    return message


def yaml_text(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False)


# ---------------------------------------------------------------- 1. budgets: finite, positive amounts

NON_FINITE = [
    ("wall_clock", ".nan"), ("wall_clock", ".inf"), ("tokens", ".inf"), ("tokens", "-.inf"), ("tokens", ".nan"),
    ("steps", ".inf"), ("steps", ".nan"), ("flops", "-.inf"), ("flops", "1.0e+999"),
    ("tokens", "'nan'"), ("flops", "'inf'"), ("tokens", "1e999"), ("tokens", "1" + "0" * 400),
]


@pytest.mark.parametrize("kind,amount", NON_FINITE, ids=[f"{k}={a[:8]}" for k, a in NON_FINITE])
def test_non_finite_budget_is_refused_naming_the_field(tmp_path, kind, amount):
    text = yaml_text(spec_with(budget={"hardware": "cpu"})).replace("budget:\n", f"budget:\n  {kind}: {amount}\n")
    message = refused(write(tmp_path, text), f"budget.{kind}")
    assert "finite" in message or "not a count" in message
    assert "0" * 100 not in message  # a huge value is not echoed back whole


def test_wall_clock_takes_a_number_of_seconds_but_not_zero_or_a_boolean(tmp_path):
    spec = load_spec(write(tmp_path, spec_with(budget={"wall_clock": 30})))
    assert spec.budget.amount == 30.0 and spec.budget.describe().startswith("wall clock 30s")
    assert load_spec(write(tmp_path, spec_with(budget={"wall_clock": 2.5}))).budget.amount == 2.5
    refused(write(tmp_path, spec_with(budget={"wall_clock": 0})), "budget.wall_clock", "must be positive")
    refused(write(tmp_path, spec_with(budget={"steps": True})), "budget.steps", "not true")


# ---------------------------------------------------------------- 2. grids that expand to nothing

EMPTY = [
    ("grid", [], "grid: an empty list expands to 0 trials"),
    ("axis", [{"architecture": "mixer", "d_model": []}], "grid[0].d_model: an empty list expands to 0 trials"),
    ("option", [{"architecture": "mixer", "d_model": 32, "options": {"expand": []}}], "grid[0].options.expand: an empty list"),
    ("seeds", [{"architecture": "mixer", "d_model": 32, "seeds": []}], "grid[0].seeds: an empty list expands to 0 trials"),
    ("zip", [{"architecture": "mixer", "zip": {"d_model": [], "batch_size": []}}], "grid[0].zip: empty lists expand to 0"),
]


@pytest.mark.parametrize("grid,needle", [(g, n) for _, g, n in EMPTY], ids=[i for i, _, _ in EMPTY])
def test_a_grid_expanding_to_no_trial_is_refused(tmp_path, grid, needle):
    refused(write(tmp_path, spec_with(grid=grid)), needle)


def test_a_search_spec_without_grid_still_plans_its_one_base_trial():
    data = {k: v for k, v in BASE.items() if k != "grid"}
    data["defaults"] = {**BASE["defaults"], "architecture": "mixer", "d_model": 32}
    data["search"] = {"parameters": {"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}}
    assert len(expand_grid(parse_spec(data))) == 1


# ---------------------------------------------------------------- 3. integers the runs table cannot hold

@pytest.mark.parametrize("field,value,limit", [
    ("d_model", 2**31, "2147483647"), ("seed", 2**31, "2147483647"), ("layers", 2**31, "2147483647"),
    # these have tighter limits of their own (below): the message gives that limit
    ("batch_size", 10**20, "65536"), ("context", 2**40, "1048576"), ("grad_accum", 2**31, "65536")])
def test_integers_beyond_32_bits_are_refused_naming_the_field(tmp_path, field, value, limit):
    block = {"architecture": "mixer", "d_model": 32, field: value}
    refused(write(tmp_path, spec_with(grid=[block])), f"grid[0].{field}", limit)


@pytest.mark.parametrize("change,needles", [
    ({"context": 1_000_000_000}, ["defaults.context", "less than or equal to 1048576"]),
    ({"batch_size": 100_000_000}, ["defaults.batch_size", "less than or equal to 65536"]),
    ({"batch_size": 1000, "context": 100_000}, ["100,000,000 tokens per micro-batch", "16,777,216", "lower batch_size"]),
])
def test_sizes_no_machine_can_hold_are_refused_in_plan_with_the_limit(tmp_path, change, needles):
    data = spec_with(defaults={**BASE["defaults"], **change})
    refused(write(tmp_path, data), *needles)


def test_the_largest_allowed_sizes_still_plan(tmp_path):
    data = spec_with(defaults={**BASE["defaults"], "context": 1 << 20, "batch_size": 16})
    _, trials = load_trials(write(tmp_path, data))
    assert trials[0].context == 1 << 20


@pytest.mark.parametrize("make", ["device", "fifo", "glob"])
def test_a_source_that_is_not_a_regular_file_is_refused_in_plan(tmp_path, make):
    if make == "device":
        source = "/dev/zero"
    elif make == "fifo":
        source = str(tmp_path / "pipe.txt")
        os.mkfifo(source)
    else:  # a pattern matching a FIFO among regular files
        (tmp_path / "a.txt").write_text("one story\n")
        os.mkfifo(tmp_path / "b.txt")
        source = str(tmp_path / "*.txt")
    data = spec_with(dataset={"source": source, "eval": {"holdout": 1}})
    t0 = time.monotonic()
    message = refused(write(tmp_path, data), "dataset.source", "not a regular file")
    assert time.monotonic() - t0 < patience(10)  # refused without reading it
    assert "/dev/zero" in message or "pipe.txt" in message or "b.txt" in message


def test_the_largest_32_bit_seed_and_a_large_token_budget_are_fine(tmp_path):
    data = spec_with(grid=[{"architecture": "mixer", "d_model": 32, "seed": 2**31 - 1}], budget={"tokens": 10**13})
    spec, trials = load_trials(write(tmp_path, data))
    assert trials[0].seed == 2**31 - 1 and spec.budget.amount == 1e13
    refused(write(tmp_path, spec_with(budget={"steps": 2**31})), "budget.steps", "32-bit")


# ---------------------------------------------------------------- 4. duplicate keys

def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    text = yaml_text(BASE).replace("  d_model: 32\n", "  d_model: 32\n  d_model: 64\n", 1)
    assert text.count("d_model") == 3
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "d_model: 32" in line) + 1
    refused(write(tmp_path, text), f"duplicate key 'd_model' at line {first + 1} (first at line {first})")


def without_grid() -> str:
    return yaml_text({k: v for k, v in BASE.items() if k != "grid"})


def test_a_merge_key_may_be_overridden(tmp_path):
    text = without_grid() + "grid:\n- &b {architecture: mixer, d_model: 32}\n- {<<: *b, d_model: 64}\n"
    _, trials = load_trials(write(tmp_path, text))
    assert [t.d_model for t in trials] == [32, 64]


# ---------------------------------------------------------------- 5. report axis names

REPORT = [
    ("group_by", {"tables": [{"group_by": ["d_modle"]}]}, "report.tables[0].group_by: 'd_modle'", "did you mean 'd_model'"),
    ("columns", {"tables": [{"columns": "archtecture"}]}, "report.tables[0].columns: 'archtecture'", "did you mean 'architecture'"),
    ("where", {"tables": [{"where": {"options.expnd": 1}}]}, "report.tables[0].where: 'options.expnd'", "did you mean 'options.expand'"),
    ("not-an-axis", {"tables": [{"group_by": ["warmup"]}]}, "report.tables[0].group_by: 'warmup'", "axes: "),
    ("better", {"orderings": [{"claim": "c", "better": {"architectur": "mixer"}, "worse": {"architecture": "llama"}}]},
     "report.orderings[0].better: 'architectur'", "did you mean 'architecture'"),
    ("at", {"orderings": [{"claim": "c", "better": {"architecture": "mixer"}, "worse": {"architecture": "llama"}, "at": ["dmodel"]}]},
     "report.orderings[0].at: 'dmodel'", "did you mean 'd_model'"),
]


@pytest.mark.parametrize("report,where,hint", [(r, w, h) for _, r, w, h in REPORT], ids=[i for i, *_ in REPORT])
def test_report_axis_names_must_be_axes_of_the_trials(tmp_path, report, where, hint):
    message = refused(write(tmp_path, spec_with(report=report)), where, hint)
    assert "'architecture'" in message and "'options.expand'" in message  # the known axes are listed


def test_report_axes_of_the_trials_options_and_objective_options_are_accepted(tmp_path):
    report = {"tables": [{"group_by": ["options.expand", "seed"], "columns": "lr", "where": {"architecture": "mixer"}}],
              "orderings": [{"claim": "c", "better": {"architecture": "mixer"}, "worse": {"architecture": "llama"},
                             "at": ["d_model"]}]}
    load_trials(write(tmp_path, spec_with(report=report)))


# ---------------------------------------------------------------- 6. booleans and quoted numbers

TYPES = [
    ("d_model-true", {"d_model": True}, "grid[0].d_model: must be a whole number, not true"),
    ("heads-false", {"heads": False}, "grid[0].heads: must be a whole number, not false"),
    ("lr-true", {"lr": True}, "grid[0].lr: must be a number, not true"),
    ("d_model-quoted", {"d_model": "128"}, "grid[0].d_model: must be a whole number, not the text '128'"),
    ("weight-decay-inf", {"weight_decay": float("inf")}, "grid[0].weight_decay: must be a finite number"),
]


@pytest.mark.parametrize("change,needle", [(c, n) for _, c, n in TYPES], ids=[i for i, _, _ in TYPES])
def test_booleans_and_text_are_not_numbers(tmp_path, change, needle):
    block = {"architecture": "llama", "d_model": 32, "heads": 4, **change}
    refused(write(tmp_path, spec_with(grid=[block])), needle)


def test_a_float_written_in_yaml_11_style_still_reads_as_a_float(tmp_path):
    text = yaml_text(BASE).replace("lr: 0.001", "lr: 1e-3")  # PyYAML reads 1e-3 (no dot) as text
    assert "lr: 1e-3" in text
    assert load_trials(write(tmp_path, text))[1][0].lr == 1e-3


# ---------------------------------------------------------------- 8. search parameter keys

def test_an_unknown_search_parameter_key_lists_the_known_ones(tmp_path):
    data = spec_with(search={"parameters": {"lr": {"type": "float", "lo": 1e-4, "high": 1e-2}}})
    message = refused(write(tmp_path, data), "search.parameters.lr.lo: unknown key 'lo'")
    for key in ("type", "choices", "low", "high", "log", "step", "when"):
        assert f"'{key}'" in message


# ---------------------------------------------------------------- 9. the file itself

def test_a_latin_1_file_is_refused_with_the_byte_and_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes((yaml_text(BASE) + "description: caf\xe9\n").encode("latin-1"))
    refused(path, "must be UTF-8", "byte 0xe9 at line", kind=AblateError)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_utf_16_and_32_files_are_refused(tmp_path, encoding):
    path = tmp_path / "s.yaml"
    text = yaml_text(BASE)
    path.write_bytes(text.encode(encoding) if encoding != "utf-16-be" else b"\xfe\xff" + text.encode(encoding))
    refused(path, "sweep files must be UTF-8 text", kind=AblateError)


def test_a_utf_8_byte_order_mark_is_fine(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + yaml_text(BASE).encode())
    assert load_spec(path).name == "t"


def test_a_folder_is_refused_naming_a_file_inside(tmp_path):
    write(tmp_path, BASE, "a.yaml")
    refused(tmp_path, "is a folder", str(tmp_path / "a.yaml"), kind=AblateError)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_without_reading_it():
    start = time.monotonic()
    with pytest.raises(AblateError, match="not a regular file"):
        load_spec("/dev/zero")
    assert time.monotonic() - start < patience(5)


def test_a_file_over_the_size_limit_is_refused_with_its_size(tmp_path):
    path = write(tmp_path, yaml_text(BASE) + "# " + "x" * 3_000_000 + "\n")
    refused(path, "sweep file is 3.0 MB; the limit is 2 MB", kind=AblateError)


@pytest.mark.parametrize("text", ["[" * 10_000, "{a: " * 10_000, "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 200))],
                         ids=["lists", "flow-mappings", "block-mappings"])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, text):
    refused(write(tmp_path, text), f"nested more than {MAX_SPEC_DEPTH} levels deep")


def test_an_alias_bomb_is_refused_quickly(tmp_path):
    levels = "".join(f"&{c} [{', '.join(['*' + p] * 9)}], " for p, c in zip("abcdefgh", "bcdefghi"))
    text = yaml_text(BASE) + f"description: [&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], {levels}]\n"
    start = time.monotonic()
    refused(write(tmp_path, text), "more than 100,000 values once its 72 aliases (*name) are expanded")
    assert time.monotonic() - start < patience(10)


def test_a_cyclic_alias_is_refused(tmp_path):
    refused(write(tmp_path, yaml_text(BASE) + "description: &x [*x]\n"), "holds an alias to itself (a cycle)")


def test_a_few_aliases_are_fine(tmp_path):
    text = without_grid() + "grid:\n- &m {architecture: mixer, d_model: &w [32, 64]}\n- {architecture: llama, heads: 4, d_model: *w}\n"
    assert len(load_trials(write(tmp_path, text))[1]) == 4


# ---------------------------------------------------------------- 10. the CLI: exit 2, one message, nothing written

CLI_CASES = {
    "nan-budget": yaml_text(spec_with(budget={"hardware": "cpu"})).replace("budget:\n", "budget:\n  tokens: .nan\n"),
    "empty-grid": yaml_text(spec_with(grid=[])),
    "duplicate-key": "name: t\nname: u\n",
    "deep": "[" * 10_000,
    "report-axis": yaml_text(spec_with(report={"tables": [{"columns": "dmodel"}]})),
}


@pytest.mark.parametrize("text", list(CLI_CASES.values()), ids=list(CLI_CASES))
def test_plan_exits_2_with_one_message_and_writes_nothing(tmp_path, monkeypatch, capsys, text):
    work = tmp_path / "work"
    work.mkdir()
    path = write(tmp_path, text)
    monkeypatch.chdir(work)
    monkeypatch.delenv("ABLATE_DB_URL", raising=False)
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert list(work.iterdir()) == []  # no results/ folder, no DB file


@pytest.mark.parametrize("target", ["folder", "/dev/zero", "latin-1"])
def test_plan_refuses_unreadable_files_with_exit_2(tmp_path, monkeypatch, capsys, target):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    if target == "folder":
        path = str(tmp_path)
    elif target == "latin-1":
        path = str(tmp_path / "s.yaml")
        Path(path).write_bytes(b"name: caf\xe9\n")
    else:
        path = target
        if not os.path.exists(path):
            pytest.skip("needs /dev/zero")
    assert main(["plan", path]) == 2
    assert "error:" in capsys.readouterr().err
    assert list(work.iterdir()) == []
