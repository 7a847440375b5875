"""Before a sweep with plugin architectures is registered (and in `ablate plan`): the contract's fast part (the
builder runs, the logits have the right shape and are finite, the model has parameters, logits are causal in eval
and train mode, rows independent) once per (family, options, objective), at tiny sizes. A model that fails is
refused with the failing property, the first leaking position and the option values, and nothing is written.
Built-in families are held to the whole contract by the project's own tests.

The check runs plugin code, so it runs in a child process (`python -m ablate.plugins.guard`, which `ablate check`
uses too) with a time limit: a forward that never returns is refused after GUARD_SECONDS, and a plugin that exits
or crashes the process is refused, never taken for a pass (the child's result ends with a sentinel line). The
caller's process imports no torch for it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ablate.config import registry
from ablate.config.errors import AblateError

GUARD_SECONDS = 60.0  # the fast check, for every plugin case of a sweep
CHECK_SECONDS = 120.0  # `ablate check`: the whole contract (ten training steps); twice that with DDP's processes
SENTINEL = "ABLATE-CHECK-RESULT "  # the child's last line: its result as JSON


def refuse_broken_plugins(trials: list[Any], said: str = "refused before anything was registered",
                          modules: Sequence[str] = ()) -> None:
    """An AblateError naming every plugin family of `trials` that fails the contract's fast part (`said`: what
    the refusal means for the command asking; `modules`: the sweep's `plugins:` that are modules, which the child
    imports as the sweep did)."""
    cases, loads = {}, [[module, None] for module in modules]
    for trial in trials:
        family = registry.families().get(trial.architecture)
        if family is not None and family.source.identity is not None:
            cases.setdefault((trial.architecture, json.dumps(trial.options, sort_keys=True), trial.objective), trial)
            for entry in (family, registry.objectives().get(trial.objective)):
                load = _how_to_load(entry)
                if load is not None and load not in loads:
                    loads.append(load)
    if not cases:
        return
    request = {"mode": "guard", "load": loads,
               "cases": [{"trial": t.model_dump(mode="json"), "name": name, "options": options, "objective": objective}
                         for (name, options, objective), t in cases.items()]}
    names = ", ".join(sorted({name for name, _, _ in cases}))
    problems = run_child(request, GUARD_SECONDS, f"{said}: the contract's fast check of {names}")["problems"]
    if problems:
        raise AblateError(f"{said}: the plugin's model breaks the contract: "
                          + " | ".join(problems) + ". Run `ablate check NAME --plugin PATH --options JSON` for "
                          "the whole contract")


def plugin_modules(spec: Any) -> list[str]:
    """A sweep's `plugins:` that are importable modules (files are loaded by their registered text)."""
    from ablate.plugins.load import looks_like_file

    return [ref for ref in spec.plugins if isinstance(ref, str) and not looks_like_file(ref)]


def _how_to_load(entry: Any) -> list[str | None] | None:
    """How a child process gets the code of a plugin entry: [path to load, path to record] for a file (the exact
    text registered, written by its identity), [module, None] for an importable one; None: built-in, or an
    installed package (its entry point loads it in the child too)."""
    if entry is None or entry.source.identity is None or entry.source.kind == "package":
        return None
    if entry.source.text is not None and entry.source.identity.startswith("file:"):
        from ablate.plugins.stored import write_source

        return [str(write_source(entry.source.identity, entry.source.where, entry.source.text)), entry.source.where]
    ref = entry.model_ref if isinstance(entry, registry.Family) else entry.module
    module = ref if isinstance(ref, str) else getattr(getattr(ref, "build", None), "__module__", None)
    return [module or entry.source.where, None]


def run_child(request: dict[str, Any], seconds: float, what: str) -> dict[str, Any]:
    """`request` done by a child process within `seconds`; its result, or an AblateError saying why there is none."""
    nonce = secrets.token_hex(8)  # the result line is the child's own, not something a plugin printed
    try:
        # the child imports what this process can: its sys.path (a plugin module found through it) goes along
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        done = subprocess.run([sys.executable, "-m", "ablate.plugins.guard"], input=json.dumps({**request, "nonce": nonce}),
                              text=True, capture_output=True, timeout=seconds, env=env)
    except subprocess.TimeoutExpired:
        raise AblateError(f"{what} did not finish in {seconds:g} s: does the model's forward (or its build) "
                          "return?") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith(SENTINEL + nonce)]
    if done.returncode != 0 or not lines:
        said = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1][:300]
        raise AblateError(f"{what} ended without a result (exit code {done.returncode}): the plugin exited or "
                          f"crashed the process ({said})")
    result = json.loads(lines[-1].removeprefix(SENTINEL + nonce))
    if "error" in result:
        raise AblateError(result["error"])
    return result


# ---------------------------------------------------------------- the child


def _child(request: dict[str, Any]) -> dict[str, Any]:
    from ablate.plugins.check import check_trial, load_plugins, small_trial
    from ablate.plugins.load import load_plugin

    for ref, where in request.get("load", []):
        load_plugin(ref, where=where) if where else load_plugin(ref)
    if request["mode"] == "check":
        load_plugins(request["plugins"], base_dir=Path(request["base_dir"]))
        trial = small_trial(request["arch"], request["options"], request["objective"], **request["sizes"])
        findings = check_trial(trial, ddp=request["ddp"], plugins=request["plugins"])
        return {"findings": [[f.name, f.ok, f.detail] for f in findings]}
    return {"problems": [problem for case in request["cases"] if (problem := _guard_case(case, small_trial, check_trial))]}


def _guard_case(case: dict[str, Any], small_trial: Any, check_trial: Any) -> str | None:
    from ablate.config import TrialConfig

    trial = TrialConfig.model_validate(case["trial"])
    sizes = {"heads": trial.heads, "d_model": 8 * trial.heads} if trial.heads else {}
    try:
        small = small_trial(case["name"], trial.options, case["objective"], **sizes)
    except AblateError:  # options that need the trial's own sizes: its sizes, on a short context
        small = trial.model_copy(update={"context": min(trial.context, 16), "batch_size": 2})
    failed = [f for f in check_trial(small, fast=True) if f.ok is False]
    if not failed:
        return None
    said = "; ".join(f"{f.name}: {f.detail}" for f in failed)
    return f"architecture {case['name']!r} with options {case['options']} (objective {case['objective']}): {said}"


def main() -> int:
    """Read the request on stdin; print the result after SENTINEL (an AblateError is a result too: its message)."""
    request = json.loads(sys.stdin.read())
    try:
        result = _child(request)
    except AblateError as exc:
        result = {"error": str(exc)}
    print(SENTINEL + request["nonce"] + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
