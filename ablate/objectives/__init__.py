"""Training objectives: what a trial's model is, and how a batch becomes a summed loss and a token count.

An objective is two files and one `register_objective` line below (ablate.config.registry holds the table; this
package registers the built-ins when the registry's first lookup imports it, and imports no torch):

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

__all__ = ["register_objective"]

register_objective("clm", "ablate.objectives.clm", "ablate.objectives.clm_options",
                   "causal language modelling: every position predicts the next token")
register_objective("bidirectional", "ablate.objectives.bidirectional", "ablate.objectives.bidirectional_options",
                   "every token predicted from both sides: a forward and a reverse stack summed before the head")
register_objective("multi_token", "ablate.objectives.multi_token", "ablate.objectives.multi_token_options",
                   "n tokens ahead by n chained passes of one model")
register_objective("autoencoder", "ablate.objectives.autoencoder", "ablate.objectives.autoencoder_options",
                   "the window reconstructed from the encoder's last hidden state alone")
register_objective("one_step", "ablate.objectives.one_step", "ablate.objectives.one_step_options",
                   "the window's second half predicted from its first in one pass")
register_objective("classification", "ablate.objectives.classification", "ablate.objectives.classification_options",
                   "one class per labelled document, with loss and accuracy")
