"""`ablate bundle`: the wheels that take ablate onto an offline GPU node, beside the node's own torch."""

from __future__ import annotations

from pathlib import Path

import click

from ablate.cli.common import about, console

EXTRAS = ("prefect", "cmaes", "bench", "mlflow", "tensorboard", "wandb")


@click.command(**about("a folder of wheels that installs ablate on an offline node, its own torch untouched"),
               epilog="On the node: python3 -m pip install --no-index --find-links DIR -r DIR/requirements.txt, then "
                      "from the checkout: python -m bench gpu --bundle DIR --out RESULTS")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="the bundle's folder (replaced "
              "when it holds an earlier bundle)")
@click.option("--python", "python", default=None, help="the node's Python, e.g. 3.12 (default: this one's)")
@click.option("--platform", "platform_tag", default=None, help="the node's platform tag, e.g. manylinux_2_28_x86_64 "
              "(default: this machine's)")
@click.option("--exclude-present", "present", type=click.Path(dir_okay=False), default=None,
              help="the node's `pip list --format freeze`: what it has travels not (torch never does)")
@click.option("--with", "extras", multiple=True, type=click.Choice(EXTRAS), help="an extra to carry, e.g. prefect "
              "(the orchestrator: a node that only trains and checks itself needs none)")
def bundle(out: str, python: str | None, platform_tag: str | None, present: str | None,
           extras: tuple[str, ...]) -> int:
    import ablate
    from ablate.runner import bundle as wheelhouse

    here_python, here_platform = (None, None) if python and platform_tag else wheelhouse.this_machine()
    target = wheelhouse.Target(python=python or here_python, platform=platform_tag or here_platform,
                               present=wheelhouse.read_present(Path(present)) if present else {},
                               extras=tuple(dict.fromkeys(extras)))
    source = Path(ablate.__file__).resolve().parent.parent
    wheelhouse.bundle(Path(out), target, source, say=lambda line: console.print(line, highlight=False, markup=False))
    return 0
