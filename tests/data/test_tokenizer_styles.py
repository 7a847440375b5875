"""Tokenizer styles (ablate/data/tokenizer.py) against the studies' way of making them: transformers'
`train_new_from_iterator` on a Llama-style and a Llama-3-style tokenizer. The bases are built here with the
tokenizers library (the pipelines transformers gives Llama's and Llama 3's tokenizers) and wrapped, not downloaded:
the hub cannot be reached. Trained on the embedded TinyStories, each style must give the retrain's vocabulary and
the same encodings of held-out stories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.config import DatasetRef, TokenizerRef, load_spec
from ablate.config.errors import AblateError
from ablate.data import get_tokenizer, train_eval_documents
from ablate.data.tokenizer import LLAMA3_SPECIALS, LLAMA3_SPLIT

DATASET = DatasetRef(source="ablate:tinystories", eval={"holdout": 300}, limit=1500)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("styles")
    train, held = train_eval_documents(DATASET, cache=root)
    return root, list(train["text"]), list(held["text"])


def llama_base(folder: Path):
    """A Llama tokenizer as transformers converts one (LlamaConverter): sentencepiece-style BPE with byte fallback;
    its vocabulary (specials and byte tokens only) is what a retrain throws away."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    from transformers import LlamaTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.save(str(folder / "llama-base.json"))
    return LlamaTokenizerFast(tokenizer_file=str(folder / "llama-base.json"), unk_token="<unk>", bos_token="<s>",
                              eos_token="</s>")


def llama3_base(folder: Path):
    """Llama 3's pipeline: its regex split, then byte-level BPE that ignores merges for whole words, and its 256
    special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in LLAMA3_SPECIALS])
    tok.save(str(folder / "llama3-base.json"))
    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "llama3-base.json"), bos_token="<|begin_of_text|>",
                                   eos_token="<|end_of_text|>")


def stripped_lines(texts: list[str]) -> list[str]:
    """What the studies' retrain read: TinyStories-train.txt line by line, each stripped (blbadger/maskedmixers
    src/tinystories_tokenizer_trainer.py, TextDataset)."""
    return [line.strip() for text in texts for line in text.split("\n") if line.strip()]


def encodings(tok, texts: list[str]) -> list[list[str]]:
    return [tok.convert_ids_to_tokens(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


def test_the_llama_style_is_the_studies_retrain_and_codes_a_newline_as_unk(corpus, tmp_path):
    root, train, held = corpus
    ours = get_tokenizer(TokenizerRef(vocab_size=2048, style="llama"), DATASET, root, progress=False)
    lines = stripped_lines(train)
    theirs = llama_base(tmp_path).train_new_from_iterator(
        (lines[i:i + 1000] for i in range(0, len(lines), 1000)), 2048)
    assert ours.get_vocab() == theirs.get_vocab()
    assert encodings(ours, held) == encodings(theirs, held)
    tokens = encodings(ours, ["Once upon a time.\nThe end."])[0]
    assert tokens[0].startswith("\u2581Once\u2581upon") and "<unk>" in tokens  # merges cross words; \n is <unk>
    assert ours.decode(ours("a b.\nc", add_special_tokens=False)["input_ids"]) == "a b.<unk>c"  # as their samples
    saved = [json.loads(p.read_text()) for p in Path(root).glob("tokenizers/*/tokenizer.json")]
    assert any(s["model"]["byte_fallback"] and s["pre_tokenizer"] is None for s in saved)  # cached as trained
    per_story = sum(map(len, encodings(ours, held))) / len(held)
    bytelevel = get_tokenizer(TokenizerRef(vocab_size=2048), DATASET, root, progress=False)
    print(f"tokens per held-out story at 2048: llama {per_story:.1f}, "
          f"bytelevel {sum(map(len, encodings(bytelevel, held))) / len(held):.1f}")
    assert per_story < 0.9 * sum(map(len, encodings(bytelevel, held))) / len(held)


def test_the_llama3_style_is_the_retrain_of_llama_3s_with_its_special_tokens(corpus, tmp_path):
    root, train, held = corpus
    ours = get_tokenizer(TokenizerRef(vocab_size=1500, style="llama3"), DATASET, root, progress=False)
    theirs = llama3_base(tmp_path).train_new_from_iterator(
        (train[i:i + 1000] for i in range(0, len(train), 1000)), 1500)
    assert ours.get_vocab() == theirs.get_vocab()
    assert encodings(ours, held) == encodings(theirs, held)
    assert [ours.convert_ids_to_tokens(i) for i in (0, 1, 9)] == ["<|begin_of_text|>", "<|end_of_text|>",
                                                                  "<|eot_id|>"]
    assert len(LLAMA3_SPECIALS) == 256 and ours.eos_token == ours.pad_token == "<|end_of_text|>"
    assert ours.decode(ours("a\nb", add_special_tokens=False)["input_ids"]) == "a\nb"  # byte-level: newlines kept


def test_the_studies_recipe_trains_the_llama_style_unless_the_sweep_says_otherwise(tmp_path):
    def spec(**extra) -> Path:
        path = tmp_path / "s.yaml"
        body = {"name": "s", "dataset": {"source": "ablate:tinystories-sample"}, "budget": {"steps": 5},
                "defaults": {"d_model": 8, "layers": 1, "context": 16}, **extra}
        path.write_text(json.dumps(body))
        return path

    assert load_spec(spec()).tokenizer.style is None  # the project's recipe: byte-level, as before
    assert load_spec(spec(recipe="studies")).tokenizer.style == "llama"
    assert load_spec(spec(recipe="studies", tokenizer={"vocab_size": 8000, "style": "llama3"})).tokenizer.style \
        == "llama3"
    assert load_spec(spec(recipe="studies", tokenizer={"name": "gpt2"})).tokenizer.style is None
    with pytest.raises(AblateError, match="tokenizer.name .load. or tokenizer.style .train., not both"):
        load_spec(spec(tokenizer={"name": "gpt2", "style": "llama"}))
    with pytest.raises(AblateError, match="bytelevel.*llama.*llama3"):
        load_spec(spec(tokenizer={"style": "sentencepiece"}))


def test_a_sweep_without_a_style_keeps_its_identity():
    """`style` came later: unset, it is not in the dumps, so every stored fingerprint (sweeps, trials, caches)
    stays what it was."""
    assert "style" not in TokenizerRef(vocab_size=4096).model_dump()
    assert TokenizerRef(vocab_size=4096, style="llama").model_dump()["style"] == "llama"
