"""What the dashboard's views are made of, on the server (FastAPI's test client over a real results DB): one style
per configuration decided over the whole sweep, facets, a selection, the column chooser, CSV and SVG downloads,
the comparison of runs with its difference curve, progress as budget used, and a search's importances."""

from __future__ import annotations

import csv
import io
import itertools

import numpy as np
import pytest

from ablate.results.searches import importances
from ablate.results.status import progress
from ablate.ui import charts
from tests.ui.conftest import HOSTILE, loss


def _rows_24() -> list[dict]:
    """A sweep of 24 configurations (2 architectures x 3 widths x 4 learning rates) x 4 seeds."""
    grid = itertools.product(("mixer", "llama"), (32, 64, 128), (1e-3, 3e-3, 1e-2, 3e-2), range(4))
    return [{"run": i + 1, "architecture": a, "d_model": d, "lr": lr, "seed": s}
            for i, (a, d, lr, s) in enumerate(grid)]


def test_24_configurations_get_24_styles_that_say_their_axes():
    rows = _rows_24()
    cols = ["run", "status", "progress", "architecture", "d_model", "lr", "seed", "steps", "train", "eval"]
    keys = charts.group_keys("seeds", cols)
    style = charts.styles(rows, keys)
    assert (style["color"], style["dash"], style["shade"]) == ("architecture", "d_model", ["lr"])
    looks = {(r["architecture"], r["d_model"], r["lr"]): tuple(map(str, style["of"](r))) for r in rows}
    assert len(looks) == 24 and len(set(looks.values())) == 24  # no two configurations drawn alike
    # the colour's hue is the architecture's and the dash the width's, whatever the other axes say
    for (arch, width, _), (colour, dash) in looks.items():
        assert dash == str(style["dashes"][str(width)])
        assert _hue(colour) == pytest.approx(_hue(style["colors"][arch]), abs=0.02)
    # a filter changes what is drawn, not how: the style is the sweep's, so the subset keeps its colours
    subset = charts.styles(rows, keys)["of"]
    assert all(subset(r) == style["of"](r) for r in rows if r["d_model"] == 64)
    by_lr = charts.styles(rows, keys, color="lr", dash="architecture")
    assert len(by_lr["colors"]) == 4 and len(by_lr["dashes"]) == 2 and by_lr["shade"] == ["d_model"]
    with pytest.raises(Exception, match="color: no axis 'width'"):
        charts.styles(rows, keys, color="width")


def _hue(colour: str) -> float:
    import colorsys

    return colorsys.rgb_to_hls(*(int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0]


def test_a_configuration_has_one_colour_in_the_table_and_the_chart(client, ui_db):
    rows = client.get("/api/runs", params={"sweep": "widths"}).json()["rows"]
    curves = client.get("/api/curves", params={"sweep": "widths"}).json()
    by_run = {r: s["color"] for s in curves["series"] for r in s["runs"]}
    assert {r["run"]: r["_color"] for r in rows} == by_run
    assert len({s["color"] + str(s["dash"]) for s in curves["series"]}) == 4
    assert curves["legend"]["color"] == "architecture" and set(curves["legend"]["colors"]) == {"mixer", "llama"}
    # filtered to one width, the same configurations keep their colour and dash
    narrow = client.get("/api/curves", params={"sweep": "widths", "filter": "d_model=64"}).json()["series"]
    wide = {s["label"]: (s["color"], s["dash"]) for s in curves["series"]}
    assert narrow and all(wide[s["label"]] == (s["color"], s["dash"]) for s in narrow)


def test_facets_selection_and_the_band_note(client, ui_db):
    data = client.get("/api/curves", params={"sweep": "widths", "facet": "d_model"}).json()
    assert sorted({s["facet"] for s in data["series"]}) == [32, 64] and len(data["series"]) == 4
    assert "min–max" in data["note"] and "shortest run" in data["note"]
    facet_runs = client.get("/api/curves", params={"sweep": "widths", "group": "architecture", "facet": "d_model"}).json()
    assert len(facet_runs["series"]) == 4  # the facet axis joins the grouping: one curve per panel and architecture
    first, fifth = ui_db["ids"][0], ui_db["ids"][4]
    picked = client.get("/api/curves", params={"sweep": "widths", "group": "runs", "runs": f"{first},{fifth}",
                                               "filter": "architecture=mixer"}).json()["series"]
    assert [s["runs"] for s in picked] == [[first], [fifth]]  # the selection wins over the filter
    assert "each line is one run" in client.get("/api/curves", params={"sweep": "widths", "group": "runs"}).json()["note"]
    assert "facet: no axis 'width'" in client.get("/api/curves", params={"sweep": "widths", "facet": "width"}).json()["error"]
    assert "runs: give run ids" in client.get("/api/curves", params={"sweep": "widths", "runs": "1;2"}).json()["error"]


def test_the_column_chooser_and_the_csv_of_every_matching_run(client, ui_db):
    page = client.get("/api/runs", params={"sweep": "widths", "columns": "status,params,tokens_per_second,lr"}).json()
    assert page["columns"] == ["run", "status", "params", "tokens_per_second", "lr"]
    assert {"params", "flops_per_token", "code_version", "host", "lr"} <= set(page["available"])
    assert "columns: no column 'nope'" in client.get("/api/runs", params={"sweep": "widths", "columns": "nope"}).json()["error"]
    sent = client.get("/api/runs.csv", params={"sweep": "widths", "filter": "architecture=llama", "sort": "-d_model",
                                               "columns": "d_model,params,status", "limit": 1})
    assert sent.headers["content-type"].startswith("text/csv") and 'filename="widths-runs.csv"' in sent.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(sent.text)))
    assert [r["d_model"] for r in table] == ["64", "64", "32", "32"]  # every match, not one page, in the sort's order
    assert list(table[0]) == ["run", "d_model", "params", "status"] and table[-1]["params"] == "32000"
    hostile = list(csv.DictReader(io.StringIO(
        client.get("/api/runs.csv", params={"sweep": ui_db["hostile"], "columns": "reason"}).text)))
    assert hostile[0]["reason"] == f"RuntimeError: {HOSTILE}"  # text stays text; a formula-looking cell is quoted:
    from ablate.ui.table import csv_text

    assert csv_text([{"a": "=HYPERLINK(1)", "b": -1.5}], ["a", "b"]).splitlines()[1] == "'=HYPERLINK(1),-1.5"


def test_the_chart_downloads_as_svg_with_its_facets(client, ui_db):
    sent = client.get("/api/curves.svg", params={"sweep": "widths", "facet": "architecture", "logy": "true"})
    assert sent.status_code == 200 and sent.headers["content-type"].startswith("image/svg+xml")
    svg = sent.text
    assert svg.count('id="axes_') == 2 and "<script" not in svg
    colours = {s["color"] for s in client.get("/api/curves", params={"sweep": "widths"}).json()["series"]}
    assert all(c in svg for c in colours)  # the same colours as the page


def test_compare_marks_the_fields_that_differ_and_draws_the_difference(client, ui_db):
    a, b = ui_db["ids"][0], ui_db["ids"][5]  # mixer d32 seed 0, llama d32 seed 1
    data = client.get("/api/compare", params={"runs": f"{a},{b}", "x": "steps", "y": "eval"}).json()
    differ = {f["field"] for f in data["fields"] if f["differ"]}
    assert {"architecture", "seed", "heads", "config.architecture", "config.seed"} <= differ
    assert "d_model" not in differ and "config.d_model" not in differ
    assert data["fields"][0]["differ"] and not data["fields"][-1]["differ"]  # the differing ones first
    (diff,) = data["differences"]
    x = np.array(diff["x"])
    want = loss("llama", 32, 1, x) - loss("mixer", 32, 0, x)  # both logged at the same steps: exact between them
    logged = np.isin(x, np.arange(0, 401, 40))
    assert logged.sum() >= 2 and np.allclose(np.array(diff["mean"])[logged], want[logged], atol=1e-6)
    # each run for its configuration: the mean over its seeds, and the difference of the means (llama 0.3 lower)
    configs = client.get("/api/compare", params={"runs": f"{a},{b}", "seeds": "true"}).json()
    assert [c["n"] for c in configs["series"]] == [2, 2] and configs["fields"][0]["values"] == [
        f"{a}, {ui_db['ids'][1]}", f"{b}, {ui_db['ids'][4]}"]
    assert np.allclose(configs["differences"][0]["mean"], -0.3, atol=1e-6)
    assert "give 2 to 8 run ids" in client.get("/api/compare", params={"runs": str(a)}).json()["error"]
    assert "no run with id 99999" in client.get("/api/compare", params={"runs": f"{a},99999"}).json()["error"]
    assert client.get("/compare", params={"runs": f"{a},{b}"}).status_code == 200


class _Row:
    def __init__(self, status, kind, amount, **kw):
        self.status, self.budget_kind, self.budget_amount = status, kind, amount
        self.train_seconds = self.last_elapsed_seconds = self.steps = self.last_step = self.tokens = None
        self.flops_per_token = None
        self.__dict__.update(kw)


def test_progress_is_the_budget_used_whatever_the_status():
    assert progress(_Row("diverged", "steps", 400, last_step=200)) == 0.5  # not 100% because it finished
    assert progress(_Row("oom", "wall_clock", 60, last_elapsed_seconds=15.0)) == 0.25
    assert progress(_Row("failed", "tokens", 1000, tokens=100)) == 0.1
    assert progress(_Row("pruned", "flops", 1e6, tokens=100, flops_per_token=2500.0)) == 0.25
    assert progress(_Row("completed", "steps", 400, steps=390)) == 1.0
    assert progress(_Row("cancelled", "steps", 400)) is None


def test_importances_find_the_parameter_that_moves_the_value():
    """Simulated trials whose value depends on lr only: PED-ANOVA gives lr nearly all the importance."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, distribution_to_json

    rng = np.random.default_rng(0)
    trials = []
    for n in range(60):
        lr, heads = float(10 ** rng.uniform(-4, -1)), int(rng.choice([1, 2, 4]))
        trials.append({"number": n, "state": "COMPLETE", "value": (np.log10(lr) + 2.5) ** 2, "params": {"lr": lr, "heads": heads}})
    kinds = {"lr": {"json": distribution_to_json(FloatDistribution(1e-4, 1e-1, log=True))},
             "heads": {"json": distribution_to_json(CategoricalDistribution([1, 2, 4]))}}
    found = importances(trials, kinds, "minimize")
    assert found["values"]["lr"] > 0.8 > found["values"]["heads"]
    assert importances(trials[:3], kinds, "minimize")["values"] == {}
