"""Claims as a sweep writes them: a smallest effect of interest (`sesoi`), parity claims (`matches` / `within`), and
sides that would compare a configuration with itself, each mistake refused in one message naming the field."""

from __future__ import annotations

import copy

import pytest

from ablate.config import expand_grid, parse_spec
from ablate.config.errors import SpecError

BASE = {
    "name": "claims",
    "dataset": {"source": "ablate:tinystories-sample"},
    "budget": {"steps": 10},
    "defaults": {"layers": 1, "context": 64, "lr": 1e-3, "batch_size": 4, "d_model": 32},
    "grid": [{"architecture": "mixer", "d_model": [16, 32]}, {"architecture": "llama", "heads": 4, "d_model": [16, 32]}],
    "report": {"orderings": [{"claim": "mixer beats llama", "better": {"architecture": "mixer"},
                              "worse": {"architecture": "llama"}, "at": ["d_model"]}]},
}


def with_claim(**claim) -> dict:
    data = copy.deepcopy(BASE)
    data["report"]["orderings"] = [{"claim": "c", "better": {"architecture": "mixer"}, **claim}]
    return data


def refused(data: dict, *needles: str) -> str:
    with pytest.raises((SpecError, ValueError)) as caught:
        expand_grid(parse_spec(data))
    message = str(caught.value)
    for needle in needles:
        assert needle in message, message
    return message


def test_a_parity_claim_is_kept_as_its_matched_side_and_its_within():
    spec = parse_spec(with_claim(matches={"architecture": "llama"}, within=0.02))
    (order,) = spec.report.orderings
    assert order.worse == {"architecture": "llama"} and order.sesoi == 0.02 and order.parity is True
    assert parse_spec(spec.model_dump(mode="json")) == spec  # a stored spec reads back as it was
    plain = parse_spec(BASE)
    assert "parity" not in plain.report.orderings[0].model_dump()  # an ordering's identity is what it was
    assert plain.fingerprint() != spec.fingerprint()
    expand_grid(spec)


@pytest.mark.parametrize("claim,needle", [
    ({"matches": {"architecture": "llama"}}, "`matches` needs `within`"),
    ({"worse": {"architecture": "llama"}, "within": 0.02}, "`within` goes with `matches`"),
    ({"worse": {"architecture": "llama"}, "matches": {"architecture": "llama"}, "within": 0.02},
     "give `worse` (an ordering) or `matches` (a parity claim), not both"),
    ({"matches": {"architecture": "llama"}, "within": 0.02, "sesoi": 0.01}, "leave out `sesoi`"),
    ({"matches": {"architecture": "llama"}, "within": -0.02}, "sesoi"),
    ({"worse": {"architecture": "llama"}, "sesoi": 0}, "sesoi"),
], ids=["no-within", "within-alone", "both", "sesoi-too", "negative", "zero-sesoi"])
def test_a_malformed_claim_is_refused_naming_the_field(claim, needle):
    refused(with_claim(**claim), needle)


def test_sides_that_share_a_configuration_are_refused_naming_both():
    """`better: {architecture: mixer}, worse: {d_model: 32}` compares mixer d 32 with itself (p = 1, counted in
    Holm's m) and drops llama d 32: refused before anything is registered."""
    message = refused(with_claim(worse={"d_model": 32}),
                      "report.orderings[0]: better {architecture: mixer} and worse {d_model: 32} both match 1 "
                      "trial(s) (e.g. architecture=mixer d_model=32)", "compared with themselves")
    assert "give the sides values of one axis that tell them apart" in message
    refused(with_claim(matches={"d_model": 16}, within=0.02), "and matches {d_model: 16} both match 1 trial(s)")
