"""Training objectives: what a trial's model is, and how a batch becomes a summed loss and a token count.

An objective is two files and one line in BUILTIN_OBJECTIVES below. ablate.config.registry holds the table; this
package registers the built-ins through `ablate.objective`'s lazy form (import paths) when the registry's first
lookup imports it, and imports no torch. A plugin passes the same names to `ablate.objective` instead:

    NAME_options.py  torch-free, read when a spec is validated and planned and when a report is written:
        Options                 a frozen pydantic model (extra keys forbidden): the trial's objective_options
        ARCHITECTURES           the families it is built for (default None: every one)
        UNMASKED                True: it may use a family's unmasked option (default False)
        TOKEN_TARGETS           False: its targets are not tokens, so eos_is_target does not apply (default True)
        NEXT_TOKEN              True: logits at t predict token t + 1, a report samples from it (default False)
        check_trial(trial)      raises ValueError for a trial it cannot run, past Options (default: none)
        passes(trial)           (forward passes over all parameters, stacks of token mixing) per token,
                                relative to one causal pass, for FLOPs (default (1.0, 1.0))
        param_counts(trial, total, inter, vocab, family)  (total, inter-token) parameters of its model from one
                                model's of the family (`family`: its options module), for `plan` (default: those)
    NAME.py          torch:
        build(trial, vocab_size) -> nn.Module   forward maps input_ids (B, T) to logits (B, T, V)
        loss(trial) -> LossFn   (model, input_ids, labels) -> (loss sum, counted targets)
        count(trial)            labels -> the number of targets that loss counts, on the host
        check_data(trial, prepared)  optional: run once before training
        input_tokens(labels)    optional: tokens read, if not the next-token targets
        ACCURACY                optional, True: the eval pass reports the fraction of rows classified right

base.py holds what the torch files share: the trainer's entry points (model_for, loss_function, target_counter,
token_counter, check_data), the Objective wrapper that DDP and torch.compile wrap, and the common losses.
"""

from __future__ import annotations

from ablate.config.registry import register_objective
from ablate.config.registration import objective

__all__ = ["BUILTIN_OBJECTIVES", "register_objective"]

BUILTIN_OBJECTIVES = {  # name: what it is; its modules are NAME.py (torch) and NAME_options.py (torch-free)
    "clm": "causal language modelling: every position predicts the next token",
    "bidirectional": "every token predicted from both sides: a forward and a reverse stack summed before the head",
    "multi_token": "n tokens ahead by n chained passes of one model",
    "autoencoder": "the window reconstructed from the encoder's last hidden state alone",
    "one_step": "the window's second half predicted from its first in one pass",
    "classification": "one class per labelled document, with loss and accuracy",
}
for _name, _description in BUILTIN_OBJECTIVES.items():  # through the public API's lazy form, as a plugin would
    objective(_name, options=f"ablate.objectives.{_name}_options", build=f"ablate.objectives.{_name}",
              description=_description)
