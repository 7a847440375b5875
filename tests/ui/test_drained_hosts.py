"""The dashboard says which hosts of a sweep's pool are drained, as `ablate sweep status` does: from the pool's paused
host queues on a real Prefect API server (flows/health.py), asked at most every HOSTS_EVERY seconds (ablate/ui/reads.py), and nothing
without an API."""

from __future__ import annotations

import time

import yaml

from ablate import runner, store


def test_the_sweep_page_says_a_drained_host_of_its_pool_and_its_reason(prefect_api, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from ablate.ui import app as ui
    from ablate.ui import reads
    from flows.deploy import ensure_host_queue
    from flows.health import mark_drained

    pool = f"lab-{time.monotonic_ns() % 10**9}"
    spec = {"name": "drained", "dataset": {"source": "ablate:tinystories-sample"},
            "budget": {"steps": 10, "hardware": pool}, "defaults": {"layers": 1, "context": 32, "batch_size": 2, "lr": 1e-3},
            "grid": [{"architecture": "mixer", "d_model": 16}]}
    (tmp_path / "drained.yaml").write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    runner.register(tmp_path / "drained.yaml", url)
    ensure_host_queue(pool, runner.host_queue("gpu-a"))
    ensure_host_queue(pool, runner.host_queue("gpu-b"))
    mark_drained(pool, runner.host_queue("gpu-a"), "3 trials in a row failed on this host for host reasons")

    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    client = TestClient(ui.make_app(store.reader(url)), base_url="http://127.0.0.1")
    page = client.get("/api/runs", params={"sweep": "drained"}).json()
    assert page["hosts"] == [f"host gpu-a is drained (pool {pool}): 3 trials in a row failed on this host for host "
                             "reasons"], page["hosts"]
    mark_drained(pool, runner.host_queue("gpu-a"), None)  # taken back: said at the next ask, not at every poll
    assert client.get("/api/runs", params={"sweep": "drained"}).json()["hosts"] == page["hosts"]
    monkeypatch.setattr(reads, "HOSTS_EVERY", 0.0)
    assert client.get("/api/runs", params={"sweep": "drained"}).json()["hosts"] == []
    sweep_js = (ui.HERE / "static" / "sweep.js").read_text()
    assert '$("hosts").textContent = (data.hosts || []).join("; ")' in sweep_js  # the page draws the field
    html = client.get("/sweep", params={"name": "drained"}).text
    assert 'id="hosts"' in html

    monkeypatch.delenv("PREFECT_API_URL")  # no Prefect API: nothing asked, nothing said
    alone = TestClient(ui.make_app(store.reader(url)), base_url="http://127.0.0.1")
    assert alone.get("/api/runs", params={"sweep": "drained"}).json()["hosts"] == []
