"""`ablate check ARCH`: the model contract (shape, causality, parameter count, training, state dict, DDP) asked of
any registered architecture, a plugin's included, at tiny sizes on the CPU. Exit 0: nothing failed; 1: a property
failed; 2: a user error (an unknown architecture, bad --options)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from ablate.cli.common import about, console
from ablate.config.errors import AblateError, show

LABELS = {True: "PASS", False: "FAIL", None: "SKIP"}
OPTIONS_EXAMPLE = """--options '{"kernel": 3}'"""


@click.command(name="check", **about("check an architecture against the model contract (shape, causality, ...)",
                                     "ARCH: a registered architecture (`ablate models` lists them)"))
@click.argument("arch")
@click.option("--plugin", "plugins", multiple=True, metavar="PATH_OR_MODULE",
              help="load this plugin (a .py file or a module name) before looking ARCH up; repeatable")
@click.option("--options", default=None, metavar="JSON",
              help=f"the family's options as a JSON object: {OPTIONS_EXAMPLE}")
@click.option("--objective", default="clm", show_default=True,
              help="the trial's objective; one that reads whole documents does not require causality")
@click.option("--ddp", is_flag=True, help="also take one step in 2 gloo processes under DistributedDataParallel")
@click.option("--d-model", type=int, default=None, help="model width (default 16)")
@click.option("--layers", type=int, default=None, help="blocks (default 2)")
@click.option("--heads", type=int, default=None, help="attention heads (default 2)")
@click.option("--context", type=int, default=None, help="sequence length (default 8)")
def check_command(arch: str, plugins: tuple[str, ...], options: str | None, objective: str, ddp: bool,
                  **sizes: int | None) -> int:
    from ablate.plugins.guard import CHECK_SECONDS, run_child

    # in a child process, with a time limit: the plugin's code can neither hang this command nor end it with exit 0
    request = {"mode": "check", "plugins": list(plugins), "base_dir": str(Path.cwd()), "arch": arch,
               "options": _options(options), "objective": objective, "ddp": ddp,
               "sizes": {k: v for k, v in sizes.items() if v is not None}}
    result = run_child(request, CHECK_SECONDS * (2 if ddp else 1), f"the contract check of {arch}")
    findings = [(name, ok, detail) for name, ok, detail in result["findings"]]
    for name, ok, detail in findings:
        console.print(f"{LABELS[ok]} {escape(name)}  {escape(detail)}", soft_wrap=True)
    failed = [name for name, ok, _ in findings if ok is False]
    counts = {label: sum(LABELS[ok] == label for _, ok, _ in findings) for label in LABELS.values()}
    console.print(f"{escape(arch)}: {counts['PASS']} passed, {counts['FAIL']} failed"
                  f"{' (' + escape(', '.join(failed)) + ')' if failed else ''}, {counts['SKIP']} skipped")
    return 1 if failed else 0


def _options(text: str | None) -> dict[str, Any] | None:
    """--options, read as a JSON object."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AblateError(f"--options is not JSON ({exc.msg} at character {exc.pos}); give a JSON object, e.g. "
                          f"{OPTIONS_EXAMPLE}") from None
    if not isinstance(value, dict):
        raise AblateError(f"--options must be a JSON object of option: value, e.g. {OPTIONS_EXAMPLE} "
                          f"(got {show(value)})")
    return value
