"""The race of an adaptive sweep, on simulated data with known answers: its boundaries are the published ones and
spend what they should, a race under no difference says "holds" or "reversed" at most alpha of the time (plus
sampling error) while testing at alpha after every seed does not, and each decision reads what it should."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from ablate.results import calibration, stats
from ablate.results.race import FUTILITY, MAX_REACHED, Decision, Look, RaceDesign, decide, naive
from ablate.results.sequential import boundaries, conditional_power, information_fraction, spent
from bench.race import draw, looks_of, simulate

# ldbounds / gsDesign, two-sided alpha 0.05, 5 equally spaced looks (Jennison & Turnbull 2000, ch. 7)
OBRIEN_FLEMING_5 = (4.8769, 3.3569, 2.6803, 2.2898, 2.0310)
POCOCK_5 = (2.4380, 2.4268, 2.4102, 2.3966, 2.3860)


def test_boundaries_are_the_published_lan_demets_ones():
    looks = [0.2, 0.4, 0.6, 0.8, 1.0]
    assert boundaries(looks, 0.05, "obrien-fleming") == pytest.approx(OBRIEN_FLEMING_5, abs=2e-4)
    assert boundaries(looks, 0.05, "pocock") == pytest.approx(POCOCK_5, abs=2e-4)
    assert boundaries([1.0], 0.05, "pocock") == pytest.approx((1.959964,), abs=1e-5)  # one look: the fixed test


@pytest.mark.parametrize("spending", ["pocock", "obrien-fleming"])
def test_brownian_paths_cross_each_boundary_first_as_often_as_its_spending_allows(spending):
    fractions = [0.15, 0.4, 0.55, 1.0]  # unequal looks: the spending, not the count, sets each boundary
    bounds = boundaries(fractions, 0.05, spending)
    rng = np.random.default_rng(7)
    steps = rng.normal(0, 1, (400_000, len(fractions))) * np.sqrt(np.diff([0.0, *fractions]))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    crossed = np.abs(z) >= np.array(bounds)
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    allowed = np.diff([0.0, *(spent(t, 0.05, spending) for t in fractions)])
    for k, want in enumerate(allowed):
        got = float(np.mean(first == k))
        assert got == pytest.approx(want, abs=4 * math.sqrt(want / 400_000) + 1e-4), (k, got, want)


def test_the_simulations_welch_is_the_reports_welch():
    rng = np.random.default_rng(3)
    better, worse = rng.normal(0, 1, (5, 6)), rng.normal(0.7, 2, (5, 6))
    looks = looks_of(better, worse, [2, 4, 6])
    for i in range(5):
        for r, n in enumerate([2, 4, 6]):
            c = stats.welch(list(better[i, :n]), list(worse[i, :n]))
            assert looks[i][r].effect == pytest.approx(c.effect, rel=1e-12)
            assert looks[i][r].p_two_sided == pytest.approx(c.p_two_sided, rel=1e-9)
            assert looks[i][r].spread == pytest.approx(Look.of(list(better[i, :n]), list(worse[i, :n])).spread,
                                                       rel=1e-9)
    bounded = looks_of(better, worse, [2, 4, 6], sesoi=0.5)
    for i in range(5):
        for r, n in enumerate([2, 4, 6]):
            c = stats.welch(list(better[i, :n]), list(worse[i, :n]))
            assert bounded[i][r].p_equivalent == pytest.approx(stats.equivalence(c, 0.5), rel=1e-9)
            assert Look.of(list(better[i, :n]), list(worse[i, :n]), sesoi=0.5).p_equivalent == pytest.approx(
                stats.equivalence(c, 0.5), rel=1e-12)


@pytest.mark.parametrize("futility", [False, True])
def test_under_no_difference_a_race_stays_within_alpha_and_testing_after_every_seed_does_not(futility):
    races, alpha = 2000, 0.05
    row = simulate(RaceDesign(min=2, max=10, alpha=alpha, futility=futility), 0.0, races, seed=11)
    error = 3 * math.sqrt(alpha * (1 - alpha) / races)  # three standard errors of a rate at alpha over 2000 races
    assert row["false_rate"] <= alpha + error, row
    assert row["naive_false_rate"] > alpha + error, row  # the same draws, looked at naively: the test can fail


@pytest.mark.parametrize("ratio", [3.0, 10.0])
def test_under_no_difference_with_unequal_spreads_a_race_stays_within_alpha(ratio):
    """Welch at 2 to 10 seeds a side errs where one side's spread dominates (0.061 at 1:3, 0.072 at 1:10 before
    the calibration): the calibrated race stays within alpha, and its draws would not without it."""
    races, alpha = 4000, 0.05
    design = RaceDesign(min=2, max=10, alpha=alpha, futility=False)
    row = simulate(design, 0.0, races, seed=13, sd_ratio=ratio)
    error = 2 * math.sqrt(alpha * (1 - alpha) / races)
    assert row["false_rate"] <= alpha + error, row
    rng = np.random.default_rng(13)
    uncalibrated = [[replace(look, spread=None) for look in race] for race in  # the spreads unknown: taken equal
                    looks_of(*draw(rng, races, design.max, 0.0, ratio), design.planned())]
    false = sum(decide(design, [race])[0][-1].decision in (stats.HOLDS, stats.REVERSED) for race in uncalibrated)
    assert false / races > alpha + error, false / races


def test_the_calibration_is_seeded_lowers_the_level_where_spreads_differ_and_holds_the_level_it_is_for():
    planned, level = (2, 3, 4, 6), 0.05
    lam0, floor = calibration.calibrated(planned, 6, level, "pocock")
    calibration.calibrated.cache_clear()
    assert calibration.calibrated(planned, 6, level, "pocock") == (lam0, floor)
    factors = [calibration.scale(planned, 6, level, "pocock", q) for q in (1.0, 1.3, 2.0, 3.0, 30.0, math.inf)]
    assert factors[0] == factors[1] == lam0 and all(a >= b for a, b in zip(factors, factors[1:]))
    assert factors[-1] == factors[-2] == pytest.approx(lam0 * floor) and lam0 * floor < 1
    assert calibration.scale(planned, 6, level, "pocock", None) == lam0


def test_a_family_of_null_claims_stays_within_alpha_with_holm_across_the_race():
    races, alpha = 1500, 0.05
    row = simulate(RaceDesign(min=2, max=8, alpha=alpha), 0.0, races, seed=12, claims=3)
    assert row["false_rate"] <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / races), row


def test_a_large_effect_is_decided_at_the_first_look_and_a_true_one_runs_fewer_seeds_than_max():
    design = RaceDesign(min=2, max=10)
    obvious = decide(design, [[Look.of([2.50, 2.51], [3.50, 3.52])], [Look.of([3.50, 3.52], [2.50, 2.51])]])
    assert [h[-1].decision for h in obvious] == [stats.HOLDS, stats.REVERSED]
    assert [h[-1].round for h in obvious] == [0, 0]
    row = simulate(design, 2.0, 400, seed=5)
    assert row["power"] > 0.8 and row["mean_seeds"] < 0.7 * design.max, row


def test_holm_passes_a_rejected_claims_alpha_to_the_others_within_the_round():
    design = RaceDesign(min=2, max=2)  # one look: a fixed test, boundary 2.2414 at alpha/2 and 1.96 at alpha
    moderate = Look(2, 2, 0.5, 0.03)  # z = 2.17
    assert [h[-1].decision for h in decide(design, [[Look(2, 2, 0.9, 1e-9)], [moderate]])] == [stats.HOLDS] * 2
    alone = decide(design, [[Look(2, 2, 0.1, 0.5)], [moderate]])
    assert [h[-1].decision for h in alone] == [MAX_REACHED, MAX_REACHED]
    assert alone[1][-1].boundary == pytest.approx(2.2414, abs=1e-3) and alone[1][-1].level == 0.025


def test_futility_stops_a_hopeless_claim_only_from_half_the_information_and_says_at_which_n():
    design = RaceDesign(min=2, max=10)
    flat = [Look(n, n, 0.001, 0.98) for n in design.planned()]
    decisions = decide(design, [flat])[0]
    assert decisions[-1].decision == FUTILITY
    assert decisions[-1].n_better == 5  # the first look at or past half of max's information
    assert all(d.decision == "continue" for d in decisions[:-1]) and len(decisions) == 4
    assert decisions[-1].verdict() == "not significant (stopped for futility at n=5)"
    assert decide(RaceDesign(min=2, max=10, futility=False), [flat])[0][-1].decision == MAX_REACHED


def test_a_decision_is_final_replayed_the_same_and_an_untested_look_waits():
    design = RaceDesign(min=2, max=4, futility=False)
    looks = [[Look.of([1.0, 1.01], [2.0, 2.02]), Look.of([1.0, 1.01, 9.0], [2.0, 2.02, 0.1])],  # decided at round 0
             [Look(1, 2, None, None), Look.of([1.0, 1.1, 1.2], [1.05, 1.2, 1.15]), Look(4, 4, 0.02, 0.6)]]
    first, again = decide(design, looks), decide(design, looks)
    assert first == again
    assert len(first[0]) == 1 and first[0][0].decision == stats.HOLDS  # its later look, for another claim, unread
    assert [d.decision for d in first[1]] == ["continue", "continue", MAX_REACHED]
    assert first[1][0].z is None  # a side with one finished seed: no test, no boundary, no look spent


def test_equal_sides_are_never_no_difference_and_the_naive_procedure_is_what_it_says():
    design = RaceDesign(min=2, max=4)
    (d,) = decide(design, [[Look.of([2.0, 2.1], [2.0, 2.1])]])[0]  # effect 0: no decision of its own
    assert d.decision == FUTILITY and d.verdict() == "not significant (stopped for futility at n=2)"
    (d,) = decide(design, [[Look.of([2.0, 2.001], [2.0, 2.001], sesoi=0.1)]])[0]  # with a SESOI: shown equivalent
    assert d.decision == stats.EQUIVALENT and d.verdict() == "equivalent within ±0.1 nats" and d.z > d.boundary
    assert naive(0.05, [[Look(2, 2, 0.3, 0.2), Look(3, 3, 0.3, 0.04)]]) == [stats.HOLDS]


def test_the_information_fraction_and_conditional_power_have_their_known_values():
    assert information_fraction(5, 5, 10) == 0.5
    assert information_fraction(2, 8, 10) == pytest.approx((1 / (1 / 2 + 1 / 8)) / 5)
    assert conditional_power(1.96, 1.0, 1.96) == 1.0
    # at half the information, z = 1.96·√0.5 is exactly on the trend that ends at the boundary: a coin flip
    assert conditional_power(1.96 * math.sqrt(0.5), 0.5, 1.96) == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("bad", [dict(min=5, max=3), dict(min=1), dict(alpha=0.5), dict(alpha=0), dict(step=0),
                                 dict(spending="linear")])
def test_a_design_that_cannot_race_is_refused(bad):
    with pytest.raises(ValueError):
        RaceDesign(**bad)


def test_a_decision_says_its_verdict_in_the_reports_words():
    assert Decision(3, 8, 8, 0.4, 2.5, 0.05, MAX_REACHED).verdict() == "not significant (max seeds reached, n=8)"
    assert Decision(0, 2, 2, 9.0, 2.4, 0.05, stats.HOLDS).verdict() == "holds"


def test_a_side_that_gives_no_number_and_gains_none_stops_untested_instead_of_taking_every_seed():
    design = RaceDesign(min=2, max=10)
    oom = [Look(2, 0, None, None), Look(3, 0, None, None), Look(4, 0, None, None)]
    decisions = decide(design, [oom])[0]
    assert [d.decision for d in decisions] == ["continue", stats.UNTESTED]  # one more seed tried, then stopped
    late = [Look(2, 1, None, None), Look(3, 2, 0.4, 0.3)]  # a side that gained its second seed is tested
    assert decide(design, [late])[0][-1].decision == "continue"


def _equivalence_races(effect: float, sesoi: float, races: int, seed: int) -> tuple[float, float]:
    """Races of one claim with a SESOI (min 2, max 10 seeds a side, Pocock, futility on): P(equivalent), mean seeds."""
    rng = np.random.default_rng(seed)
    design = RaceDesign(min=2, max=10)
    better, worse = rng.normal(0, 1, (races, design.max)), rng.normal(effect, 1, (races, design.max))
    looks = looks_of(better, worse, design.planned(), sesoi=sesoi)
    last = [decide(design, [h])[0][-1] for h in looks]
    return sum(d.decision == stats.EQUIVALENT for d in last) / races, sum(d.n_better for d in last) / races


@pytest.mark.parametrize("effect", [1.5, -1.5])
def test_a_race_says_equivalent_at_most_alpha_of_the_time_when_the_effect_is_the_sesoi(effect):
    """Nine looks of a TOST at one-sided group-sequential boundaries: the error stays at alpha (looking at the
    fixed level after every seed would spend it nine times)."""
    rate, _ = _equivalence_races(effect, 1.5, 2000, seed=21 + int(effect > 0))
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 2000)


def test_a_race_with_no_effect_ends_equivalent_with_at_least_its_last_looks_power_never_for_futility():
    """Known answers: at least the power of its last look alone (a TOST at 10 seeds a side at the Pocock boundary,
    0.69), at most that of one TOST at 10 seeds at the fixed level (0.89): Pocock's price, which the race pays for
    its early stops; futility (on) never stops a claim with a SESOI, so every race ends equivalent or at max."""
    from scipy import stats as sps

    rate, seeds = _equivalence_races(0.0, 1.5, 1000, seed=23)
    design = RaceDesign(min=2, max=10)
    last = boundaries([information_fraction(n, n, 10) for n in design.planned()], 0.1, "pocock")[-1]
    crit = sps.t.isf(sps.norm.sf(last), 18)  # its t at 18 degrees of freedom
    se = math.sqrt(2 / 10)
    floor, fixed = 2 * sps.norm.cdf(1.5 / se - crit) - 1, 2 * sps.norm.cdf(1.5 / se - sps.t.isf(0.05, 18)) - 1
    assert floor - 3 * math.sqrt(floor * (1 - floor) / 1000) <= rate <= fixed, (rate, floor, fixed)
    assert seeds < 10  # some end before max
    rng = np.random.default_rng(24)
    flat = looks_of(rng.normal(0, 1, (200, 10)), rng.normal(0, 1, (200, 10)), design.planned(), sesoi=1.5)
    assert all(d.decision != FUTILITY for h in flat for d in decide(design, [h])[0])


def test_a_parity_claims_race_decisions_are_said_in_its_words():
    design = RaceDesign(min=2, max=4)
    (d,) = decide(design, [[Look.of([2.0, 2.001], [2.0, 2.001], sesoi=0.1, parity=True)]])[0]
    assert d.verdict() == "holds: equal within ±0.1 nats"
    (d,) = decide(design, [[Look.of([2.50, 2.51], [3.50, 3.52], sesoi=0.1, parity=True)]])[0]
    assert d.decision == stats.HOLDS and d.verdict() == "reversed: the sides differ"
    wide = [Look.of([2.0, 2.4][:2] + [2.2] * k, [2.1, 2.5][:2] + [2.3] * k, sesoi=0.01, parity=True) for k in range(3)]
    last = decide(design, [wide])[0][-1]
    assert last.decision == MAX_REACHED
    assert last.verdict() == "undecided: neither equal within ±0.01 nats nor different (max seeds reached, n=4)"


def test_the_benchs_draws_have_the_spreads_and_tails_they_are_named_by():
    from bench.race import draw

    rng = np.random.default_rng(31)
    better, worse = draw(rng, 20_000, 10, 0.5, sd_ratio=3.0)
    assert better.std() == pytest.approx(1.0, rel=0.01) and worse.std() == pytest.approx(3.0, rel=0.01)
    assert worse.mean() - better.mean() == pytest.approx(0.5, abs=0.05)
    better, worse = draw(rng, 20_000, 10, 0.0, sd_ratio=3.0, tails=3)  # t3 scaled to SD 1: heavy tails, same SD
    kurtosis = float(np.mean(better ** 4) / np.mean(better ** 2) ** 2)
    assert kurtosis > 5 and np.median(np.abs(worse)) / np.median(np.abs(better)) == pytest.approx(3.0, rel=0.05)
    row = simulate(RaceDesign(min=2, max=6), 0.0, 300, seed=5, sesoi=2.0)
    assert row["equivalent"] > 0.3 and row["futility"] == 0.0  # raced for equivalence, never stopped for futility
