"""Summary -> text retrieval on a trained run's embeddings (masked-mixers-1.md and -2.md, "Retrieval").

Two stages, as in the studies: a CLM-trained run embeds every summary and text (last hidden layer at
the second-to-last real token), then a small bidirectional mixer is trained on those embeddings to
pick the one matching text among c candidates for a summary, with cross-entropy over the candidates.
`info_nce_loss` is the studies' temperature-free contrastive alternative, for comparison.

The studies' models saw millions of stories; a run trained on the 221-story sample gives embeddings
with no usable match signal (tests/retrieval/test_retrieval.py keeps that claim as a strict xfail).

- `pairs.py`: the (summary, text) pairs: `load_pairs` (a file, a folder, a hub id), `pairs_from_stories`.
- `embed.py`: `embed_texts`, a trained run's last hidden layer at one token of each text.
- `mixer.py`: the retrieval model (`RetrievalBlock`, `RetrievalMixer`) and `info_nce_loss`.
- `training.py`: `train_retrieval`: candidate draws (`sample_candidates`), standardizing, held-out evaluation.
- `study.py`: `retrieval_study`: every run's checkpoint embeds the pairs, one retrieval model per c.
- `stage.py`: a sweep's retrieval stage (`run_stage`): its pairs, the metrics rows, the retrieval.{md,csv} table.

Imports run one way: pairs, embed and mixer import nothing of the package; training imports mixer; study
imports pairs, embed and training; stage imports pairs and study. This face re-exports the public names.
"""

from __future__ import annotations

from ablate.retrieval.embed import embed_texts
from ablate.retrieval.mixer import RetrievalBlock, RetrievalMixer, info_nce_loss
from ablate.retrieval.pairs import PAIR_FORMATS, load_pairs, pairs_from_stories
from ablate.retrieval.stage import RETRIEVAL_SPLIT, run_stage, stage_markdown, stage_pairs
from ablate.retrieval.study import retrieval_study
from ablate.retrieval.training import sample_candidates, train_retrieval

__all__ = [
    "PAIR_FORMATS",
    "RETRIEVAL_SPLIT",
    "RetrievalBlock",
    "RetrievalMixer",
    "embed_texts",
    "info_nce_loss",
    "load_pairs",
    "pairs_from_stories",
    "retrieval_study",
    "run_stage",
    "sample_candidates",
    "stage_markdown",
    "stage_pairs",
    "train_retrieval",
]
