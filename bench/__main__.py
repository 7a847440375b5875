"""`python -m bench all --out DIR [--quick] [--device cpu|cuda]`: the whole suite (see bench/suite.py).

Also: `python -m bench models|train|data|orchestration|db|trial_cost|ui|race|ctrl_c|study_reread [args]` run the single scripts, and
`python -m bench gpu --out DIR` checks a GPU node in one command (bench/gpu.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "gpu":  # the node check: bench/gpu.py
        from bench.gpu import main as gpu_main

        return gpu_main(argv[1:])
    if argv and argv[0] in ("models", "train", "data", "orchestration", "db", "trial_cost", "ui", "race", "ctrl_c",
                            "study_reread"):
        import importlib

        module = importlib.import_module(f"bench.{argv[0]}")
        sys.argv = [f"python -m bench.{argv[0]}", *argv[1:]]
        module.main()
        return 0
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["all", "throughput", "ways", "context_memory"])
    p.add_argument("--out", default="results/bench", help="folder for results.json and results.md")
    p.add_argument("--quick", action="store_true", help="smallest sizes (what CI runs on CPU)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = p.parse_args(argv)
    from bench.suite import run_all

    parts = ("throughput", "ways", "context_memory") if args.what == "all" else (args.what,)
    run_all(Path(args.out), quick=args.quick, device=args.device, parts=parts)
    print((Path(args.out) / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
