"""results.md of `python -m bench gpu`: the goals first (met, or missed by how much), then every part's table, what
each part skipped and why. Reads only results.json's dictionary (no torch: the orchestrator stays light)."""

from __future__ import annotations

import math
from typing import Any

from bench.gpu_fused import goal_row

GOALS = {"mfu": 0.40, "trainer": 0.97, "share": 0.97}


def markdown(result: dict[str, Any]) -> str:
    parts = result["parts"]
    env = next(iter(parts.get("env", {}).get("rows") or []), {})
    out = [f"# Node check: {env.get('device', 'device not read')}", "", _header(result, env), "",
           f"Command: `{result['command']}` (every number below comes from it, on this machine; started "
           f"{result['started']}{', finished ' + result['finished'] if result.get('finished') else ', not finished'})",
           "", "## Goals", "", *_goals(parts), "", "## Parts", "",
           *_table(["part", "status", "seconds", "allowance", "error"],
                   [[name, p["status"], p.get("seconds"), p.get("allowance"), p.get("error") or p.get("why")]
                    for name, p in parts.items()])]
    for name, title, columns in SECTIONS:
        rows = [r for r in (parts.get(name, {}).get("rows") or []) if _belongs(name, title, r)]
        if rows:
            cols = columns or list(dict.fromkeys(k for r in rows for k in r))  # memory: the contexts measured
            out += ["", f"## {title}", "", *_table(cols, [[r.get(c) for c in cols] for r in rows])]
            out += [f"- {n}" for n in parts.get(name, {}).get("notes") or [] if title != "Orderings: claims"]
    skipped = [(name, s) for name, p in parts.items() for s in p.get("skipped") or []]
    if skipped:
        out += ["", "## Skipped", "", *_table(["part", "what", "why"], [[n, s["what"], s["why"]] for n, s in skipped])]
    return "\n".join(out) + "\n"


SECTIONS = [
    ("tests", "CUDA tests (pytest -m gpu tests/gpu)", ["test", "outcome", "seconds", "detail", "measured"]),
    ("throughput", "Throughput per architecture", ["arch", "d_model", "layers", "context", "batch", "compile", "params",
                                                   "tokens_per_s", "step_ms", "mfu", "peak_mb", "error"]),
    ("trainer", "Trainer against a bare loop", ["arch", "d_model", "layers", "precision", "compile", "steps", "pairs",
                                                "trainer_tok_s", "bare_tok_s", "ratio", "ratio_range"]),
    ("trainer", "Share of a fixed budget in training steps", ["arch", "d_model", "layers", "budget_s", "clock_s",
                                                              "wall_s", "share", "steps", "off_clock", "data_wait",
                                                              "mfu"]),
    ("memory", "Context memory (MB): one unbatched forward+backward, no LM head", None),
    ("fused", "Fused groups against one after another and K processes packed", [
        "arch", "d_model", "layers", "context", "batch", "precision", "k", "alone_tok_s", "fused_tok_s",
        "fused_vs_alone", "packed_tok_s", "packed_vs_alone", "loss_rel_diff", "peak_mb", "fused", "error"]),
    ("orderings", "Orderings: runs", ["id", "architecture", "d_model", "heads", "seed", "status", "steps",
                                      "final_eval_loss", "tokens_per_second", "mfu", "real_tokens", "precision",
                                      "peak_memory_mb",
                                      "train_seconds", "startup_seconds", "error"]),
    ("orderings", "Orderings: claims", ["claim", "better_mean", "better_n", "worse_mean", "worse_n", "effect", "p",
                                        "p_adjusted", "verdict", "better_left_out", "worse_left_out"]),
    ("profile", "Profile of the slowest architecture's step", ["arch", "op", "calls", "ms_per_step", "share"]),
]


def _belongs(name: str, title: str, row: dict[str, Any]) -> bool:
    if name == "trainer":
        return row.get("what") == ("budget share" if title.startswith("Share") else "trainer vs bare loop")
    if name == "orderings":
        return row.get("kind") == ("claim" if title.endswith("claims") else "run")
    return True


def _header(result: dict[str, Any], env: dict[str, Any]) -> str:
    bits = [env.get("device", "?")]
    if env.get("memory_gib"):
        bits.append(f"{env['memory_gib']} GiB, capability {env.get('capability')}, {env.get('sms')} SMs, driver "
                    f"{env.get('driver')}")
    bits.append(f"torch {env.get('torch')} (CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}), "
                f"Python {env.get('python')}")
    commit = result.get("commit") or "unknown"
    dirty = " with uncommitted changes" if result.get("dirty") else ""
    bits.append(f"ablate at commit {commit}{dirty} (from {result.get('commit_from')})")
    return "; ".join(bits) + "."


def _goals(parts: dict[str, Any]) -> list[str]:
    rows = []
    tests = parts.get("tests", {}).get("rows") or []
    if tests:
        counts = {k: sum(r["outcome"] == k for r in tests) for k in ("passed", "failed", "skipped")}
        rows.append(["CUDA tests", "all pass", ", ".join(f"{n} {k}" for k, n in counts.items()),
                     "met" if not counts["failed"] else f"{counts['failed']} failed"])
    mfu = [r for r in parts.get("throughput", {}).get("rows") or []
           if r.get("arch") == "llama" and r.get("d_model") == 1024 and isinstance(r.get("mfu"), (int, float))]
    if mfu:
        best = max(mfu, key=lambda r: r["mfu"])
        rows.append(["MFU, Llama d 1024 (bf16)", f">= {GOALS['mfu']:.0%}", f"{best['mfu']:.1%} "
                     f"({'compiled' if best.get('compile') else 'uncompiled'})", _verdict(best["mfu"], GOALS["mfu"])])
    else:
        rows.append(["MFU, Llama d 1024 (bf16)", f">= {GOALS['mfu']:.0%}", "not measured (no GPU, or no time)", "-"])
    trainer = parts.get("trainer", {}).get("rows") or []
    for what, key, goal, label in (("trainer vs bare loop", "ratio", GOALS["trainer"], "trainer / bare loop"),
                                   ("budget share", "share", GOALS["share"], "budget in training steps")):
        found = [r for r in trainer if r.get("what") == what and isinstance(r.get(key), (int, float))]
        if found:
            worst = min(r[key] for r in found)
            rows.append([label, f">= {goal:.0%}" if key == "share" else f">= {goal}x",
                         ", ".join(f"{r['arch']} {_fmt(r[key], key)}" for r in found), _verdict(worst, goal)])
    fused = goal_row(parts.get("fused", {}).get("rows") or [])
    if fused:
        rows.append(fused)
    claims = [r for r in parts.get("orderings", {}).get("rows") or [] if r.get("kind") == "claim"]
    if claims:
        rows.append(["studies' claims at a reduced budget", "a verdict each",
                     "; ".join(f"{r.get('verdict')}" for r in claims), "-"])
    return _table(["goal", "target", "measured", "verdict"], rows)


def _verdict(value: float, goal: float) -> str:
    return "met" if value >= goal else f"missed by {goal - value:.3f} ({value / goal:.0%} of the goal)"


def _fmt(value: float, key: str) -> str:
    return f"{value:.1%}" if key == "share" else f"{value:.3f}x"


def _table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return ["(none)"]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return lines


def cell(v: Any) -> str:
    """A table cell: numbers to 3 decimals below 10, else with thousands separators; None and NaN as "-"."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {cell(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "-".join(cell(x) for x in v)
    return str(v).replace("|", "/").replace("\n", " ")
