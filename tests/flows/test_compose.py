"""docker-compose.yml and the Dockerfile: no Docker engine runs here, so the stack is checked by its properties
(what a lab's V100 box and head node need) and, where Debian's docker-compose is installed (.ci/run installs
it), by `docker-compose config`, which validates the file without an engine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ablate.cli import cli

REPO = Path(__file__).resolve().parents[2]
SECRETS = {"ABLATE_PG_PASSWORD": "s3cret-app", "ABLATE_PG_ADMIN_PASSWORD": "s3cret-admin",
           "ABLATE_PG_READ_PASSWORD": "s3cret-read"}


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _services() -> dict:
    return _compose()["services"]


def _env_values() -> list[str]:
    envs = [_compose()["x-ablate-env"]] + [svc.get("environment") or {} for svc in _services().values()]
    return [v for env in envs for v in env.values() if isinstance(v, str)]


def test_no_service_connects_to_postgres_as_the_superuser():
    superuser = _services()["postgres"]["environment"]["POSTGRES_USER"]
    urls = [v for v in _env_values() if re.match(r"postgresql(\+\w+)?://", v)]
    assert superuser == "postgres" and urls
    for url in urls:
        user = re.match(r"postgresql(\+\w+)?://([^:@/]+)", url).group(2)
        assert user in ("ablate", "ablate_reader") and user != superuser, url
    # `ablate sql` reads with its own login, which can only read (ablate/readlogin.py)
    assert _compose()["x-ablate-env"]["ABLATE_READ_URL"].startswith(
        "postgresql+psycopg://ablate_reader:${ABLATE_PG_READ_PASSWORD:?")


def test_no_credential_has_a_default_and_nothing_listens_beyond_the_bind_address():
    for value in _env_values():
        for password in re.findall(r"://[^:@/]+:([^@]+)@", value):
            assert password.startswith(("${ABLATE_PG_PASSWORD:?", "${ABLATE_PG_READ_PASSWORD:?")), value  # required
    assert _services()["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${ABLATE_PG_ADMIN_PASSWORD")
    for name, svc in _services().items():
        for port in svc.get("ports", []):
            assert port.startswith("${ABLATE_BIND:-127.0.0.1}:"), (name, port)


def test_postgres_init_takes_the_password_from_the_environment_and_makes_plain_roles():
    script = (REPO / "docker" / "postgres-init.sql").read_text()
    sql = " ".join(line.split("--")[0] for line in script.splitlines()).upper()
    assert re.search(r"CREATE ROLE ABLATE LOGIN PASSWORD :'PW' NOSUPERUSER\b", sql)
    assert not re.search(r"(?<!NO)SUPERUSER", sql), "ablate must not be a superuser"
    assert re.search(r"CREATE ROLE ABLATE_READER LOGIN PASSWORD :'RPW' NOSUPERUSER NOCREATEDB NOCREATEROLE "
                     r"NOREPLICATION\s*;", sql)  # `ablate sql`'s own login, a member of no other role
    assert not re.search(r"GRANT \w+ TO ABLATE_READER", sql)
    assert "GRANT ABLATE_READER TO ABLATE;" in sql  # so migration 0005 grants it SELECT and `ablate sql` may SET ROLE
    assert "CREATE DATABASE ABLATE OWNER ABLATE;" in sql and "CREATE DATABASE PREFECT OWNER ABLATE;" in sql
    shell = (REPO / "docker" / "postgres-init.sh").read_text()
    assert '${ABLATE_PG_PASSWORD:?' in shell and '-v pw="$ABLATE_PG_PASSWORD"' in shell
    assert '${ABLATE_PG_READ_PASSWORD:?' in shell and '-v rpw="$ABLATE_PG_READ_PASSWORD"' in shell
    assert os.access(REPO / "docker" / "postgres-init.sh", os.X_OK)
    mounts = _services()["postgres"]["volumes"]
    assert "./docker/postgres-init.sh:/docker-entrypoint-initdb.d/10-roles.sh:ro" in mounts
    assert "./docker/postgres-init.sql:/etc/ablate/postgres-init.sql:ro" in mounts  # not run by the entrypoint itself
    assert "-f /etc/ablate/postgres-init.sql" in shell


def test_every_service_of_the_image_can_build_it_on_its_own_machine():
    users = {n: s for n, s in _services().items() if s.get("image", "").startswith("ablate:")}
    assert {"prefect-server", "deployer", "sweep-worker", "cpu-worker", "gpu-worker"} <= set(users)
    for name, svc in users.items():
        assert svc["build"]["context"] == ".", name
        assert "cu126" in svc["build"]["args"]["TORCH_INDEX"], name  # V100s: see the Dockerfile


def test_start_order_waits_for_health_and_the_one_shot_deployer():
    services = _services()
    server = services["prefect-server"]["environment"]  # logs reach `prefect deployment run --watch`
    assert server["PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED"] == server["PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED"] == "true"
    assert "healthcheck" in services["prefect-server"] and "/api/health" in str(services["prefect-server"]["healthcheck"])
    assert services["deployer"]["depends_on"]["prefect-server"] == {"condition": "service_healthy"}
    assert services["deployer"]["restart"] == "no"
    for name in ("sweep-worker", "cpu-worker"):
        assert services[name]["depends_on"]["deployer"] == {"condition": "service_completed_successfully"}
    for name in ("postgres", "prefect-server", "sweep-worker", "cpu-worker", "gpu-worker"):
        assert services[name]["restart"] == "unless-stopped", name


def test_workers_run_one_trial_per_gpu_share_artifacts_and_ipc():
    services = _services()
    gpu = services["gpu-worker"]
    assert gpu["command"][:4] == ["ablate", "worker", "--pool", "${ABLATE_POOL:-rtx3060}"]
    assert "--gpus-per-trial" in gpu["command"] and gpu["ipc"] == "host"
    assert services["cpu-worker"]["command"][:4] == ["ablate", "worker", "--pool", "cpu"]
    for name in ("deployer", "sweep-worker", "cpu-worker", "gpu-worker"):  # one shared folder (NFS), not a volume
        assert services[name]["volumes"] == ["${ABLATE_ARTIFACTS_DIR:-./artifacts}:/artifacts"], name
    assert "artifacts" not in (_compose().get("volumes") or {})


def test_the_commands_the_services_run_exist():
    subcommands = cli.commands
    for name, svc in _services().items():
        command = svc.get("command")
        if not command:
            continue
        text = " ".join(command)
        for sub in re.findall(r"\bablate (\w+)", text):
            assert sub in subcommands, (name, sub)
        assert command[0] in ("ablate", "prefect", "sh"), name
    dockerfile = (REPO / "Dockerfile").read_text()
    for folder in ("ablate", "flows", "sweeps"):  # what `ablate deploy` and the flows read
        assert f"COPY {folder} ./{folder}" in dockerfile
    torch_line = dockerfile.index('pip install "torch==')
    assert torch_line < dockerfile.index("COPY ablate")  # torch in its own layer, before the code
    assert "ENV ABLATE_CODE_VERSION" in dockerfile


def test_the_code_version_comes_from_the_image_stamp_without_a_checkout(monkeypatch, tmp_path):
    from ablate.store import register

    monkeypatch.setenv("ABLATE_CODE_VERSION", "abc1234")
    # as in an image: no .git above it
    monkeypatch.setattr(register, "__file__", str(tmp_path / "ablate" / "store" / "register.py"))
    assert register.code_version() == "abc1234"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose is not installed "
                    "(`apt-get install docker-compose`; .ci/run installs it)")
def test_docker_compose_config_accepts_the_file_and_refuses_it_without_a_password():
    env = {**os.environ, **SECRETS}
    ok = subprocess.run(["docker-compose", "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    assert "s3cret-app" in resolved["services"]["deployer"]["environment"]["ABLATE_DB_URL"]
    assert "ablate_reader:s3cret-read@" in resolved["services"]["deployer"]["environment"]["ABLATE_READ_URL"]
    no_read = {k: v for k, v in env.items() if k != "ABLATE_PG_READ_PASSWORD"}
    refused = subprocess.run(["docker-compose", "config"], cwd=REPO, env=no_read, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode != 0 and "set ABLATE_PG_READ_PASSWORD" in refused.stderr
    env.pop("ABLATE_PG_PASSWORD")
    refused = subprocess.run(["docker-compose", "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "set ABLATE_PG_PASSWORD" in refused.stderr


def test_deploy_without_a_server_says_what_to_do(monkeypatch):
    import socket

    from ablate.config.errors import AblateError
    from flows.deploy import wait_for_api
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free: nothing listens there
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        with pytest.raises(AblateError, match=r"did not answer within 2 s .*Start the server"):
            wait_for_api(timeout=2, say=lambda _: None)
