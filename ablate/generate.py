"""Completions from a trained run: greedy or top-k, one token at a time, up to the run's context.

Every model here maps a prefix of length T <= context to logits, and a masked mixer's prefix equals
its fixed window right-padded, so one loop serves all: the mixer fills its window left to right, as
the studies describe (its last output position is never trained, so generation stops before it).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ablate import db, objectives
from ablate.errors import AblateError
from ablate.spec import TrialConfig


def load_run_model(run_id: int, url: str | None = None):
    """(trial, model in eval mode, tokenizer) from a run's final checkpoint."""
    from transformers import PreTrainedTokenizerFast

    run = db.get_run(db.connect(url), run_id)
    trial = TrialConfig.model_validate(run.config)
    path = Path(run.checkpoint_path) if run.checkpoint_path else None
    if path is None or not path.exists():
        raise AblateError(f"run {run_id} ({run.status}) has no checkpoint at {path}; generate needs a trained run "
                          "whose artifacts folder is reachable from here")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path.parent / "tokenizer" / "tokenizer.json"),
                                        unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>")
    state = torch.load(path, map_location="cpu", weights_only=False)
    model = objectives.model_for(trial, len(tokenizer))
    model.load_state_dict(state["model"])
    return trial, model.eval(), tokenizer


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
    return tokenizer.decode(ids[start:])
