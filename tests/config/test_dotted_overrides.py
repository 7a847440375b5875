"""Dotted overrides (`defaults.lr=1e-3`, `grid.0.d_model=[64,128]`): any field of a sweep file set from the command
line, typed as YAML, checked as the file would be, and naming the sweep after them."""

from __future__ import annotations

import pytest
import yaml

from ablate.cli import main
from ablate.config import load_trials
from ablate.config.dotted import assign, parse_assignment
from ablate.config.errors import SpecError
from ablate.config.overrides import apply_overrides
from tests.helpers import one_seed_smoke

SMOKE = one_seed_smoke()  # name smoke, 4 trials: grid[0] mixer, grid[1] llama, each d_model [64, 128]


def smoke() -> dict:
    return yaml.safe_load(SMOKE.read_text())


def with_set(*assignments: str, **flags) -> dict:
    return apply_overrides(smoke(), {"set": list(assignments), **flags})


def test_values_are_read_as_yaml_with_exponents_as_numbers():
    assert parse_assignment("defaults.lr=1e-3") == ("defaults.lr", 0.001)
    assert parse_assignment("grid.0.d_model=[64,128]") == ("grid.0.d_model", [64, 128])
    assert parse_assignment("x=[1e-3, 3e-4]")[1] == [0.001, 0.0003]
    assert parse_assignment("x=-2E+3")[1] == -2000.0
    assert parse_assignment("x=true")[1] is True and parse_assignment("x=null")[1] is None
    assert parse_assignment("budget={steps: 100}")[1] == {"steps": 100}
    assert parse_assignment("x=h100")[1] == "h100" and parse_assignment("x='1e-3'")[1] == "1e-3"


def test_a_list_index_and_missing_mappings_are_set_in_place():
    data = {"grid": [{"d_model": 64}, {"d_model": 32}], "defaults": None}
    assign(data, "grid.1.d_model", [32, 48])
    assign(data, "defaults.options.heads_per_dim", 2)  # null, then missing: both become mappings
    assign(data, "report.min_steps", 10)
    assert data == {"grid": [{"d_model": 64}, {"d_model": [32, 48]}], "defaults": {"options": {"heads_per_dim": 2}},
                    "report": {"min_steps": 10}}


def test_an_override_changes_only_the_copy_and_says_what_changed():
    data = smoke()
    changed = apply_overrides(data, {"set": ["defaults.lr=1e-3", "budget.steps=7"]})
    assert changed["defaults"]["lr"] == 0.001 and changed["budget"] == {"steps": 7, "hardware": "cpu"}
    assert data == smoke()
    assert changed["overrides"] == ["defaults.lr: 0.001 (override)", "budget.steps: 7 (override)"]


@pytest.mark.parametrize(("assignment", "says"), [
    ("grid.2.d_model=64", "grid is a list of 2 (indices 0 to 1); '2' is not one of them. To add or remove items, "
                          "set the whole list, e.g. grid=[...]"),
    ("grid.first.d_model=64", "grid is a list of 2 (indices 0 to 1); 'first' is not one of them"),
    ("defaults.lr.warm=1", "defaults.lr is 0.003, neither a mapping nor a list, so it has no 'warm'; set defaults.lr "
                           "itself, e.g. defaults.lr={warm: ...}"),
    ("name.x=1", "name is 'smoke', neither a mapping nor a list"),
])
def test_a_path_past_a_list_or_through_a_value_is_refused_by_name(assignment, says):
    with pytest.raises(SpecError) as exc:
        with_set(assignment)
    assert f"override {assignment.split('=')[0]}: {says}" in str(exc.value)


@pytest.mark.parametrize("text", ["defaults.lr", "=3", "defaults..lr=3", "grid.0.=4"])
def test_an_assignment_without_a_key_and_value_says_the_form(text):
    with pytest.raises(SpecError, match="not of the form KEY=VALUE, a dotted path and a YAML value, e.g. defaults.lr="):
        parse_assignment(text)


def test_unknown_keys_are_refused_by_the_files_own_checks_naming_the_override():
    with pytest.raises(SpecError) as exc:
        load_trials(SMOKE, overrides={"set": ["defaults.lrr=1e-3"]})
    assert "with defaults.lrr=1e-3:" in str(exc.value)
    assert "defaults: unknown key 'lrr' (did you mean 'lr'?)" in str(exc.value)
    with pytest.raises(SpecError, match=r"reprot: unknown key 'reprot' \(did you mean 'report'\?\)"):
        load_trials(SMOKE, overrides={"set": ["reprot.min_steps=5"]})
    with pytest.raises(SpecError, match=r"budget.stepz: unknown key 'stepz' \(did you mean 'steps'\?\)"):
        load_trials(SMOKE, overrides={"set": ["budget.stepz=5"]})


def test_overrides_name_the_sweep_after_themselves_unless_named():
    assert with_set("defaults.lr=1e-3")["name"] == "smoke-defaults-lr-0-001"
    assert with_set("grid.0.d_model=[64,96]", budget="steps=7")["name"] == "smoke-grid-0-d_model-64-96-budget-steps-7"
    assert with_set("defaults.lr=1e-3", name="mine")["name"] == "mine"
    assert with_set("defaults.lr=1e-3", "name=mine")["name"] == "mine"  # a dotted name is the name, as --name


def test_an_override_that_changes_nothing_keeps_the_sweeps_name():
    """The file's own value (defaults.lr 0.003, budget steps=100) is the same sweep: renamed, its trials would
    train again under another name."""
    same = with_set("defaults.lr=3e-3", "defaults.layers=2", budget="steps=100")
    assert same["name"] == "smoke" and "overrides" not in same, same.get("overrides")
    assert with_set("defaults.lr=3e-3", "defaults.layers=3")["name"] == "smoke-defaults-layers-3"
    assert with_set("defaults.precision=fp32", "defaults.layers=true")["name"] == "smoke-defaults-layers-true"


def test_an_override_equals_editing_the_file_by_hand(tmp_path):
    edited = smoke()
    edited["defaults"]["lr"] = 1.0e-3
    edited["grid"][0]["d_model"] = [64, 96]
    edited["report"]["min_steps"] = 50
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    sets = ["defaults.lr=1e-3", "grid.0.d_model=[64,96]", "report.min_steps=50"]
    by_hand, trials_by_hand = load_trials(path)
    spec, trials = load_trials(SMOKE, overrides={"set": sets})
    assert [t.fingerprint() for t in trials] == [t.fingerprint() for t in trials_by_hand]
    assert spec.report.min_steps == 50 and spec.name != "smoke"
    named = load_trials(SMOKE, overrides={"set": sets, "name": "smoke"})[0]
    assert named.fingerprint() == by_hand.fingerprint()  # the same sweep, once it has the file's name


def test_plan_takes_key_value_arguments_after_the_spec(capsys):
    assert main(["plan", str(SMOKE), "defaults.lr=1e-3", "grid.1.d_model=[32,48]", "--budget", "steps=7"]) == 0
    out = capsys.readouterr().out
    assert "sweep smoke-defaults-lr-0-001-grid-1-d_model-32-48-budget-steps-7" in out
    assert "override: defaults.lr: 0.001 (override)" in out and "4 trials; budget per trial: steps 7" in out
    assert main(["plan", str(SMOKE), "defaults.lr"]) == 2
    err = capsys.readouterr().err
    assert "override 'defaults.lr': not of the form KEY=VALUE" in err and "Usage: ablate plan" in err
