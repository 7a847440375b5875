"""A study's report: best trial, parameter importances, plots (optimisation history, slices, intermediate values),
trials.csv and summary.md, into results/reports/NAME/."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ablate.config.errors import AblateError, did_you_mean
from ablate.search.study import open_storage


@dataclass
class SearchReport:
    out: Path
    files: list[Path]
    counts: dict[str, int]
    best: dict[str, Any] | None
    importances: dict[str, float] | None


def build_search_report(name: str, db_url: str | None = None, out: Path | None = None) -> SearchReport:
    """Best trial, parameter importances, optimisation history and slice plots of a study, into results/reports/NAME/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    storage = open_storage(db_url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage)
        raise AblateError(f"no search study named {name!r} in the results DB{did_you_mean(name, names)}; "
                          f"known: {', '.join(names) or 'none yet'}") from None
    out = out or Path("results/reports") / name
    out.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState if any(t.state == s for t in trials)}
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    best = None
    if completed:
        b = study.best_trial
        best = {"number": b.number, "value": b.value, "params": b.params, "run_id": b.user_attrs.get("run_id")}
    importances = None
    if len(completed) >= 2:
        try:
            importances = optuna.importance.get_param_importances(study)
        except Exception:  # noqa: BLE001 - too few distinct values, a single parameter, ...: no importances then
            importances = None
    files: list[Path] = []
    plots: list[tuple[str, Callable[[], Any]]] = [
        ("optimization_history", lambda: optuna.visualization.matplotlib.plot_optimization_history(study)),
        ("slice", lambda: optuna.visualization.matplotlib.plot_slice(study)),
    ]
    if importances:
        plots.append(("param_importances", lambda: optuna.visualization.matplotlib.plot_param_importances(study)))
    if any(t.intermediate_values for t in trials):
        plots.append(("intermediate_values", lambda: optuna.visualization.matplotlib.plot_intermediate_values(study)))
    for stem, plot in plots:
        if not completed and stem != "intermediate_values":
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental plots; matplotlib's notes on single-valued axes
            axes = plot()
        fig = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path)
    df = study.trials_dataframe()
    if len(df):
        df.to_csv(out / "trials.csv", index=False)
        files.append(out / "trials.csv")
    summary = out / "summary.md"
    summary.write_text(_summary_markdown(study, trials, counts, best, importances))
    files.insert(0, summary)
    return SearchReport(out=out, files=files, counts=counts, best=best, importances=importances)


def _summary_markdown(study: optuna.Study, trials: list[FrozenTrial], counts: dict[str, int],
                      best: dict[str, Any] | None, importances: dict[str, float] | None) -> str:
    lines = [f"# Search {study.study_name}", "",
             "Trials: " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items()), ""]
    if best:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["params"].items())
        lines += [f"Best: trial {best['number']} (run {best['run_id']}), final eval loss {best['value']:.4f}: {params}", ""]
    if importances:
        lines += ["| parameter | importance |", "| --- | --- |"]
        lines += [f"| {k} | {v:.3f} |" for k, v in importances.items()] + [""]
    names = sorted({k for t in trials for k in t.params})
    lines += ["| trial | state | run | " + " | ".join(names) + " | final eval loss (pruned: last eval) |",
              "| --- | --- | --- | " + " | ".join("---" for _ in names) + " | --- |"]
    for t in trials:
        vals = [t.params.get(k) for k in names]
        shown = ["" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in vals]
        value = "" if t.value is None else f"{t.value:.4f}"
        if t.state == TrialState.PRUNED and t.intermediate_values:
            value += f" (eval {max(t.intermediate_values)})"
        lines.append(f"| {t.number} | {t.state.name.lower()} | {t.user_attrs.get('run_id', '')} | "
                     + " | ".join(shown) + f" | {value} |")
    return "\n".join(lines) + "\n"
