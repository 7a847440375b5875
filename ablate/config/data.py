"""What a trial reads: the corpus (hub, local files or embedded), its eval split, the tokenizer, and the
(summary, text) pairs of the retrieval stage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ablate.config.sources import is_local_source
from ablate.config.units import Frozen, LaterFields, Whole



class EvalSplit(LaterFields):
    _added_later = ("holdout_from",)

    split: str | None = None  # a named split of the dataset
    holdout: Whole | None = Field(None, gt=0)  # else: N documents of the training split, the last ones
    # ... or the first ones (the studies' FineWeb and FineMath scripts: `take(50000)` to test, `skip(50000)` to train)
    holdout_from: Literal["end", "start"] | None = None
    limit: Whole | None = Field(None, gt=0)  # at most this many eval documents

    @model_validator(mode="after")
    def _one_source(self) -> EvalSplit:
        if (self.split is None) == (self.holdout is None):
            raise ValueError("give exactly one of eval.split (a named split) or eval.holdout (a document count)")
        return self


class DatasetRef(LaterFields):
    """A corpus: a hub id (with config and split), or local files (text, jsonl, parquet, arrow, a saved dataset)."""

    _added_later = ("label_field",)

    source: str = Field(min_length=1)
    config: str | None = None
    split: str = "train"
    text_field: str = "text"
    format: Literal["auto", "text", "lines", "jsonl", "parquet", "arrow", "disk", "hub"] = "auto"
    limit: Whole | None = Field(None, gt=0)
    eval: EvalSplit = EvalSplit(holdout=50)
    # pad: one document per row, truncated and padded; concat: documents joined with eos and cut into rows;
    # chunk: each document cut into its own context-sized rows, the remainder dropped, rows never crossing documents;
    # documents: the studies' FineWeb rule, pad at context >= 512 and chunk below (ablate/data/cache.py)
    packing: Literal["pad", "concat", "chunk", "documents"] = "pad"
    # a column of integer class labels (0 .. classes-1), one per document: for objective: classification
    label_field: str | None = None

    @property
    def from_hub(self) -> bool:
        """Whether this corpus is read from the HuggingFace hub (not a local path or an embedded corpus)."""
        return self.format == "hub" or (self.format == "auto" and not is_local_source(self.source))

    @model_validator(mode="after")
    def _one_document_per_label(self) -> DatasetRef:
        if self.label_field is not None and self.packing != "pad":
            raise ValueError("label_field needs packing: pad (one labelled document per row); concat packing "
                             "joins documents and their labels would no longer belong to a row")
        return self

class TokenizerRef(LaterFields):
    """Train a BPE tokenizer of `vocab_size` on the corpus in `style`, or load `name` (hub id or path).

    style: bytelevel (unset: GPT-2-style byte-level BPE), llama (the studies' TinyStories retrain of Llama's
    tokenizer; the default under `recipe: studies`), llama3 (their FineWeb retrain of Llama 3's). See
    ablate/data/tokenizer.py."""

    _added_later = ("trained_on", "style")

    vocab_size: Whole | None = Field(4096, gt=0)
    name: str | None = None
    style: Literal["bytelevel", "llama", "llama3"] | None = None
    train_documents: Whole | None = Field(None, gt=0)
    # train on another corpus than the sweep's (finemath-context reuses the FineWeb tokenizer, as the study did):
    # the same tokenizer, from the same cache, as a sweep whose dataset is this one
    trained_on: DatasetRef | None = None

    def describe(self) -> str:
        """In a few words: its name, or what is trained ("BPE 4096 llama")."""
        return self.name or f"BPE {self.vocab_size} {self.style or 'bytelevel'}"

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerRef:
        if self.name is not None and self.vocab_size not in (None, 4096):
            raise ValueError("give tokenizer.name (load) or tokenizer.vocab_size (train), not both")
        if self.name is not None and self.style is not None:
            raise ValueError("give tokenizer.name (load) or tokenizer.style (train), not both")
        if self.name is not None and self.trained_on is not None:
            raise ValueError("give tokenizer.name (load) or tokenizer.trained_on (train on that corpus), not both")
        return self



class PairsRef(Frozen):
    """A (summary, text) pairs dataset for retrieval: hub id or local file/folder, or `ablate:tinystories-pairs`."""

    source: str = Field(min_length=1)
    summary_field: str = "summary"
    text_field: str = "text"
    split: str = "train"
    limit: Whole | None = Field(None, gt=0)

