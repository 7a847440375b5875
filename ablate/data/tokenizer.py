"""The tokenizer of a trial: a named one (`tokenizer.name`, through transformers), or a BPE trained once on the corpus
and cached by fingerprint under the artifacts folder, in one of three styles (`tokenizer.style`). Torch-free.

- `bytelevel` (the default): GPT-2-style byte-level BPE; every byte and newline is a token.
- `llama`: the studies' TinyStories tokenizer, a Llama tokenizer (OpenLLaMA's) retrained with transformers'
  `train_new_from_iterator(..., 4096)` on the corpus's lines, stripped: sentencepiece-style BPE ('▁' for spaces,
  prepended), byte fallback, no pre-tokenizer (merges cross words: '▁Once▁upon▁a' is one token). The same
  pipeline as the retrain, so the same vocabulary and encodings (tests/data/test_tokenizer_styles.py checks them against transformers' retrain);
  trained without newlines, it encodes one as <unk>, as the studies' samples show ("<unk> tokens are newlines").
- `llama3`: the studies' FineWeb tokenizer, Llama 3's retrained (8000): its regex split, byte-level BPE, and its
  256 special tokens, which the retrain keeps and which take 256 of the vocabulary's places.
"""

from __future__ import annotations

import json
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
# Llama 3's special tokens (ids 128000-128255 there), in order: a retrain keeps every one
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", *(f"<|reserved_special_token_{i}|>" for i in range(4)),
                   "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>",
                   *(f"<|reserved_special_token_{i}|>" for i in range(5, 251)))
# Llama 3's pre-tokenizer split (its tokenizer.json), before the byte-level mapping
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _wrap(path: Path):
    """A trained tokenizer file as transformers' fast tokenizer, with its style's special tokens (pad = eos)."""
    from transformers import PreTrainedTokenizerFast

    added = {t["content"] for t in json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or ()}
    if "<|end_of_text|>" in added:  # llama3's specials
        return PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token="<|begin_of_text|>",
                                       eos_token="<|end_of_text|>", pad_token="<|end_of_text|>")
    return PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")


def get_tokenizer(ref: TokenizerRef, dataset: DatasetRef, root: Path, progress: bool = True):
    """Load `tokenizer.name`, or train (once, cached by fingerprint) a BPE of `vocab_size` in `tokenizer.style` on
    the corpus; special tokens <unk>, <s>, </s> (llama3: Llama 3's), with pad = eos."""
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
    vocab_size = ref.vocab_size or 4096
    n = min(len(docs), ref.train_documents or len(docs))
    style = ref.style or "bytelevel"
    tok, trainer = STYLES[style](vocab_size, progress)

    def batches():
        for start in range(0, n, 1000):
            texts = docs[start: min(start + 1000, n)]["text"]
            # the studies' retrain read TinyStories-train.txt line by line, each line stripped ("Remove newline
            # characters"): no newline in the alphabet, so a newline in a story encodes as <unk>, as in their samples
            # (blbadger/maskedmixers src/tinystories_tokenizer_trainer.py, TextDataset: `line.strip()`)
            yield [line.strip() for text in texts for line in text.split("\n") if line.strip()] if style == "llama" \
                else texts

    tok.train_from_iterator(batches(), trainer=trainer, length=n)
    reached = tok.get_vocab_size()
    if reached < vocab_size:
        raise AblateError(f"tokenizer.vocab_size: the corpus supports only {reached} tokens "
                          f"({n} documents), fewer than the {vocab_size} asked; lower tokenizer.vocab_size "
                          f"to at most {reached} or use more data (dataset.limit)")
    return tok


def _bytelevel(vocab_size: int, progress: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=progress,
                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def _llama(vocab_size: int, progress: bool):
    """The pipeline transformers converts Llama's sentencepiece model to, which its retrain keeps (only the vocabulary
    and merges are trained anew)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=progress)


def _llama3(vocab_size: int, progress: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(LLAMA3_SPECIALS),
                                    show_progress=progress, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


STYLES = {"bytelevel": _bytelevel, "llama": _llama, "llama3": _llama3}
