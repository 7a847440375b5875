"""Completions from a trained run: greedy or top-k, one token at a time, up to the run's context.

Every model here maps a prefix of length T <= context to logits, and a masked mixer's prefix equals
its fixed window right-padded, so one loop serves all: the mixer fills its window left to right, as
the studies describe (its last output position is never trained, so generation stops before it).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
import torch

from ablate import store
from ablate.objectives import base as objectives
from ablate.config.errors import AblateError
from ablate.train.checkpoint import load_checkpoint
from ablate.config import TrialConfig
from ablate.config.settings import environment


def default_artifacts() -> Path:
    return environment().artifacts


def run_checkpoint(run: store.Run, artifacts: str | Path | None = None) -> Path:
    """The checkpoint a run row names, only if it lies inside the artifacts folder (a row is data; the folder
    is the user's choice): a row pointing elsewhere is refused, not opened."""
    root = Path(artifacts if artifacts is not None else default_artifacts()).expanduser().resolve()
    if not run.checkpoint_path:
        raise AblateError(f"run {run.id} ({run.status}) has no checkpoint; it needs a trained run")
    path = Path(run.checkpoint_path).expanduser().resolve()
    if not path.is_relative_to(root):
        raise AblateError(f"run {run.id}'s checkpoint {path} is outside the artifacts folder {root}; checkpoints are "
                          "only loaded from there: pass --artifacts (or set ABLATE_ARTIFACTS) to the folder the "
                          "trainer wrote")
    if not path.exists():
        raise AblateError(f"run {run.id} ({run.status}) has no checkpoint at {path}; it needs a trained run whose "
                          "artifacts folder is reachable from here")
    return path


def load_run_model(run_id: int, url: str | sa.Engine | None = None, artifacts: str | Path | None = None,
                   plugin: str | None = None, run_stored: bool = False):
    """(trial, model in eval mode, tokenizer) from a run's final checkpoint inside `artifacts` (`url`: the results
    DB, or a reader's engine already open). A plugin run's code comes from the file `plugin`, or the DB's stored
    source when `run_stored`; else it is refused (ablate/plugins/stored.py)."""
    from ablate.plugins.stored import load_for

    run = store.get_run(url if isinstance(url, sa.Engine) else store.reader(url), run_id)
    trial = TrialConfig.model_validate(run.config)
    path = run_checkpoint(run, artifacts)
    trial = load_for(trial, f"sampling run {run_id}", plugin, run_stored)
    tokenizer = load_checkpoint_tokenizer(path, trial)
    return trial, load_checkpoint_model(path, trial, len(tokenizer)), tokenizer


def checkpoint_file(path: str | Path) -> Path:
    """A run's checkpoint.pt, given the file or its run folder."""
    path = Path(path).expanduser()
    file = path / "checkpoint.pt" if path.is_dir() else path
    if not file.exists():
        raise AblateError(f"no checkpoint at {file}; give a run's checkpoint.pt (runs.checkpoint_path) or its run "
                          "folder, for a trained run whose artifacts folder is reachable from here")
    return file


def load_checkpoint_tokenizer(path: str | Path, trial: TrialConfig):
    """The tokenizer the trainer saved beside a run's checkpoint (`Prepared.save_tokenizer`)."""
    from ablate import data

    folder = checkpoint_file(path).parent / "tokenizer"
    if not folder.exists():
        raise AblateError(f"no tokenizer folder beside the checkpoint ({folder}); the run did not finish")
    if trial.tokenizer.name is None:
        return data._wrap(folder / "tokenizer.json")  # ablate's trained BPE, with its special tokens
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def load_checkpoint_model(path: str | Path, trial: TrialConfig, vocab_size: int | None = None) -> torch.nn.Module:
    """A run's model in eval mode on the CPU from its checkpoint (a checkpoint.pt or the run folder)."""
    state = load_checkpoint(checkpoint_file(path))  # weights_only: a checkpoint cannot run code
    vocab_size = vocab_size or len(load_checkpoint_tokenizer(path, trial))  # as train.py: prepared.vocab_size
    model = objectives.model_for(trial, vocab_size)
    model.load_state_dict(state["model"])
    return model.eval()


@torch.no_grad()
def complete(model: torch.nn.Module, tokenizer, prompt: str, context: int, max_new: int = 64, top_k: int = 0,
             temperature: float = 1.0, seed: int = 0) -> str:
    """The prompt's continuation (text after the prompt); stops at eos or the end of the window."""
    gen = torch.Generator().manual_seed(seed)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"][: context - 1]
    start = len(ids)
    while len(ids) < min(context - 1, start + max_new):
        logits = model(torch.tensor([ids]))[0, -1].float()  # (V,)
        if top_k > 0:
            values, indices = torch.topk(logits / max(temperature, 1e-6), top_k)
            token = int(indices[torch.multinomial(torch.softmax(values, -1), 1, generator=gen)])
        else:
            token = int(logits.argmax())
        if token == tokenizer.eos_token_id:
            break
        ids.append(token)
    # decode the whole sequence, then cut the prompt: a character whose bytes span tokens decodes whole; bytes
    # that form no character (a cut at the end, or a byte token out of place) are dropped, not shown as U+FFFD
    prompt_text = tokenizer.decode(ids[:start])
    return tokenizer.decode(ids).removeprefix(prompt_text).replace("\ufffd", "")
