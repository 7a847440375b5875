"""What each tokenizer style (ablate/data/tokenizer.py) makes of TinyStories: tokens per held-out story, UTF-8 bytes
per token, newlines coded as <unk>, and the CPU time to train it.

    python -m bench.tokenizers [--vocab 4096] [--holdout 500] [--out bench/tokenizers-results.md]

Trains each style once on the embedded TinyStories (`ablate:tinystories`, the last `--holdout` stories held out) in
a fresh cache folder and encodes the held-out stories without special tokens, as the token cache does. A per-token
loss scales with tokens per byte: these ratios are what separates a loss under one style from the same model's
under another. A script, not a test.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ablate.config import DatasetRef, TokenizerRef
from ablate.data import get_tokenizer, train_eval_documents

STYLES = (("bytelevel", None), ("llama", None), ("llama3", 8000))  # llama3 also at the studies' 8000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tokenizers", description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--holdout", type=int, default=500)
    p.add_argument("--out", default=None, help="also write the table here (markdown)")
    args = p.parse_args(argv)
    dataset = DatasetRef(source="ablate:tinystories", eval={"holdout": args.holdout})
    root = Path(tempfile.mkdtemp(prefix="ablate-bench-tokenizers-"))
    _, held = train_eval_documents(dataset, cache=root)
    texts = list(held["text"])
    stories_bytes = sum(len(t.encode("utf-8")) for t in texts)
    lines = [f"# Tokenizer styles on TinyStories\n\n`{' '.join(['python -m bench.tokenizers', *(argv or [])])}`: "
             f"trained on `ablate:tinystories`, {len(texts)} stories held out ({stories_bytes:,} UTF-8 bytes).\n",
             "| style | vocab | tokens per story | bytes per token | newlines as <unk> | train CPU-s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for style, vocab in [(s, args.vocab) for s, _ in STYLES] + [(s, v) for s, v in STYLES if v and v != args.vocab]:
        t0 = time.process_time()
        tok = get_tokenizer(TokenizerRef(vocab_size=vocab, style=style), dataset, root, progress=False)
        cpu = time.process_time() - t0
        ids = tok(texts, add_special_tokens=False)["input_ids"]
        n = sum(map(len, ids))
        unk = sum(i.count(tok.unk_token_id) for i in ids) if tok.unk_token_id is not None else 0
        lines.append(f"| {style} | {vocab} | {n / len(texts):.1f} | {stories_bytes / n:.2f} | {unk} | {cpu:.1f} |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
