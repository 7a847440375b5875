"""Sweep specs: expansion, fingerprints, and clear errors for malformed specs."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ablate.config.errors import SpecError
from ablate.config import count_trials, expand_grid, load_spec, load_trials, parse_duration, parse_spec, reference_for

REPO = Path(__file__).resolve().parents[2]

BASE = {
    "name": "t",
    "dataset": {"source": "ablate:tinystories-sample"},
    "budget": {"wall_clock": "10s"},
    "defaults": {"layers": 2, "context": 64, "lr": 1e-3, "batch_size": 4},
    "grid": [
        {"architecture": "llama", "heads": 4, "d_model": [32, 64]},
        {"architecture": "mixer", "d_model": 32},
    ],
}


def spec_with(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def write(tmp_path: Path, data: dict | str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


# ---------------------------------------------------------------- expansion


def test_product_of_list_valued_keys_over_defaults():
    spec = parse_spec(spec_with())
    trials = expand_grid(spec)
    assert [(t.architecture, t.d_model) for t in trials] == [("llama", 32), ("llama", 64), ("mixer", 32)]
    assert all(t.layers == 2 and t.context == 64 for t in trials)
    assert trials[2].heads is None


def test_zip_moves_axes_together_and_seeds_repeat():
    block = {"architecture": "llama", "heads": 2, "zip": {"d_model": [32, 64, 128], "batch_size": [8, 4, 2]}, "seeds": 2}
    trials = expand_grid(parse_spec(spec_with(grid=[block])))
    assert [(t.d_model, t.batch_size, t.seed) for t in trials] == [
        (32, 8, 0), (32, 8, 1), (64, 4, 0), (64, 4, 1), (128, 2, 0), (128, 2, 1)
    ]


def test_list_valued_options_are_axes():
    block = {"architecture": "hybrid", "heads": 4, "d_model": 32, "options": {"placement": ["sequential", "parallel"]}}
    trials = expand_grid(parse_spec(spec_with(grid=[block])))
    assert [t.options["placement"] for t in trials] == ["sequential", "parallel"]
    assert trials[0].fingerprint() != trials[1].fingerprint()


def test_duplicate_trials_collapse_to_one():
    grid = [{"architecture": "mixer", "d_model": 32}, {"architecture": "mixer", "d_model": [32, 64]}]
    assert len(expand_grid(parse_spec(spec_with(grid=grid)))) == 2


def test_fingerprint_is_stable_across_key_order_formatting_and_processes(tmp_path):
    a = write(tmp_path, BASE, "a.yaml")
    reordered = {k: BASE[k] for k in reversed(list(BASE))}
    reordered["defaults"] = {"batch_size": 4, "lr": 0.001, "context": 64, "layers": 2}  # 1e-3 written differently
    b = write(tmp_path, yaml.safe_dump(reordered, default_flow_style=True), "b.yaml")
    fa = [t.fingerprint() for t in load_trials(a)[1]]
    fb = [t.fingerprint() for t in load_trials(b)[1]]
    assert fa == fb
    code = f"from ablate.config import load_trials; print(*[t.fingerprint() for t in load_trials({str(a)!r})[1]])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.split() == fa


def test_changing_a_field_changes_the_fingerprint():
    t1 = expand_grid(parse_spec(spec_with()))[0]
    t2 = expand_grid(parse_spec(spec_with(defaults={**BASE["defaults"], "lr": 2e-3})))[0]
    assert t1.fingerprint() != t2.fingerprint()


def test_the_curves_x_axis_is_seconds_as_on_the_dashboard_and_hours_still_reads_with_the_same_identity():
    """`report.curves` names the x kinds of `at` and the dashboard; `hours`, its name before, reads as seconds,
    and a sweep keeps the fingerprint it was registered with (the smoke sweep's, as main had it before)."""
    old = parse_spec(spec_with(report={"curves": ["hours", "steps"]}))
    new = parse_spec(spec_with(report={"curves": ["seconds", "steps"]}))
    assert old.report.curves == new.report.curves == ("seconds", "steps")
    assert old.fingerprint() == new.fingerprint() != parse_spec(spec_with(report={"curves": ["flops"]})).fingerprint()
    assert load_spec(REPO / "sweeps" / "smoke.yaml").fingerprint() == "8ba1521712f88537"  # registered DBs match it
    with pytest.raises(SpecError, match="curves"):
        parse_spec(spec_with(report={"curves": ["minutes"]}))
    from ablate.config.units import X_KINDS
    from ablate.report.curves import X_LABELS

    assert set(X_LABELS) == set(X_KINDS)  # every x kind has its axis label in the report's figures


def test_budget_parsing():
    assert parse_duration("12h") == 43200
    assert parse_duration("2h15m") == 8100
    assert parse_duration("45s") == 45
    spec = parse_spec(spec_with(budget={"tokens": "100M"}))
    assert spec.budget.kind == "tokens" and spec.budget.amount == 1e8


def test_relative_dataset_path_is_relative_to_the_spec_file(tmp_path, tinystories):
    (tmp_path / "sweeps").mkdir()
    path = write(tmp_path / "sweeps", spec_with(dataset={"source": "../tinystories.txt"}))
    assert load_spec(path).dataset.source == str(tinystories.resolve())


def test_reference_matches_most_specific():
    refs = [{"match": {"architecture": "llama"}, "train": 2.0}, {"match": {"architecture": "llama", "d_model": 64}, "train": 1.5}]
    spec = parse_spec(spec_with(reference=refs))
    trials = expand_grid(spec)
    assert reference_for(spec, trials[0]).train == 2.0
    assert reference_for(spec, trials[1]).train == 1.5
    assert reference_for(spec, trials[2]) is None


# ---------------------------------------------------------------- the study sweeps


@pytest.mark.parametrize("path", sorted((REPO / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sweep_file_plans(path):
    spec, trials = load_trials(path)
    assert spec.name == path.stem
    assert trials
    for ref in spec.reference:
        assert any(ref.matches(t) for t in trials)


def test_widths_sweep_has_the_12_trials_of_the_tables_with_their_batch_sizes():
    _, trials = load_trials(REPO / "sweeps" / "tinystories-widths.yaml")
    got = sorted((t.architecture, t.options.get("expand", 1), t.d_model, t.layers, t.batch_size) for t in trials)
    assert got == sorted([
        ("llama", 1, 128, 8, 32), ("llama", 1, 256, 8, 32), ("llama", 1, 512, 8, 32), ("llama", 1, 1024, 8, 8),
        ("mixer", 1, 256, 8, 16), ("mixer", 1, 512, 8, 16), ("mixer", 1, 1024, 8, 16), ("mixer", 1, 2048, 8, 16),
        ("mixer", 1, 1024, 4, 32),
        ("mixer", 2, 256, 8, 16), ("mixer", 2, 512, 8, 16), ("mixer", 2, 1024, 8, 16),
    ])


# ---------------------------------------------------------------- malformed specs

MALFORMED = [
    # (id, spec data or raw YAML, substrings the error must contain)
    ("heads-do-not-divide", spec_with(grid=[{"architecture": "llama", "heads": 3, "d_model": 32}]),
     ["grid[0].heads", "heads=3 does not divide d_model=32", "choose heads from"]),
    ("heads-from-defaults", spec_with(defaults={**BASE["defaults"], "heads": 5}, grid=[{"architecture": "llama", "d_model": 32}]),
     ["defaults.heads", "does not divide"]),
    ("unknown-architecture", spec_with(grid=[{"architecture": "lama", "d_model": 32}]),
     ["grid[0].architecture", "unknown architecture 'lama'", "did you mean 'llama'"]),
    ("unknown-objective", spec_with(defaults={**BASE["defaults"], "objective": "clmm"}),
     ["defaults.objective", "did you mean 'clm'"]),
    ("misspelled-grid-key", spec_with(grid=[{"architecture": "mixer", "d_modle": 32}]),
     ["grid[0]", "unknown key 'd_modle'", "did you mean 'd_model'"]),
    ("seeds-in-defaults", spec_with(defaults={**BASE["defaults"], "seeds": 2}),
     ["defaults.seeds", "goes in each grid block, not in defaults"]),
    ("misspelled-top-level-key", {**spec_with(), "budgett": {"wall_clock": "1h"}},
     ["unknown key 'budgett'", "did you mean 'budget'"]),
    ("misspelled-nested-key", spec_with(dataset={"sorce": "x"}),
     ["dataset.sorce", "did you mean 'source'"]),
    ("missing-dataset", {k: v for k, v in spec_with().items() if k != "dataset"}, ["dataset: required key is missing"]),
    ("missing-budget", {k: v for k, v in spec_with().items() if k != "budget"}, ["budget: required key is missing"]),
    ("missing-trial-field", spec_with(defaults={"layers": 2, "lr": 1e-3, "batch_size": 4}),
     ["required trial field 'context'"]),
    ("negative-d-model", spec_with(grid=[{"architecture": "mixer", "d_model": -8}]),
     ["grid[0].d_model", "greater than 0", "-8"]),
    ("zero-layers", spec_with(defaults={**BASE["defaults"], "layers": 0}), ["defaults.layers", "greater than 0"]),
    ("lr-not-a-number", spec_with(defaults={**BASE["defaults"], "lr": "fast"}), ["defaults.lr", "'fast'"]),
    ("bad-duration", spec_with(budget={"wall_clock": "12 hours"}), ["budget", "'12 hours' is not a duration", "2h15m"]),
    ("wall-clock-past-a-year", spec_with(budget={"wall_clock": "99999999999999999999d"}), ["budget", "over a year"]),
    ("two-budgets", spec_with(budget={"wall_clock": "1h", "steps": 10}), ["budget", "exactly one of"]),
    ("no-budget-kind", spec_with(budget={"hardware": "cpu"}), ["budget", "exactly one of"]),
    ("bad-hardware-name", spec_with(budget={"steps": 5, "hardware": "RTX 3060"}), ["budget", "lowercase name"]),
    ("zip-unequal-lengths", spec_with(grid=[{"architecture": "mixer", "zip": {"d_model": [32, 64], "batch_size": [4]}}]),
     ["grid[0].zip", "equal lengths"]),
    ("zip-and-key-twice", spec_with(grid=[{"architecture": "mixer", "d_model": 32, "zip": {"d_model": [32], "lr": [1e-3]}}]),
     ["grid[0].zip.d_model", "also set outside zip"]),
    ("bad-seeds", spec_with(grid=[{"architecture": "mixer", "d_model": 32, "seeds": -1}]), ["grid[0].seeds", "positive count"]),
    ("negative-seed", spec_with(grid=[{"architecture": "mixer", "d_model": 32, "seed": -1}]),
     ["grid[0].seed", "greater than or equal to 0"]),
    ("sweep-level-key-in-block", spec_with(grid=[{"architecture": "mixer", "d_model": 32, "budget": {"steps": 1}}]),
     ["grid[0].budget", "set once per sweep"]),
    ("grid-block-not-mapping", spec_with(grid=["mixer"]), ["grid[0]", "mapping"]),
    ("bad-name", spec_with(name="My Sweep"), ["name", "should match pattern"]),
    ("unknown-packing", spec_with(dataset={"source": "x", "packing": "stack"}), ["dataset.packing", "'pad', 'concat', 'chunk' or 'documents'"]),
    ("eval-fraction-out-of-range", spec_with(eval={"at": [0.5, 1.5]}), ["eval.at", "strictly between 0 and 1"]),
    ("kv-heads-not-dividing", spec_with(grid=[{"architecture": "llama", "d_model": 32, "heads": 4, "kv_heads": 3}]),
     ["kv_heads=3 must divide heads=4"]),
    ("reference-matches-nothing", spec_with(reference=[{"match": {"d_model": 999}, "train": 1.0}]),
     ["reference[0].match", "matches no trial"]),
    ("search-unknown-param", spec_with(search={"parameters": {"head": {"type": "categorical", "choices": [2, 4]}}}),
     ["search.parameters", "did you mean 'heads'"]),
    ("search-log-with-zero-low", spec_with(search={"parameters": {"lr": {"type": "float", "low": 0, "high": 1, "log": True}}}),
     ["search.parameters.lr", "low > 0"]),
    ("retrieval-one-candidate", spec_with(retrieval={"pairs": {"source": "p.jsonl"}, "candidates": [1, 32]}),
     ["retrieval.candidates", ">= 2"]),
    ("retrieval-index-from-start", spec_with(retrieval={"pairs": {"source": "p.jsonl"}, "index": 3}),
     ["retrieval.index", "-1 (last token) or -2"]),
    ("top-level-not-mapping", "- just\n- a list\n", ["top level must be a mapping"]),
    ("invalid-yaml", "name: t\ngrid: [\n", ["not valid YAML", "line"]),
    ("options-not-mapping", spec_with(grid=[{"architecture": "mixer", "d_model": 32, "options": "expand"}]),
     ["grid[0].options", "mapping"]),
]


@pytest.mark.parametrize("data,needles", [(d, n) for _, d, n in MALFORMED], ids=[i for i, _, _ in MALFORMED])
def test_malformed_spec_gets_a_clear_error(tmp_path, data, needles):
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_trials(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"


def test_a_mistake_in_defaults_is_said_once_for_every_trial_it_breaks_with_where_lists_go(tmp_path):
    path = write(tmp_path, spec_with(defaults={**BASE["defaults"], "layers": [1, 2]}))  # 3 trials
    with pytest.raises(SpecError) as info:
        load_trials(path)
    message = str(info.value)
    assert message.count("defaults.layers") == 1 and "1 problem in sweep spec" in message, message
    assert "a list of values is a grid axis: put it in a grid block, e.g. grid: [{layers: [1, 2]}]" in message
    assert "[trial architecture=llama, d_model=32, heads=4; and 2 more trial(s)]" in message


def test_a_sweep_name_has_one_limit_on_every_engine_and_automatic_names_are_cut_with_a_hash(tmp_path):
    from ablate.config.load import override_spec
    from ablate.config.sweep import NAME_MAX
    from ablate.store.schema import Sweep

    assert Sweep.__table__.c.name.type.length == NAME_MAX  # the spec's limit is the column's, on every engine
    path = write(tmp_path, spec_with())
    with pytest.raises(SpecError, match="name: String should have at most 200 characters"):
        override_spec(path, {"name": "a" * 250})
    sets = [f"defaults.options.k{i}=value-{i}" for i in range(59)]
    names = {override_spec(path, {"set": sets[:n]}).name for n in (58, 59)}
    assert len(names) == 2 and all(len(n) == NAME_MAX and n.startswith("t-defaults-options-k0-value-0") for n in names)
    long_said = str(pytest.raises(SpecError, override_spec, path, {"set": ["x" * 5000]}).value)
    assert len(long_said) < 1000 and "xxx..." in long_said  # the argument echoed, cut


def test_grid_over_the_limit_is_refused_with_its_count():
    block = {"architecture": "mixer", "d_model": list(range(8, 8 + 8 * 200, 8)), "lr": [1e-3 * i for i in range(1, 61)]}
    spec = parse_spec(spec_with(grid=[block]))
    assert count_trials(spec) == 12_000
    with pytest.raises(SpecError, match="expands to 12,000 trials"):
        expand_grid(spec)
    assert len(expand_grid(spec, max_trials=12_000)) == 12_000


def test_all_problems_are_reported_at_once(tmp_path):
    grid = [{"architecture": "llama", "heads": 3, "d_model": 32}, {"architecture": "mixr", "d_model": 32}]
    with pytest.raises(SpecError) as info:
        load_trials(write(tmp_path, spec_with(grid=grid)))
    assert len(info.value.problems) == 2


def _spec_with_source(folder: Path, source: str) -> Path:
    data = {"name": "local", "dataset": {"source": source}, "budget": {"steps": 5},
            "defaults": {"architecture": "mixer", "d_model": 32, "layers": 2, "context": 32, "lr": 1e-3, "batch_size": 2}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_source_naming_a_file_beside_the_sweep_or_in_the_working_directory_is_local(tmp_path, monkeypatch):
    sweeps, elsewhere = tmp_path / "sweeps", tmp_path / "work"
    spec_path = _spec_with_source(sweeps, "stories.txt")
    (sweeps / "stories.txt").write_text("a story\n<|endoftext|>\n")
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_spec(spec_path).dataset.source == str(sweeps / "stories.txt")  # beside the sweep file first
    (sweeps / "stories.txt").unlink()
    (elsewhere / "stories.txt").write_text("a story\n<|endoftext|>\n")
    assert load_spec(spec_path).dataset.source == str(elsewhere / "stories.txt")  # then the working directory
    (elsewhere / "corpus").mkdir()
    assert load_spec(_spec_with_source(sweeps, "corpus")).dataset.source == str(elsewhere / "corpus")  # a folder


def test_a_missing_file_source_is_refused_with_the_paths_tried_and_a_hub_id_is_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec_path = _spec_with_source(tmp_path / "sweeps", "stories.txt")
    with pytest.raises(SpecError) as info:
        load_spec(spec_path)
    text = str(info.value)
    assert "dataset.source" in text and str(tmp_path / "sweeps" / "stories.txt") in text
    assert str(tmp_path / "stories.txt") in text
    for path_like in ("data/shards/*.parquet", "./corpus", "../x/y.jsonl"):
        with pytest.raises(SpecError, match="dataset.source: no file or folder"):
            load_spec(_spec_with_source(tmp_path / "sweeps", path_like))
    assert load_spec(_spec_with_source(tmp_path / "sweeps", "roneneldan/TinyStories")).dataset.source == \
        "roneneldan/TinyStories"


def test_plan_refuses_a_missing_local_source_and_writes_nothing(tmp_path, monkeypatch):
    from ablate.cli import main

    monkeypatch.chdir(tmp_path)
    spec_path = _spec_with_source(tmp_path / "sweeps", "stories.txt")
    assert main(["plan", str(spec_path)]) == 2
    assert main(["sweep", "register", str(spec_path)]) == 2
    assert not (tmp_path / "results").exists()  # no DB file, no folder
