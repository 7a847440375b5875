"""Which hosts of a pool are live, by ablate's rule, and when a run sent to one host's queue goes to any worker
instead: against a real Prefect API server. The workers here are worker records made by heartbeats, which is all a
stopped worker leaves behind (tests/flows/test_cluster_hosts.py runs real `ablate worker`s)."""

from __future__ import annotations

import datetime as dt
import time

from flows.hosts import host_gone, live_hosts


def test_a_host_that_stopped_beating_is_not_live_and_a_run_sent_to_it_goes_elsewhere(prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"lab-{time.monotonic_ns() % 10**9}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        since = dt.datetime.now(dt.timezone.utc)
        for host in ("gpu-a", "gpu-b"):  # HOST-POOL-GPUS-PID, as `ablate worker` names them; a beat every 2 s
            client.send_worker_heartbeat(pool, f"{host}-{pool}-cpu-41", heartbeat_interval_seconds=2)
        client.send_worker_heartbeat(pool, "plain-prefect-worker", heartbeat_interval_seconds=2)
        assert live_hosts(client, pool) == ["gpu-a", "gpu-b"]  # a plain Prefect worker names no host
        assert host_gone(client, pool, "gpu-b", since) is None  # it beat since the run was sent
        later = dt.datetime.now(dt.timezone.utc)
        assert host_gone(client, pool, "gpu-b", later) is None  # not yet: within one beat's bound (1.5 x 2 s + 2 s)
        deadline = time.monotonic() + 30
        while live_hosts(client, pool) != ["gpu-a"] and time.monotonic() < deadline:
            client.send_worker_heartbeat(pool, f"gpu-a-{pool}-cpu-41", heartbeat_interval_seconds=2)
            time.sleep(1)  # gpu-a beats on; gpu-b has stopped
        assert live_hosts(client, pool) == ["gpu-a"]
        waited = host_gone(client, pool, "gpu-b", later)
        assert waited is not None and waited > 5.0, waited  # gone: the run goes to any worker
        # as gone for a run sent before its last beat: a host that beat once more after the run was sent, then
        # stopped, never takes it (the run waited on its queue for ever: the cluster's drain scenario)
        assert host_gone(client, pool, "gpu-b", since) is not None
        assert host_gone(client, pool, "gpu-a", later) is None
        # a host with no worker record at all: gone once Prefect's default interval's bound (47 s) has passed
        assert host_gone(client, pool, "gpu-c", later) is None
        long_ago = later - dt.timedelta(seconds=60)
        assert host_gone(client, pool, "gpu-c", long_ago) > 59


def test_a_worker_host_is_checked_against_its_pools_trial_deployment(prefect_api, tmp_path, monkeypatch):
    """`ablate worker`'s check at start reads the trial deployment of its pool (a real Prefect API): the checkout
    at the path its flow runs start from, its results DB, its artifacts folder, and a GPU for a GPU pool."""
    import pytest
    from prefect.client.orchestration import get_client

    from ablate.config.errors import AblateError
    from flows.health import check_host

    monkeypatch.delenv("ABLATE_DB_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # an undeployed pool's artifacts: results/artifacts here
    repo = __import__("pathlib").Path(__file__).resolve().parents[2]
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    pools = {"good": (repo, f"sqlite:///{tmp_path / 'results.db'}", tmp_path / "art"),
             "bad": (tmp_path / "elsewhere", f"sqlite:///{tmp_path / 'gone' / 'results.db'}", blocked / "art"),
             "v100": (repo, f"sqlite:///{tmp_path / 'results.db'}", tmp_path / "art")}
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("trial")
        for pool, (checkout, db, art) in pools.items():
            client.create_deployment(
                flow_id=flow_id, name=pool, parameters={"launch": {"db_url": db, "artifacts": str(art)}},
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(checkout)}}])
    check_host("good", "gpu-a")  # nothing missing: no error
    with pytest.raises(AblateError) as caught:
        check_host("bad", "gpu-a")
    said = str(caught.value)
    assert said.startswith("host gpu-a cannot take trials of pool bad: the deployments run from "
                           f"{tmp_path / 'elsewhere'} (their set_working_directory step)"), said
    assert f"the results database's folder {tmp_path / 'gone'} does not exist here" in said, said
    assert f"the artifacts folder {blocked / 'art'} is not writable" in said, said
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a GPU machine's worker with its GPUs hidden
    with pytest.raises(AblateError, match="pool v100 is a GPU pool but this host shows no GPU"):
        check_host("v100", "gpu-a")
    with pytest.raises(AblateError, match="no results database: set ABLATE_DB_URL"):
        check_host("not-deployed", "gpu-a")  # no deployment yet: the environment's DB, which is unset here
