"""The dashboard in a real browser (Debian's chromium through Selenium): the sweep page lists the runs, a chart
draws its points, a point written to the DB while the page is open appears without a reload, the filter narrows
the table, and a hostile sweep name and error text render as text (no script of theirs runs)."""

from __future__ import annotations

import urllib.parse

import pytest

from ablate import store
from ablate.ui.app import make_app
from tests.ui.browser import chromium, need_browser, served, wait_for
from tests.ui.conftest import HOSTILE, loss, write_curve

pytestmark = pytest.mark.slow


def _rows(driver) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")


def _cell(driver, run_id: int, column: str) -> str:
    from selenium.webdriver.common.by import By

    cols = [th.get_attribute("data-column") for th in driver.find_elements(By.CSS_SELECTOR, "#runs thead th")]
    row = driver.find_element(By.CSS_SELECTOR, f'#runs tbody tr[data-run="{run_id}"]')
    return row.find_elements(By.TAG_NAME, "td")[cols.index(column)].text


def test_the_sweep_page_lists_draws_follows_and_filters_in_a_real_browser(ui_db, tmp_path):
    need_browser()
    from selenium.webdriver.common.by import By

    engine = store.reader(ui_db["url"])
    running = ui_db["ids"][-1]
    with served(make_app(engine, label="results/ablate.db")) as base, chromium() as driver:
        driver.get(f"{base}/sweep?name=widths")
        wait_for(lambda: len(_rows(driver)) == len(ui_db["ids"]), what="the runs table")
        chart = driver.find_element(By.ID, "chart")
        wait_for(lambda: chart.find_elements(By.TAG_NAME, "canvas"), what="the chart's canvas")
        points = int(wait_for(lambda: chart.get_attribute("data-points"), what="the chart's points"))
        assert points > 20 and int(chart.get_attribute("data-series")) == 4  # 4 configurations, seeds as bands
        wait_for(lambda: "Method: Welch" in driver.find_element(By.ID, "study").text, what="the study's claims table")
        said = driver.find_element(By.ID, "answer").text  # the answer in words, at the top of the page
        assert said.startswith("Claim 1: ") and " nats [" in said and "the study's claim" in said, said
        assert driver.find_element(By.ID, "answer-section").location["y"] < chart.location["y"]
        heads = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "#study h3")]
        assert heads[0] == "Claims against the study" and len(heads) > 1, heads  # the claims before the tables
        assert _cell(driver, running, "steps") == "200"
        assert float(chart.get_attribute("data-xmax")) == 400  # the other configurations' last eval

        # a trainer flushes more points while the page is open: the row and the chart follow without a reload
        run = ui_db["runs"][running]
        writer = store.connect(ui_db["url"])
        write_curve(writer, running, run.architecture, run.d_model, run.seed, range(202, 321, 2))
        wait_for(lambda: _cell(driver, running, "steps") == "320", what="the new step in the table")
        want = f"{loss(run.architecture, run.d_model, run.seed, 320) + 0.05:.3f}"
        assert _cell(driver, running, "eval") == want
        driver.find_element(By.ID, "group").clear()
        driver.find_element(By.ID, "group").send_keys("runs\n")  # one curve per run: the running one ends at 320
        wait_for(lambda: chart.get_attribute("data-series") == str(len(ui_db["ids"])), what="one curve per run")
        assert int(chart.get_attribute("data-points")) > points

        # the filter narrows the table (and the chart) to what it matches
        box = driver.find_element(By.ID, "filter")
        box.send_keys("d_model=64 architecture=mixer")
        wait_for(lambda: len(_rows(driver)) == 2, what="the filtered table")
        assert {_cell(driver, int(r.get_attribute("data-run")), "d_model") for r in _rows(driver)} == {"64"}
        wait_for(lambda: chart.get_attribute("data-series") == "2", what="the filtered chart (a curve per run)")
        box.send_keys(" nosuch=1")
        wait_for(lambda: "no column 'nosuch'" in driver.find_element(By.ID, "filter-error").text, what="the filter's error")


def test_a_hostile_sweep_name_and_error_text_render_as_text(ui_db):
    need_browser()
    from selenium.webdriver.common.by import By

    engine = store.reader(ui_db["url"])
    with served(make_app(engine)) as base, chromium() as driver:
        driver.get(base + "/")
        wait_for(lambda: ui_db["hostile"] in driver.find_element(By.ID, "sweeps").text, what="the sweeps list")
        driver.get(f"{base}/sweep?{urllib.parse.urlencode({'name': ui_db['hostile']})}")
        wait_for(lambda: len(_rows(driver)) == 8, what="the hostile sweep's runs")
        assert driver.find_element(By.ID, "sweep-name").text == ui_db["hostile"]
        assert HOSTILE in _cell(driver, ui_db["failed"], "reason")
        driver.get(f"{base}/run/{ui_db['failed']}")
        wait_for(lambda: HOSTILE in driver.find_element(By.ID, "run-error").text, what="the run's error")
        assert "traceback line 2" in driver.find_element(By.ID, "run-error").text
        assert driver.execute_script("return window.__pwned") is None  # neither the script nor the onerror ran
        assert not driver.find_elements(By.CSS_SELECTOR, "main script, main img")


def test_a_search_page_lists_its_trials_and_draws_their_values(ui_db):
    need_browser()
    from selenium.webdriver.common.by import By

    with served(make_app(store.reader(ui_db["url"]))) as base, chromium() as driver:
        driver.get(base + "/")
        wait_for(lambda: "tiny-search" in driver.find_element(By.ID, "searches").text, what="the searches list")
        driver.find_element(By.CSS_SELECTOR, "#searches a").click()
        wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#trials tbody tr")) == 3, what="the trials")
        assert "pruned" in driver.find_element(By.CSS_SELECTOR, '#trials tr[data-trial="2"]').text
        chart = driver.find_element(By.ID, "chart")
        # 2 completed trials, the pruned one's last report, the best so far at the 2 completed ones
        assert wait_for(lambda: chart.get_attribute("data-points"), what="the values' chart") == "5"
