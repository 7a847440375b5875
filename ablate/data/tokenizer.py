"""The tokenizer of a trial: a named one (`tokenizer.name`, through transformers), or a Llama-style byte-level BPE
trained once on the corpus and cached by fingerprint under the artifacts folder. Torch-free."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from ablate.config.errors import AblateError
from ablate.config import DatasetRef, TokenizerRef
from ablate.data.corpus import train_eval_documents
from ablate.data.tokencache import tokenizer_fingerprint

SPECIALS = ("<unk>", "<s>", "</s>")  # unk, bos, eos; pad = eos, as in the studies


def _wrap(path: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")


def get_tokenizer(ref: TokenizerRef, dataset: DatasetRef, root: Path, progress: bool = True):
    """Load `tokenizer.name`, or train (once, cached by fingerprint) a byte-level BPE of `vocab_size` on the corpus.

    Byte-level BPE keeps newlines and every byte (the studies' retrained Llama tokenizer mapped
    newlines to <unk>); special tokens <unk>, <s>, </s>, with pad = eos.
    """
    if ref.name is not None:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(ref.name)
        except Exception as exc:  # noqa: BLE001
            raise AblateError(f"tokenizer.name: cannot load {ref.name!r} ({str(exc).splitlines()[0][:200]}). "
                              "Give a local folder with tokenizer files, train one with tokenizer.vocab_size, "
                              "or run online.") from None
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    folder = root / "tokenizers" / tokenizer_fingerprint(ref, dataset)
    target = folder / "tokenizer.json"
    if target.exists():
        return _wrap(target)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not target.exists():
            train_docs, _ = train_eval_documents(ref.trained_on or dataset, cache=root)
            tok = _train_bpe(train_docs, ref, progress)
            tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
            tok.save(str(tmp / "tokenizer.json"))
            os.replace(tmp, folder) if not folder.exists() else shutil.rmtree(tmp)
    return _wrap(target)


def _train_bpe(docs, ref: TokenizerRef, progress: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    vocab_size = ref.vocab_size or 4096
    n = min(len(docs), ref.train_documents or len(docs))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def batches():
        for start in range(0, n, 1000):
            yield docs[start: min(start + 1000, n)]["text"]

    tok.train_from_iterator(batches(), trainer=trainer, length=n)
    reached = tok.get_vocab_size()
    if reached < vocab_size:
        raise AblateError(f"tokenizer.vocab_size: the corpus supports only {reached} tokens "
                          f"({n} documents), fewer than the {vocab_size} asked; lower tokenizer.vocab_size "
                          f"to at most {reached} or use more data (dataset.limit)")
    return tok
