"""`ablate plan SPEC`: validate a sweep file and list its trials, parameter counts and total budget (torch-free)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from ablate.cli.common import (ASSIGNMENTS_HELP, OVERRIDES_NOTE, STATUS_ROWS, about, assignments_argument, console,
                               db_option, err_console, human_count, human_seconds, override_options, overrides_of)
from ablate.config.errors import AblateError

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


@click.command(**about("validate a sweep file and list its trials",
                       "SPEC: sweep file, e.g. sweeps/tinystories-widths.yaml", ASSIGNMENTS_HELP),
               epilog=OVERRIDES_NOTE)
@click.argument("spec")
@assignments_argument()
@click.option("--max-trials", type=int, default=10_000, help="refuse grids larger than this (default 10,000)")
@click.option("--all", "all_", is_flag=True, help="list every trial (default: the first 200, the rest counted)")
@override_options(merge=False)
@db_option()
def plan(spec: str, max_trials: int, all_: bool, db: str | None, **params: Any) -> int:
    from ablate.config import load_trials

    parsed, trials = load_trials(spec, max_trials=max_trials, overrides=overrides_of(params))
    from ablate.plugins.guard import plugin_modules, refuse_broken_plugins  # in a child: plan stays torch-free

    refuse_broken_plugins(trials, "`ablate sweep run` (and register) will refuse this sweep", plugin_modules(parsed))
    console.print(trials_table(parsed, trials, len(trials) if all_ else min(len(trials), STATUS_ROWS)))
    _print_plugins(trials)
    per_class = budget_per_class(trials)
    if parsed.search is not None:  # the table shows the base trial; the search samples the rest
        search = parsed.search
        console.print(f"search: {search.n_trials} trials sampled by {search.sampler} (pruner {search.pruner}) from the "
                      "trial above, over " + "; ".join(f"{k} {_search_range(v)}" for k, v in search.parameters.items())
                      + f". Run it with `ablate search run {spec}`.")
        per_class = {key: parsed.budget.amount * search.n_trials for key in per_class}
    else:
        console.print(f"{len(trials)} trials; budget per trial: {parsed.budget.describe()}")
    _warn_about_hub_data(trials)
    _print_notes(parsed, trials)
    _print_totals(parsed.budget.kind, per_class)
    if parsed.adaptive is not None:
        _print_race(parsed, len(trials), per_class)
    _print_power(parsed, trials, db)
    return 0


def _print_power(spec: Any, trials: list[TrialConfig], db: str | None) -> None:
    """For claims with a smallest effect of interest: the seeds a side that detect it with 80% power, from the
    seed-to-seed SD of earlier runs of the sweep's architectures in the results DB (none: said)."""
    sesois = sorted({s for order in spec.report.orderings if (s := spec.report.sesoi_of(order)) is not None})
    if not sesois:
        return
    from ablate.results import stats
    from ablate.results.power import POWER, seed_spread, seeds_for
    from ablate.store import describe_url, reader, resolve_url

    archs = {t.architecture for t in trials}
    m = len(spec.report.orderings)
    alpha = (spec.adaptive.alpha if spec.adaptive is not None else stats.ALPHA) / m  # Holm's first level: the safe side
    try:
        spread = seed_spread(reader(db), archs)
    except AblateError as exc:
        console.print(f"power planning: no earlier runs to read the seed spread from ({exc})", highlight=False,
                      markup=False)
        return
    if spread.sd is None:
        console.print(f"power planning: {describe_url(resolve_url(db))} has no configuration of "
                      f"{', '.join(sorted(archs))} with 2 finished seeds yet, so the seed spread is unknown; run a "
                      "few seeds first (or another sweep of these architectures)", highlight=False, markup=False)
        return
    for sesoi in sesois:
        n = seeds_for(sesoi / spread.sd, alpha, POWER)
        needed = f"{n} seeds a side" if n is not None else "more than 1000 seeds a side"
        line = (f"power planning: to detect {sesoi:g} nats with {POWER:.0%} power at alpha {alpha:.3g} (Holm's first "
                f"level for {m} claim(s); claims of several cells need more), a fixed design needs {needed}: the seed SD is {spread.sd:.3g} nats, "
                f"pooled over {spread.configurations} earlier configuration(s) of {', '.join(spread.architectures)}")
        if spec.adaptive is not None and (n is None or n > spec.adaptive.seeds.max):
            line += (f"; adaptive.seeds.max is {spec.adaptive.seeds.max}: raise it to at least "
                     f"{n if n is not None else 1000}, or the race will mostly end at max undecided")
        console.print(line, highlight=False, markup=False)


def _print_race(spec: Any, first: int, per_class: dict[str, float]) -> None:
    """An adaptive sweep's bounds: the first round alone (every claim decided at once) to every cell at max."""
    race = spec.adaptive
    cells = first // race.seeds.min
    most = cells * race.seeds.max
    cap = f"; it stops adding rounds after {race.max_gpu_hours:g} GPU-hours" if race.max_gpu_hours else ""
    what = ("for the lowest (best of k)" if race.mode == "best" else
            f"the {len(spec.report.orderings)} claim(s) of report.orderings")
    futility = "on" if race.futility and race.mode == "claims" else "off"
    console.print(f"adaptive: {cells} cells race {what} ({race.spending} spending, alpha {race.alpha:g}, futility "
                  f"{futility}): "
                  f"{first} trials ({race.seeds.min} seeds a cell) if the first round decides it all, at "
                  f"most {most} ({race.seeds.max} seeds a cell, {race.step} more a round){cap}; the totals above are "
                  f"the least, the most is {most / first:g}x:")
    _print_totals(spec.budget.kind, {key: amount * most / first for key, amount in per_class.items()})


def trials_table(spec: Any, trials: list[Any], listed: int) -> Table:
    """The first `listed` trials, a row each (rendering 10,000 rows takes seconds); a caption counts the rest."""
    table = Table(title=f"sweep {spec.name}: {spec.description}".rstrip(": "), title_justify="left")
    show_objective = any(t.objective != "clm" for t in trials)
    show_horizon = any(t.horizon is not None for t in trials)  # the schedule's planned length, where a study gave one
    for col in ("#", "fingerprint", "architecture", *(["objective"] if show_objective else []), "options", "d_model",
                "layers", "heads", "context", "lr", "batch", *(["horizon"] if show_horizon else []), "seed", "params",
                "inter-token", "reference"):
        table.add_column(col, justify="right" if col not in ("fingerprint", "architecture", "options") else "left")
    for i, t in enumerate(trials[:listed]):
        total, inter = trial_param_counts(t)
        opts = ",".join(f"{k}={v}" for k, v in sorted(t.options.items()))
        objective = [objective_label(t.objective, t.objective_options)] if show_objective else []
        table.add_row(str(i), t.fingerprint(), t.architecture, *objective, opts, str(t.d_model), str(t.layers),
                      str(t.heads or "-"), str(t.context), f"{t.lr:g}",
                      f"{t.batch_size}x{t.grad_accum}" if t.grad_accum > 1 else str(t.batch_size),
                      *([t.horizon.describe() if t.horizon else "budget"] if show_horizon else []), str(t.seed),
                      human_count(total), human_count(inter) if inter is not None else "?", _reference_text(spec, t))
    if listed < len(trials):
        table.caption = f"the first {listed:,} of {len(trials):,} trials; --all lists every one"
        table.caption_justify = "left"
    return table


def _print_plugins(trials: list[Any]) -> None:
    """Where each plugin the trials run comes from, the identity of its code, and how its parameters were counted."""
    from ablate.config import registry

    names = dict.fromkeys(part.split("@", 1)[0] for t in trials if t.code for part in t.code.split("+"))
    for name in names:
        entry = registry.registered(name)
        counted = "" if getattr(entry, "closed_form", True) else (
            "; parameters counted by building it on the meta device (no memory; give param_count= to skip)")
        console.print(f"plugin {escape(name)}: {escape(entry.source.describe())}{counted}")


def _reference_text(spec: Any, trial: TrialConfig) -> str:
    """The published result a trial reproduces (train/eval loss, or peak memory), if the spec names one."""
    from ablate.config import reference_for

    ref = reference_for(spec, trial)
    if ref is None:
        return ""
    if ref.memory_mb is not None:
        return f"{ref.memory_mb} MB"
    return "/".join("-" if v is None else f"{v:.2f}" if round(v, 2) == v else str(v) for v in (ref.train, ref.eval))


def budget_per_class(trials: list[Any]) -> dict[str, float]:
    """The trials' budget summed per hardware class ("1x cpu")."""
    per_class: dict[str, float] = defaultdict(float)
    for t in trials:
        per_class[f"{t.budget.gpus}x {t.budget.hardware}"] += t.budget.amount
    return per_class


def _warn_about_hub_data(trials: list[Any]) -> None:
    """A hub dataset that cannot load here (offline, unknown id): said now, though this machine may not run it."""
    try:
        if any(t.dataset.from_hub for t in trials):  # (the runner brings SQLAlchemy: only when there is one to check)
            from ablate import runner

            runner.check_sources(trials)
    except AblateError as exc:
        err_console.print(f"[yellow]warning:[/] {escape(str(exc))} `ablate sweep run` and the sweep flow check the "
                          "data before any trial starts, and stop with this message where it cannot load")


def _print_notes(spec: Any, trials: list[Any]) -> None:
    """The overrides applied, the retrieval stage, and the recipes the trials train with."""
    from ablate.config import describe_recipe

    for note in spec.overrides:
        console.print(f"override: {note}", highlight=False)
    if spec.retrieval is not None:
        console.print(f"retrieval stage: {spec.retrieval.describe()}", highlight=False)
    recipes = list(dict.fromkeys(describe_recipe(t) for t in trials))
    for text in recipes[:5]:  # a grid over lr or betas has as many recipes as values; the first few say enough
        console.print(f"recipe {spec.recipe}: {text}", highlight=False)
    if len(recipes) > 5:
        console.print(f"... and {len(recipes) - 5} more recipe variants")


def _print_totals(kind: str, per_class: dict[str, float]) -> None:
    for key, amount in per_class.items():
        if kind == "wall_clock":
            console.print(f"total on {key}: {human_seconds(amount)} ({amount / 3600:.1f} h wall clock)")
        else:
            console.print(f"total on {key}: {human_count(amount)} {kind}")


def _search_range(param: Any) -> str:
    if param.type == "categorical":
        return "in {" + ", ".join(str(c) for c in param.choices) + "}"
    scale = " (log)" if param.log else ""
    return f"in [{param.low:g}, {param.high:g}]{scale}" + (f" when {param.when}" if param.when else "")


def objective_label(objective: str, options: dict | None) -> str:
    """`multi_token(n_tokens=3)`: an objective with the options a trial sets."""
    extra = ",".join(f"{k}={v}" for k, v in sorted((options or {}).items()))
    return f"{objective}({extra})" if extra else objective


KNOWN_VOCABS = {"gpt2": 50257, "gpt2-medium": 50257, "gpt-neo-125m": 50257, "llama-7b": 32000}


def trial_param_counts(trial: TrialConfig) -> tuple[int, int]:
    """(total, inter-token; None where the family does not say) parameters from the family's closed form (a plugin
    without one: built on the meta device) and the objective's (torch-free)."""
    from ablate.config import registry

    family = registry.check_architecture(trial.architecture)
    # a loaded tokenizer's size is known only once it is loaded (transformers, maybe the hub): the common ones here
    vocab = (KNOWN_VOCABS.get(trial.tokenizer.name.rsplit("/", 1)[-1], 32000) if trial.tokenizer.name
             else trial.tokenizer.vocab_size or 32000)
    total, inter = family.param_count(trial, vocab), family.inter_token_params(trial)
    return registry.objective(trial.objective).param_counts(trial, total, inter, vocab, family.options_module())
