"""The dashboard's views in a real browser (Debian's chromium through Selenium): a configuration's colour is the
same in the chart and the table, a facet draws one panel per value, hovering a curve highlights it and reads it
out, a selection charts only those runs and compares them, a filter's error stays until the filter is fixed, a
URL reproduces a view, and a search draws its trials as points with the best so far and one slice per parameter.

With ABLATE_UI_SCREENSHOTS=docs it saves the pictures docs/dashboard.md and the README show."""

from __future__ import annotations

import os
import time
import urllib.parse

import pytest

from ablate import store
from ablate.ui.app import make_app
from tests.ui.browser import chromium, need_browser, served, wait_for

pytestmark = pytest.mark.slow


def _shot(driver, name: str) -> None:
    folder = os.environ.get("ABLATE_UI_SCREENSHOTS")
    if folder:
        driver.save_screenshot(os.path.join(folder, f"ui-{name}.png"))


def _rows(driver) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")


def _rgb(hex_colour: str) -> str:
    return "rgb({}, {}, {})".format(*(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)))


def _drawn(driver) -> dict:
    """What the chart's uPlot instances draw: per curve (not band edge), its label and stroke colour."""
    return driver.execute_script("""
        const out = {};
        for (const u of document.getElementById('chart')._plots || [])
          u.series.slice(1).forEach((s) => {
            if (/ (min|max)$/.test(s.label)) return;
            out[s.label] = typeof s.stroke === 'function' ? s.stroke(u, 1) : s.stroke;
          });
        return out;""")


def test_colours_facets_hover_and_a_url_that_reproduces_the_view(ui_db):
    need_browser()
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with served(make_app(store.reader(ui_db["url"]))) as base, chromium() as driver:
        driver.get(base + "/")
        wait_for(lambda: "tiny-search" in driver.find_element(By.ID, "searches").text, what="the sweeps page")
        _shot(driver, "sweeps")
        driver.get(f"{base}/sweep?name=widths")
        wait_for(lambda: len(_rows(driver)) == 8, what="the runs table")
        chart = driver.find_element(By.ID, "chart")
        wait_for(lambda: chart.get_attribute("data-series") == "4", what="a curve per configuration")
        drawn = _drawn(driver)
        # the table's chip of each run is drawn in its configuration's curve colour
        series = driver.execute_script("return JSON.parse(document.getElementById('chart').dataset.colors)")
        assert series == drawn and len(set(drawn.values())) == 2  # two hues (architecture), dashes tell widths
        for row in _rows(driver):
            line = row.find_element(By.CSS_SELECTOR, ".line-chip line")
            shown = driver.execute_script("return getComputedStyle(arguments[0]).stroke", line)
            arch = row.find_elements(By.TAG_NAME, "td")[4].text  # pick, run, status, progress, architecture
            want = {label.split()[0].split("=")[1]: colour for label, colour in drawn.items()}[arch]
            assert shown == _rgb(want), (arch, shown, want)
        legend = driver.find_element(By.ID, "chart-legend").text
        assert "colour: architecture" in legend and "dash: d_model" in legend

        # small multiples: one panel per width, one y scale for all
        Select(driver.find_element(By.ID, "facet")).select_by_visible_text("d_model")
        wait_for(lambda: chart.get_attribute("data-panels") == "2" and
                 len(chart.find_elements(By.CSS_SELECTOR, ".panel canvas")) == 2, what="two panels")
        ranges = driver.execute_script("return document.getElementById('chart')._plots.map((u) => [u.scales.y.min, u.scales.y.max])")
        assert ranges[0] == ranges[1]
        # the PNG download: both panels in one image, as wide as the chart, with the curves' colours in it
        png = driver.execute_script("""
            const c = chartCanvas(document.getElementById('chart')), ctx = c.getContext('2d');
            const px = ctx.getImageData(0, 0, c.width, c.height).data, seen = new Set();
            for (let i = 0; i < px.length; i += 4) seen.add(px[i] + ',' + px[i + 1] + ',' + px[i + 2]);
            return [c.width / (window.devicePixelRatio || 1), document.getElementById('chart').scrollWidth,
                    c.toDataURL('image/png').slice(0, 22), [...seen]];""")
        assert png[0] == png[1] and png[2] == "data:image/png;base64,"
        pixels = [tuple(map(int, p.split(","))) for p in png[3]]
        for colour in drawn.values():  # each curve's colour is in the image (within anti-aliasing)
            want = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
            assert min(sum(abs(a - b) for a, b in zip(p, want)) for p in pixels) <= 24, colour
        assert "facet=d_model" in driver.current_url

        # hover: the mouse on a curve highlights it and reads out its values
        plot_index, label, x, y = driver.execute_script("""
            const u = document.getElementById('chart')._plots[0], i = Math.floor(u.data[0].length / 2);
            return [0, u.series[1].label, u.valToPos(u.data[0][i], 'x'), u.valToPos(u.data[1][i], 'y')];""")
        over = chart.find_elements(By.CSS_SELECTOR, ".u-over")[plot_index]
        ActionChains(driver).move_to_element_with_offset(over, int(x - over.size["width"] / 2),
                                                         int(y - over.size["height"] / 2)).perform()
        panel = chart.find_elements(By.CSS_SELECTOR, ".panel")[plot_index]
        wait_for(lambda: panel.get_attribute("data-focused") == label, what="the hovered curve highlighted")
        assert label in panel.find_element(By.CSS_SELECTOR, ".readout").text
        assert "eval loss" in panel.find_element(By.CSS_SELECTOR, ".readout").text
        _shot(driver, "sweep")

        # the URL carries the view: opening it again draws the same thing
        view = f"{base}/sweep?" + urllib.parse.urlencode({"name": "widths", "filter": "architecture=llama",
                                                          "group": "runs", "facet": "d_model", "x": "tokens"})
        driver.get(view)
        wait_for(lambda: len(_rows(driver)) == 4, what="the filtered table from the URL")
        chart = driver.find_element(By.ID, "chart")
        wait_for(lambda: chart.get_attribute("data-series") == "4" and chart.get_attribute("data-panels") == "2",
                 what="a curve per llama run, in two panels")
        assert driver.find_element(By.ID, "filter").get_attribute("value") == "architecture=llama"
        assert driver.find_element(By.ID, "x").get_attribute("value") == "tokens"
        assert Select(driver.find_element(By.ID, "facet")).first_selected_option.text == "d_model"
        assert float(chart.get_attribute("data-xmax")) == 400 * 1024


def test_a_selection_charts_its_runs_and_compares_them(ui_db):
    need_browser()
    from selenium.webdriver.common.by import By

    first, fifth = ui_db["ids"][0], ui_db["ids"][4]
    with served(make_app(store.reader(ui_db["url"]))) as base, chromium() as driver:
        driver.get(f"{base}/sweep?name=widths&group=runs")
        wait_for(lambda: len(_rows(driver)) == 8, what="the runs table")
        chart = driver.find_element(By.ID, "chart")
        wait_for(lambda: chart.get_attribute("data-series") == "8", what="a curve per run")
        assert not driver.find_element(By.ID, "selection").is_displayed()
        for run in (first, fifth):
            driver.find_element(By.CSS_SELECTOR, f'input.pick[data-run="{run}"]').click()
        wait_for(lambda: chart.get_attribute("data-series") == "2", what="only the selected runs charted")
        labels = sorted(_drawn(driver))
        assert len(labels) == 2 and labels[0].startswith(f"run {first}:") and labels[1].startswith(f"run {fifth}:")
        assert f"runs={first}%2C{fifth}" in driver.current_url or f"runs={first},{fifth}" in driver.current_url
        assert "2 runs selected" in driver.find_element(By.ID, "selection").text
        driver.find_element(By.ID, "compare").click()
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#fields tr.differ"), what="the compared fields")
        differ = {r.get_attribute("data-field") for r in driver.find_elements(By.CSS_SELECTOR, "#fields tr.differ")}
        assert {"architecture", "config.architecture"} <= differ and "d_model" not in differ
        assert not driver.find_elements(By.CSS_SELECTOR, '#fields tr[data-field="d_model"]')  # equal: hidden
        wait_for(lambda: driver.find_element(By.ID, "diff").get_attribute("data-series") == "1", what="the difference")
        driver.find_element(By.ID, "seeds").click()  # their configurations: the mean over each one's seeds
        wait_for(lambda: all("(n=2" in label for label in _drawn(driver)) and len(_drawn(driver)) == 2,
                 what="the configurations' seed means")
        assert "seeds=1" in driver.current_url
        _shot(driver, "compare")
        driver.get(f"{base}/run/{first}")
        wait_for(lambda: driver.find_element(By.ID, "chart").get_attribute("data-series") == "2", what="a run's curves")
        key = driver.find_element(By.ID, "chart-legend")  # which colour is which split
        assert [i.text for i in key.find_elements(By.CSS_SELECTOR, ".key-item")] == ["train", "eval"], key.text
        _shot(driver, "run")


def test_a_filter_error_stays_until_the_filter_is_fixed(ui_db):
    need_browser()
    from selenium.webdriver.common.by import By

    with served(make_app(store.reader(ui_db["url"]))) as base, chromium() as driver:
        driver.get(f"{base}/sweep?name=widths")
        wait_for(lambda: len(_rows(driver)) == 8, what="the runs table")
        box = driver.find_element(By.ID, "filter")
        box.send_keys("nosuch=1")
        error = driver.find_element(By.ID, "filter-error")
        wait_for(lambda: "no column 'nosuch'" in error.text, what="the filter's error")
        time.sleep(7)  # two polls of the live page: neither hides the error nor fills the table
        assert error.is_displayed() and "no column 'nosuch'" in error.text
        assert _rows(driver) == [] and "the filter has an error" in driver.find_element(By.ID, "matched").text
        box.clear()
        box.send_keys("d_model=64")
        wait_for(lambda: len(_rows(driver)) == 4, what="the fixed filter's rows")
        assert not error.is_displayed()


def test_a_search_draws_trials_as_points_the_best_so_far_and_slices(ui_db):
    need_browser()
    from selenium.webdriver.common.by import By

    with served(make_app(store.reader(ui_db["url"]))) as base, chromium() as driver:
        driver.get(f"{base}/search?name=tiny-search")
        chart = driver.find_element(By.ID, "chart")
        wait_for(lambda: chart.get_attribute("data-series") == "3", what="completed, pruned and best so far")
        drawn = _drawn(driver)
        assert set(drawn) == {"completed", "pruned (last reported value)", "best so far"}
        xs = driver.execute_script("return document.getElementById('chart')._plots[0].data[0]")
        assert xs == [0, 1, 2]  # trials at whole numbers
        slices = driver.find_elements(By.CSS_SELECTOR, "#slices .slice")
        assert {s.get_attribute("data-param") for s in slices} == {"heads", "lr"}
        wait_for(lambda: all(s.find_elements(By.TAG_NAME, "canvas") for s in slices), what="the slice plots")
        ticks = driver.execute_script("""const u = document.querySelector('#slices .slice[data-param="heads"]')._plots[0];
                                         return u.axes[0]._values;""")  # a categorical's ticks: its choices, not 0, 1, 2
        assert "4" in ticks and set(ticks) - {""} <= {"1", "2", "4"}, ticks
        assert "importances need" in driver.find_element(By.ID, "importances").text  # 2 completed trials: too few
        _shot(driver, "search")
