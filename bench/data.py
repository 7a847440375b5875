"""Tokenization throughput on this machine: BPE training, and tokenize + pack into the token cache.

    python -m bench.data [--vocab 4096] [--context 512] [--repeat 10]

Corpora: the embedded TinyStories sample (repeated `--repeat` times so the run is long enough to
time, and so `datasets.map` may use several processes) and Penn Treebank from tests/data. Fresh cache folders each time. A script, not a test.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ablate.data import get_tokenizer, prepare, train_eval_documents
from ablate.config import DatasetRef, TokenizerRef

PTB = Path(__file__).resolve().parent.parent / "tests" / "data" / "ptb" / "valid.txt"


def corpus_files(work: Path, repeat: int) -> dict[str, Path]:
    sample = Path(__file__).resolve().parent.parent / "ablate" / "corpora" / "tinystories-valid-head.txt"
    big = work / "tinystories-x.txt"
    big.write_text(sample.read_text() * repeat)
    files = {f"tinystories sample x{repeat}": big}
    if PTB.exists():
        files["ptb valid"] = PTB
    return files


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-data-"))
    for name, path in corpus_files(work, args.repeat).items():
        for packing in ("pad", "concat"):
            root = work / f"{path.stem}-{packing}"
            dataset = DatasetRef(source=str(path), packing=packing, eval={"holdout": 50})
            tokenizer = TokenizerRef(vocab_size=args.vocab)
            docs, _ = train_eval_documents(dataset)
            chars = sum(len(t) for t in docs["text"])
            t0 = time.perf_counter()
            get_tokenizer(tokenizer, dataset, root, progress=False)
            t_bpe = time.perf_counter() - t0
            t0 = time.perf_counter()
            prepared = prepare(dataset, tokenizer, args.context, root, progress=False)
            t_tok = time.perf_counter() - t0
            tokens = prepared.train.n_tokens + prepared.eval.n_tokens
            print(f"{name:26s} {packing:6s} {len(docs):6d} docs {chars / 1e6:5.1f} MB: BPE({args.vocab}) "
                  f"{t_bpe:5.2f}s ({chars / t_bpe / 1e6:.2f} MB/s); tokenize+pack {t_tok:5.2f}s = "
                  f"{tokens / t_tok:,.0f} tokens/s ({prepared.train.n_tokens:,} train tokens in {len(prepared.train):,} rows)")


if __name__ == "__main__":
    main()
