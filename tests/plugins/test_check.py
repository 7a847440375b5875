"""The model contract as shipped (ablate.plugins.check, `ablate check`): every built-in case that
tests/models/test_causality.py checks keeps it, a deliberately broken plugin (tests/plugins/leaky.py) fails it
where it is broken, and the command says so with its exit code."""

from __future__ import annotations


import pytest
import torch

from ablate.cli import main
from ablate.config import registry
from ablate.config.errors import AblateError
from ablate.models import mod_options
from ablate.plugins.check import Finding, check_trial, small_trial
from tests.helpers import REPO
from tests.models.test_causality import ACCEPTED, make_trial

LEAKY = "leaky-test"
EVERY = ["shape", "causal (eval)", "causal (train)", "rows independent", "param count", "training", "state dict", "ddp"]


@pytest.fixture
def leaky() -> str:
    """tests/plugins/leaky.py registered as an architecture for one test, as a plugin would be."""
    registry.families()  # the built-ins first
    registry.register_architecture(LEAKY, "tests.plugins.leaky", "tests.plugins.leaky", "test: reads the next token")
    yield LEAKY
    registry.FAMILIES.entries.pop(LEAKY)


def by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in findings}


# ---------------------------------------------------------------- the built-in zoo keeps the contract


@pytest.mark.parametrize(("family", "option", "value"), ACCEPTED)
def test_every_built_in_case_keeps_the_contract(family, option, value):
    """Every property, for every option value tests/models checks (79 cases in about 6 s on 2 cores)."""
    findings = check_trial(make_trial(family, option, value))
    assert [f.name for f in findings] == EVERY
    assert [f for f in findings if f.ok is False] == []
    assert by_name(findings)["param count"].ok, "every built-in family has a closed-form parameter count"


def test_only_mod_is_excused_from_train_mode_causality():
    skipped = {name for name, family in registry.families().items() if family.source.kind == "builtin"
               if by_name(check_trial(small_trial(name)))["causal (train)"].ok is None}
    assert skipped == {"mod"}


def test_mods_excuse_is_true_its_training_router_reads_later_tokens(monkeypatch):
    """Without its declaration, mod's top-k training router fails the train-mode check (so the check can fail)."""
    monkeypatch.setattr(mod_options, "TRAIN_MODE_CAUSAL", True)
    causal = by_name(check_trial(small_trial("mod")))["causal (train)"]
    assert causal.ok is False and causal.detail.startswith("logits at position ")


def test_fast_runs_what_registering_a_sweep_needs():
    assert [f.name for f in check_trial(small_trial("mixer"), fast=True)] == ["shape", "causal (eval)",
                                                                              "causal (train)", "rows independent"]


def test_ddp_keeps_the_ranks_equal():
    """Two gloo processes, one step each on its own batch (about 7 s, most of it the children importing torch)."""
    ddp = by_name(check_trial(small_trial("llama"), ddp=True))["ddp"]
    assert ddp.ok is True, ddp.detail


def test_ddp_is_skipped_unless_asked():
    assert by_name(check_trial(small_trial("mixer")))["ddp"] == Finding("ddp", None, "pass --ddp")


def test_threads_and_the_callers_rng_are_restored():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(123)
        state = torch.get_rng_state()
        check_trial(small_trial("mixer"), fast=True)
        assert torch.get_num_threads() == 2
        assert torch.equal(torch.get_rng_state(), state)
    finally:
        torch.set_num_threads(threads)


def test_small_trial_names_the_architecture_and_the_unknown_option():
    with pytest.raises(AblateError, match=r"'mixer'.*unknown mixer option 'kernal' \(did you mean 'kernel'\?\)"):
        small_trial("mixer", {"kernal": 3})
    with pytest.raises(AblateError, match=r"unknown architecture 'mixr' \(did you mean 'mixer'\?\)"):
        small_trial("mixr")


def test_the_cli_loads_a_plugin_file_before_checking_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["check", "shift-mixer", "--plugin", "examples/plugins/shift_mixer.py", "--options",
                 '{"kernel": 2}']) == 0
    out = capsys.readouterr().out
    assert "PASS causal (eval)" in out and "PASS param count" in out


# ---------------------------------------------------------------- a broken plugin fails where it is broken


def test_a_leak_fails_causality_naming_the_first_leaking_position(leaky):
    findings = by_name(check_trial(small_trial(leaky)))
    causal = findings["causal (eval)"]
    assert causal.ok is False
    assert causal.detail.startswith("logits at position 0 change when tokens after it change"), causal.detail
    assert findings["causal (train)"].ok is False
    assert findings["shape"].ok and findings["rows independent"].ok and findings["training"].ok


def test_the_same_model_without_the_peek_passes(leaky):
    assert [f for f in check_trial(small_trial(leaky, {"peek": 0})) if f.ok is False] == []


def test_a_leak_is_not_required_away_for_an_objective_that_reads_whole_documents(leaky):
    causal = by_name(check_trial(small_trial(leaky, objective="classification")))["causal (eval)"]
    assert causal.ok is None
    assert causal.detail.startswith("not required: objective 'classification' reads whole documents (logits at "
                                    "position 0")


def test_without_a_closed_form_the_param_count_is_skipped(leaky):
    assert by_name(check_trial(small_trial(leaky, {"peek": 0})))["param count"] == Finding(
        "param count", None, "no closed form given (the options module has no param_count(trial, vocab_size))")


def test_a_wrong_shape_fails_shape_naming_expected_and_got(leaky):
    shape, *rest = check_trial(small_trial(leaky, {"shape_bug": True}))
    assert shape.name == "shape" and shape.ok is False
    assert "expected logits (B, T, V) = (3, 8, 32), got (3, 8, 33)" in shape.detail
    assert {f.ok for f in rest} == {None}


def test_a_builder_that_raises_fails_shape_with_its_message(leaky):
    shape, *rest = check_trial(small_trial(leaky, {"explode": True}))
    assert shape == Finding("shape", False, "build raised ValueError: leaky-test was told to explode")
    assert [(f.name, f.ok, f.detail) for f in rest] == [(n, None, "not run: the shape check failed") for n in EVERY[1:]]


# ---------------------------------------------------------------- ablate check


def test_cli_passes_a_built_in_family(capsys):
    assert main(["check", "mixer"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "PASS shape  (B, T, V) = (3, 8, 32), finite, with trainable parameters" in out
    assert "SKIP ddp  pass --ddp" in out
    assert sum(line.startswith("PASS ") for line in out) == 7
    assert out[-1] == "mixer: 7 passed, 0 failed, 1 skipped"


def test_cli_sizes(capsys):
    assert main(["check", "llama", "--d-model", "8", "--layers", "1", "--heads", "1", "--context", "12"]) == 0
    assert "PASS shape  (B, T, V) = (3, 12, 32)" in capsys.readouterr().out


def test_cli_fails_a_leak_naming_the_position(capsys, tmp_path):
    """The check runs in a child process: the plugin is given as --plugin (here a file registering leaky.py)."""
    leaky = LEAKY
    (tmp_path / "leaky_plugin.py").write_text(
        f"import ablate\nablate.architecture({LEAKY!r}, options='tests.plugins.leaky', build='tests.plugins.leaky')\n")
    assert main(["check", leaky, "--plugin", str(tmp_path / "leaky_plugin.py")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("FAIL causal (eval)  logits at position 0 change") for line in out), out
    assert out[-1] == f"{leaky}: 4 passed, 2 failed (causal (eval), causal (train)), 2 skipped"


def test_cli_unknown_architecture(capsys):
    assert main(["check", "nosuch"]) == 2
    assert "unknown architecture 'nosuch'" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "said"), [("{bad", "--options is not JSON"),
                                               ("[1]", "--options must be a JSON object"),
                                               ('{"kernal": 3}', "unknown mixer option 'kernal'")])
def test_cli_bad_options(capsys, options, said):
    assert main(["check", "mixer", "--options", options]) == 2
    err = capsys.readouterr().err
    assert said in err and ("--options '{\"kernel\": 3}'" in err or "kernal" in said)
