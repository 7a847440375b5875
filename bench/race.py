"""`python -m bench race [--races 2000] [--min 2] [--max 10] [--step 1] [--alpha 0.05] [--out FILE.md]`: how an
adaptive sweep's race (ablate/results/race.py) spends seeds, simulated without training.

Each race draws its runs' losses from normal distributions with a known difference of means, in units of the seed
spread (0: no difference; 0.5, 1, 2 seed-spreads), looks after every round from `min` to `max` seeds a side, and
stops a claim as the race decides. Printed per setting: how often it says "holds" or "reversed" (under no
difference both are false; the family-wise rate must stay at or under alpha plus sampling error), the power, the
mean seeds a side it ran, how often it stopped for futility; the fixed design (one test at n seeds a side) with the
same power (where that power is at least 0.5), and the seeds the race saved against it and against `max` fixed
seeds. A naive procedure (Welch at
alpha after every round, stopping at the first significant look) runs on the same draws: the error a race avoids.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

EFFECTS = (0.0, 0.5, 1.0, 2.0)


def draw(rng, races: int, n_max: int, effect: float, sd_ratio: float = 1.0, tails: int | None = None):
    """(better, worse): races × n_max losses, worse = better's distribution shifted by `effect` seed-spreads, its
    spread `sd_ratio` times better's; `tails`: Student t with that many degrees of freedom (scaled to SD 1)
    instead of normal."""
    if tails is None:
        return rng.normal(0.0, 1.0, (races, n_max)), rng.normal(effect, sd_ratio, (races, n_max))
    scale = math.sqrt((tails - 2) / tails)
    return (rng.standard_t(tails, (races, n_max)) * scale,
            effect + sd_ratio * scale * rng.standard_t(tails, (races, n_max)))


def looks_of(better, worse, planned: list[int], sesoi: float | None = None):
    """looks[i][r]: race i's Look at round r (seeds 0..n−1 a side), Welch's test (and with a `sesoi`, its TOST)
    and the sides' standard-error ratio computed for every race at once (the same numbers as ablate.results.stats.welch and .equivalence;
    tests/results/test_race.py holds that)."""
    import numpy as np
    from scipy import stats as st

    from ablate.results.race import Look

    columns = []
    for n in planned:
        b, w = better[:, :n], worse[:, :n]
        vb, vw = b.var(axis=1, ddof=1) / n, w.var(axis=1, ddof=1) / n
        effect = w.mean(axis=1) - b.mean(axis=1)
        se = np.sqrt(vb + vw)
        df = (vb + vw) ** 2 / (vb ** 2 / (n - 1) + vw ** 2 / (n - 1))
        t = effect / se
        p_two = np.minimum(1.0, 2 * np.minimum(st.t.sf(t, df), st.t.cdf(t, df)))
        spread = np.sqrt(np.maximum(vb, vw) / np.minimum(vb, vw))
        if sesoi is None:
            columns.append([Look(n, n, float(e), float(p), spread=float(q)) for e, p, q in zip(effect, p_two, spread)])
            continue
        p_eq = np.maximum(st.t.sf((effect + sesoi) / se, df), st.t.sf((sesoi - effect) / se, df))
        columns.append([Look(n, n, float(e), float(p), sesoi, float(pe), spread=float(q))
                        for e, p, pe, q in zip(effect, p_two, p_eq, spread)])
    return [list(row) for row in zip(*columns)]


def fixed_n_for(power: float, effect: float, alpha: float, n_max: int) -> int | None:
    """The fewest seeds a side at which one two-sided t-test at `alpha` has `power` at `effect` seed-spreads
    (noncentral t); None past 4·n_max."""
    from ablate.results.power import seeds_for

    n = seeds_for(effect, alpha, power)
    return n if n is not None and n <= 4 * n_max else None


def simulate(design, effect: float, races: int, seed: int, claims: int = 1, sd_ratio: float = 1.0,
             tails: int | None = None, sesoi: float | None = None) -> dict:
    """`races` races of `claims` hypotheses each with the same true `effect`: the race's and the naive procedure's
    outcomes (`sesoi`: each claim also raced for equivalence within ±sesoi seed-spreads)."""
    import numpy as np

    from ablate.results.race import FUTILITY, decide, naive

    rng = np.random.default_rng(seed)
    planned = design.planned()
    draws = [looks_of(*draw(rng, races, design.max, effect, sd_ratio, tails), planned, sesoi) for _ in range(claims)]
    out = {"holds": 0, "reversed": 0, "any_false": 0, "naive_false": 0, "futility": 0, "seeds": 0, "equivalent": 0}
    for i in range(races):
        looks = [d[i] for d in draws]
        last = [h[-1] for h in decide(design, looks)]
        verdicts = [d.decision for d in last]
        out["holds"] += verdicts.count("holds")
        out["reversed"] += verdicts.count("reversed")
        out["any_false"] += any(v in ("holds", "reversed") for v in verdicts) if effect == 0 else "reversed" in verdicts
        naive_verdicts = naive(design.alpha, looks)
        out["naive_false"] += (any(v in ("holds", "reversed") for v in naive_verdicts) if effect == 0
                               else "reversed" in naive_verdicts)
        out["futility"] += verdicts.count(FUTILITY)
        out["equivalent"] += verdicts.count("equivalent")
        out["seeds"] += sum(d.n_better for d in last)
    total = races * claims
    return {"effect": effect, "claims": claims, "races": races,
            "false_rate": out["any_false"] / races, "naive_false_rate": out["naive_false"] / races,
            "power": out["holds"] / total, "futility": out["futility"] / total, "mean_seeds": out["seeds"] / total,
            "equivalent": out["equivalent"] / total}


def table(design, races: int, seed: int) -> tuple[list[str], list[dict]]:
    from dataclasses import replace

    rows = []
    lines = ["| spending | futility | effect (seed-spreads) | claims | false verdicts (0: holds or reversed; else "
             "reversed) | naive: after every seed at alpha | power (holds) | mean seeds a side | stopped for futility | "
             f"fixed design, same power | seeds saved vs it | seeds vs {design.max} fixed |", "|" + "---|" * 12]
    settings = [(s, f, e, 1) for s in ("pocock", "obrien-fleming") for f in (True, False) for e in EFFECTS]
    settings += [("pocock", True, 0.0, 3)]  # a family of three null claims: Holm across the race
    for k, (spending, futility, effect, claims) in enumerate(settings):
        d = replace(design, spending=spending, futility=futility)
        row = simulate(d, effect, races, seed + k, claims)
        fixed = fixed_n_for(row["power"], effect, d.alpha, d.max) if effect > 0 and row["power"] >= 0.5 else None
        saved = f"{1 - row['mean_seeds'] / fixed:+.0%}" if fixed else "—"
        se = math.sqrt(d.alpha * (1 - d.alpha) / races)
        false = f"{row['false_rate']:.4f}" + (f" (alpha {d.alpha} ± {se:.4f})" if effect == 0 else "")
        rows.append({**row, "spending": spending, "futility_on": futility, "fixed_n": fixed})
        lines.append(f"| {spending} | {'on' if futility else 'off'} | {effect:g} | {claims} | {false} | "
                     f"{row['naive_false_rate']:.4f} | {row['power']:.3f} | {row['mean_seeds']:.2f} | "
                     f"{row['futility']:.1%} | {fixed if fixed else '—'} | {saved} | "
                     f"{row['mean_seeds'] / d.max:.0%} |")
    return lines, rows


# (what, effect, sd_ratio, tails, sesoi, claims): the null under unequal spreads and heavy tails (Holm's levels
# too: three claims), and equivalence races
SPREADS = [("equal spreads", 0.0, 1.0, None, None, 1), ("spreads 1:3", 0.0, 3.0, None, None, 1),
           ("spreads 1:10", 0.0, 10.0, None, None, 1), ("3 claims, spreads 1:10", 0.0, 10.0, None, None, 3),
           ("t3 tails", 0.0, 1.0, 3, None, 1), ("t3 tails, spreads 1:3", 0.0, 3.0, 3, None, 1),
           ("equal spreads, effect 1", 1.0, 1.0, None, None, 1), ("spreads 1:3, effect 1", 1.0, 3.0, None, None, 1),
           ("equivalence, effect = +SESOI", 1.5, 1.0, None, 1.5, 1),
           ("equivalence, effect = -SESOI", -1.5, 1.0, None, 1.5, 1),
           ("equivalence, no effect", 0.0, 1.0, None, 1.5, 1)]


def spreads_table(design, races: int, seed: int) -> list[str]:
    """The default design (its spending and futility) under unequal seed spreads, heavy tails, and raced for
    equivalence within a SESOI of 1.5 seed-spreads (of the better side)."""
    se = math.sqrt(design.alpha * (1 - design.alpha) / races)
    lines = [f"| setting | effect | false holds/reversed (alpha {design.alpha} ± {se:.4f}) | power (holds) | "
             "equivalent | mean seeds a side |", "|" + "---|" * 6]
    for k, (what, effect, ratio, tails, sesoi, claims) in enumerate(SPREADS):
        row = simulate(design, effect, races, seed + 100 + k, claims, sd_ratio=ratio, tails=tails, sesoi=sesoi)
        false = f"{row['false_rate']:.4f}" if effect == 0 else "—"
        power = f"{row['power']:.3f}" if effect > 0 and sesoi is None else "—"
        equivalent = f"{row['equivalent']:.4f}" if sesoi is not None else "—"
        lines.append(f"| {what} | {effect:g} | {false} | {power} | {equivalent} | {row['mean_seeds']:.2f} |")
    return lines


SCAN = ("pocock", "obrien-fleming", "power-1", "power-2", "power-3", "power-4", "power-6", "power-10")
KEEP = 0.01  # the power a race may lose against fixed `max` seeds (issue 72: at <= 60% of its seeds)


def spending_scan(design, races: int, seed: int) -> list[str]:
    """Whether some spending keeps the power of `max` fixed seeds (within KEEP) at 1 and 2 seed-spreads for fewer
    seeds: every spending of SCAN (Kim & DeMets' α·t^R between Pocock's and O'Brien-Fleming's), futility off and
    on; the last line says the fewest seeds a spending that keeps the power spends."""
    from dataclasses import replace

    from ablate.results.power import fixed_power

    effects = (1.0, 2.0)
    fixed = {e: fixed_power(e, design.alpha, design.max) for e in effects}
    lines = ["| spending | futility | " + " | ".join(f"power at {e:g} (fixed {design.max}: {fixed[e]:.3f}) | seeds"
                                                    for e in effects) + " | keeps the power |", "|" + "---|" * 7]
    keeping: list[tuple[float, str]] = []
    for k, (spending, futility) in enumerate((s, f) for s in SCAN for f in (False, True)):
        d = replace(design, spending=spending, futility=futility)
        rows = [simulate(d, e, races, seed + 200 + 2 * k + i) for i, e in enumerate(effects)]
        keeps = all(fixed[e] - row["power"] <= KEEP for e, row in zip(effects, rows))
        share = max(row["mean_seeds"] for row in rows) / design.max
        if keeps:
            keeping.append((share, f"{spending}, futility {'on' if futility else 'off'}"))
        lines.append(f"| {spending} | {'on' if futility else 'off'} | " + " | ".join(
            f"{row['power']:.3f} | {row['mean_seeds'] / design.max:.0%}" for row in rows) + f" | {'yes' if keeps else 'no'} |")
    best = min(keeping, default=None)
    lines += ["", f"Within {KEEP} of the power of {design.max} fixed seeds at 1 and 2 seed-spreads: " + (
        f"the fewest seeds, {best[0]:.0%} of fixed at the costlier effect, by {best[1]}." if best else "no spending.")]
    return lines


def main() -> None:
    from ablate.results.race import RaceDesign

    p = argparse.ArgumentParser(prog="python -m bench race", description=__doc__.splitlines()[0])
    p.add_argument("--races", type=int, default=2000, help="races per setting (>= 2000 for the README's table)")
    p.add_argument("--spread-races", type=int, default=100_000,
                   help="races per row of the unequal-spreads table (100,000: a rate to ± 0.0007)")
    p.add_argument("--scan-races", type=int, default=10_000,
                   help="races per row of the scan of spendings (10,000: a power to ± 0.005)")
    p.add_argument("--min", type=int, default=2)
    p.add_argument("--max", type=int, default=10)
    p.add_argument("--step", type=int, default=1)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the table to this markdown file")
    args = p.parse_args()
    design = RaceDesign(min=args.min, max=args.max, step=args.step, alpha=args.alpha)
    t0 = time.process_time()
    lines, _ = table(design, args.races, args.seed)
    lines += ["", f"Unequal spreads, heavy tails and equivalence ({design.spending} spending, futility "
              f"{'on' if design.futility else 'off'}; a SESOI never stops for futility):", "",
              *spreads_table(design, args.spread_races, args.seed),
              "", f"Can a spending keep the power of {design.max} fixed seeds for fewer ({args.scan_races} races a row, "
              "equal spreads; seeds: the mean a side, of fixed):", "", *spending_scan(design, args.scan_races, args.seed)]
    head = (f"Races of seeds {design.min}..{design.max} (step {design.step}), alpha {design.alpha}, "
            f"{args.races} races per row ({args.spread_races} in the second table, {args.scan_races} in the third), "
            f"numpy seed {args.seed}; "
            f"{time.process_time() - t0:.0f} CPU-s.")
    text = "\n".join([head, "", *lines, ""])
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
