"""`ablate bundle` (ablate/runner/bundle.py): the node's freeze read, its platform's tags, what travels and what is
left to the node; and end to end, a bundle for this machine installed with --no-index into a venv that holds only
torch, from which `python -m bench gpu --device cpu --quick` runs to the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.config.errors import AblateError
from ablate.runner import bundle
from tests.waiting import patience

REPO = Path(__file__).resolve().parents[2]


def test_a_nodes_freeze_is_read_with_versions_bare_names_and_comments(tmp_path):
    f = tmp_path / "node.txt"
    f.write_text("# the node\ntorch==2.11.0+cu130\nHuggingFace_Hub==1.33.0\nnumpy\n\n-e git+https://x/y#egg=y\n"
                 "pkg @ file:///wheels/pkg-1.0-py3-none-any.whl\nfsspec===2026.9.0  # pinned\n")
    assert bundle.read_present(f) == {"torch": "2.11.0+cu130", "huggingface-hub": "1.33.0", "numpy": None,
                                      "pkg": None, "fsspec": "2026.9.0"}
    f.write_text("torch==2.11\nthis is not a requirement\n")
    with pytest.raises(AblateError, match=r"line 2: 'this is not a requirement' is not `name==version`"):
        bundle.read_present(f)
    with pytest.raises(AblateError, match="pip list --format freeze"):
        bundle.read_present(tmp_path / "missing.txt")


def test_a_manylinux_tag_takes_the_older_ones_and_its_architecture_keeps_its_underscore():
    t = bundle.Target("3.12", "manylinux_2_28_x86_64")
    tags = t.platforms()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags and "manylinux1_x86_64" in tags
    assert t.arch == "x86_64" and t.markers()["platform_machine"] == "x86_64"
    assert bundle.Target("3.12", "manylinux_2_28_aarch64").platforms()[-1] == "manylinux2014_aarch64"
    with pytest.raises(AblateError, match="not a Linux platform tag"):
        _ = bundle.Target("3.12", "macosx_14_0_arm64").arch


def test_present_packages_become_empty_wheels_pinned_at_the_nodes_version(tmp_path):
    constraints = bundle.placeholders({"torch": "2.11.0+cu130", "huggingface-hub": "1.33.0", "numpy": None}, tmp_path)
    assert constraints == ["huggingface-hub==1.33.0+present", "torch==2.11.0+cu130.present"]  # a bare name: none
    wheel = tmp_path / "torch-2.11.0+cu130.present-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        meta = z.read("torch-2.11.0+cu130.present.dist-info/METADATA").decode()
    assert "Name: torch\nVersion: 2.11.0+cu130.present" in meta and "Requires-Dist" not in meta


def _item(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_what_travels_is_what_ablate_reaches_without_passing_through_the_node():
    """torch and what only torch needs stay; a present package's own needs stay; an extra's needs travel only when
    the extra is asked for; markers are the target's, not this machine's."""
    items = [_item("ablate", "0.1", "torch>=2.3", "sqlalchemy>=2", "psycopg[binary]>=3.1", "transformers",
                   "prefect>=3; extra == 'prefect'", "tomli; python_version < '3.11'"),
             _item("torch", "2.11.0+present", "nvidia-cublas; platform_system == 'Linux'", "sympy"),
             _item("nvidia-cublas", "13"), _item("sympy", "1.14", "mpmath"), _item("mpmath", "1.3"),
             _item("sqlalchemy", "2.1", "greenlet; platform_machine == 'x86_64'", "typing-extensions"),
             _item("greenlet", "3.5"), _item("typing-extensions", "4.16"),
             _item("psycopg", "3.3", "psycopg-binary==3.3; extra == 'binary'", "typing-extensions"),
             _item("psycopg-binary", "3.3"), _item("transformers", "5.2", "safetensors", "regex"),
             _item("safetensors", "0.8"), _item("regex", "2026.1"), _item("tomli", "2.0"),
             _item("pytest", "9.2", "pluggy"), _item("pluggy", "1.7"), _item("prefect", "3.9", "cryptography"),
             _item("cryptography", "50")]
    target = bundle.Target("3.12", "manylinux_2_28_x86_64", present={"torch": "2.11.0", "transformers": None})
    names = [i["metadata"]["name"] for i in bundle.travelling(items, target)]
    assert names == ["greenlet", "pluggy", "psycopg", "psycopg-binary", "pytest", "sqlalchemy", "typing-extensions"]
    on_arm = bundle.Target("3.12", "manylinux_2_28_aarch64", present={"torch": "2.11.0", "pytest": "9.2"},
                           extras=("prefect",))
    names = [i["metadata"]["name"] for i in bundle.travelling(items, on_arm)]
    assert "greenlet" not in names and "pytest" not in names and "transformers" in names
    assert {"prefect", "cryptography", "safetensors", "regex"} <= set(names) and "nvidia-cublas" not in names


def test_a_folder_that_is_no_bundle_is_refused_and_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["bundle", "-o", str(out), "--python", "3.12", "--platform", "manylinux_2_28_x86_64"]) == 2
    assert "holds files that are not an earlier bundle" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and not (tmp_path / "mine.partial").exists()
    assert main(["bundle", "-o", str(tmp_path / "b"), "--exclude-present", str(tmp_path / "none.txt")]) == 2
    assert "--exclude-present" in capsys.readouterr().err and not (tmp_path / "b").exists()
    with pytest.raises(AblateError, match="is not one; run it from a clone"):  # no checkout to build ablate from
        bundle.bundle(tmp_path / "c", bundle.Target("3.12", "manylinux_2_28_x86_64"), tmp_path / "not-a-checkout")
    assert not (tmp_path / "c").exists() and not (tmp_path / "c.partial").exists()


# ---------------------------------------------------------------- end to end


def _clean_pip_env(**extra: str) -> dict[str, str]:
    """No index, find-links or config from this machine: the venv sees only the bundle (an offline node). Its
    bytecode is written as it imports (the node's torch is installed uncompiled, and a shell that sets
    PYTHONDONTWRITEBYTECODE would compile torch's modules again in each of the node check's processes)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "ABLATE_DB_URL")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def _run(cmd: list, timeout: float, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=patience(timeout), **kw)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_a_bundle_installs_offline_beside_the_nodes_torch_and_the_node_check_runs_from_it(tmp_path):
    import torch

    node = tmp_path / "node"
    venv.create(node, with_pip=True)
    python = node / "bin" / "python"
    # the node's own torch: this machine's build, from wherever this machine's pip finds it (a local file here);
    # uncompiled (its bytecode is written as the node imports it): 25 -> 8 s, and it is the node's, not under test
    _run([python, "-m", "pip", "install", "-q", "--no-compile", f"torch=={torch.__version__}"], 600)
    freeze = _run([python, "-m", "pip", "list", "--format", "freeze"], 120, env=_clean_pip_env()).stdout
    (tmp_path / "node.txt").write_text(freeze)
    torch_line = next(line for line in freeze.splitlines() if line.lower().startswith("torch=="))

    out = tmp_path / "bundle"
    _run([sys.executable, "-m", "ablate.cli", "bundle", "--exclude-present", tmp_path / "node.txt", "-o", out], 900,
         cwd=REPO)
    info = json.loads((out / "bundle.json").read_text())
    files = {w["file"].split("-")[0].lower() for w in info["wheels"]}
    assert "torch" not in files and not any(f.startswith("nvidia") for f in files)
    assert {"ablate", "sqlalchemy", "pydantic", "pytest"} <= files and "prefect" not in files
    assert "torch" in info["left_to_node"] and info["commit"] and not (tmp_path / "bundle.partial").exists()

    assert (out / "requirements.txt").read_text().split() == ["ablate", "pytest"]
    # docs/offline-gpu.md's install, uncompiled as the node's torch was (the node check compiles what it imports)
    _run([python, "-m", "pip", "install", "-q", "--no-compile", "--no-index", "--find-links", out, "-r",
          out / "requirements.txt"], 900, cwd=tmp_path, env=_clean_pip_env())
    after = _run([python, "-m", "pip", "list", "--format", "freeze"], 120, env=_clean_pip_env()).stdout
    assert torch_line in after.splitlines()  # the node's torch, untouched
    _run([python, "-m", "pip", "check"], 120, env=_clean_pip_env())

    # a trainer-only node has no orchestrator, and says so
    refused = subprocess.run([python, "-m", "ablate.cli", "sweep", "run", REPO / "sweeps" / "smoke.yaml"],
                             capture_output=True, text=True, cwd=tmp_path, env=_clean_pip_env(), timeout=patience(120))
    assert refused.returncode == 2 and "pip install 'ablate[prefect]'" in refused.stderr

    # the node check, from the bench and tests alone (ablate comes from the venv, not from a checkout)
    check = tmp_path / "check"
    for folder in ("bench", "tests"):
        shutil.copytree(REPO / folder, check / folder, ignore=shutil.ignore_patterns("__pycache__"))
    results = tmp_path / "results"
    _run([python, "-m", "bench", "gpu", "--device", "cpu", "--quick", "--bundle", out, "--out", results], 900,
         cwd=check, env=_clean_pip_env())
    data = json.loads((results / "results.json").read_text())
    parts = data["parts"]
    assert {name: p["status"] for name, p in parts.items()} == dict.fromkeys(
        ("env", "tests", "throughput", "trainer", "memory", "fused", "orderings", "profile"), "ok")
    env_row = parts["env"]["rows"][0]
    assert env_row["ablate_from"].startswith(str(node)) and env_row["torch_from"].startswith(str(node))
    assert data["commit"] == info["commit"] and data["commit_from"] in ("git", "bundle.json")
    outcomes = {r["test"]: r["outcome"] for r in parts["tests"]["rows"]}
    assert outcomes and "failed" not in outcomes.values() and "passed" in outcomes.values()
    skipped = [s["why"] for p in parts.values() for s in p["skipped"]]
    assert any("CUDA only" in why for why in skipped)
    claims = [r for r in parts["orderings"]["rows"] if r.get("kind") == "claim"]
    assert len(claims) == 3 and all(r["verdict"] for r in claims)
    fused = parts["fused"]["rows"]  # seeds fused in one process against one after another (~30 s at CPU sizes)
    assert fused and all(r.get("fused") and r["fused_tok_s"] > 0 and float(r["loss_rel_diff"]) < 1e-4 for r in fused)
    md = (results / "results.md").read_text()
    for section in ("## Goals", "## CUDA tests", "## Throughput", "## Fused groups", "## Orderings: claims", "## Skipped"):
        assert section in md
    assert sorted(p.name for p in results.iterdir()) == ["gpu-tests.xml", "log.txt", "results.json", "results.md"]
