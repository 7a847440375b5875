"""The `llama` and `gpt` families are transformers' LlamaForCausalLM, OpenAIGPTLMHeadModel and GPT2LMHeadModel written
as our own modules (ablate/models/llama.py, gpt.py): the same names, parameter order, init draws, logits, gradients,
dropout draws and bf16 arithmetic as transformers' models built from the configs the families used to build (the
studies' configs), so runs and checkpoints from before still mean the same.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from tests.models.test_models import VOCAB, Case, make_trial, tokens
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OpenAIGPTConfig, OpenAIGPTLMHeadModel

from ablate import models
from ablate.objectives.base import causal_lm_loss

pytestmark = pytest.mark.fidelity

CASES = [Case("llama"), Case("llama", {"tie_weights": True, "intermediate": 48}, {"kv_heads": 2}),
         Case("llama", {"dropout": 0.2}, {"heads": 2, "layers": 3}),
         Case("gpt"), Case("gpt", {"variant": "gpt2"}), Case("gpt", {"tie_weights": False, "dropout": 0.2}),
         Case("gpt", {"variant": "gpt2", "tie_weights": False, "dropout": 0.0}, {"layers": 3, "heads": 2})]


def options(case: Case):
    return models.options_model(case.architecture)(**case.options)


def llama_config(case: Case) -> LlamaConfig:
    trial, o = make_trial(case), options(case)
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=trial.d_model, intermediate_size=o.intermediate or 4 * trial.d_model,
        num_hidden_layers=trial.layers, num_attention_heads=trial.heads,
        num_key_value_heads=trial.kv_heads or trial.heads, head_dim=trial.d_model // trial.heads,
        max_position_embeddings=trial.context, tie_word_embeddings=o.tie_weights, attention_dropout=o.dropout,
        attn_implementation="sdpa", use_cache=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def transformers_model(case: Case, seed: int = 0) -> torch.nn.Module:
    """What the family built until it was written here: transformers' model from the studies' config."""
    trial, o = make_trial(case), options(case)
    torch.manual_seed(seed)
    if case.architecture == "llama":
        model = LlamaForCausalLM(llama_config(case))
        if o.dropout:  # the family's training-only dropout after each attention output and MLP output
            for layer in model.model.layers:
                for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    proj.register_forward_hook(lambda m, _args, out, p=o.dropout: F.dropout(out, p, m.training))
        return model
    common = dict(vocab_size=VOCAB, n_embd=trial.d_model, n_layer=trial.layers, n_head=trial.heads,
                  n_positions=trial.context, resid_pdrop=o.dropout, embd_pdrop=o.dropout, attn_pdrop=o.dropout,
                  tie_word_embeddings=o.tie_weights)
    if o.variant == "openai":
        return OpenAIGPTLMHeadModel(OpenAIGPTConfig(**common))
    return GPT2LMHeadModel(GPT2Config(**common, use_cache=False, bos_token_id=None, eos_token_id=None,
                                      attn_implementation="sdpa"))


def ours(case: Case, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return models.build(make_trial(case), VOCAB)


def logits_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.fixture(params=CASES, ids=str)
def case(request) -> Case:
    return request.param


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 4 drew its init in another order")
def test_same_names_order_and_weights_from_the_same_seed(case):
    theirs, mine = transformers_model(case).state_dict(), ours(case).state_dict()
    assert list(mine) == list(theirs)  # the optimizer's state follows parameter order: a resumed run keeps it
    for name, tensor in theirs.items():
        assert torch.equal(mine[name], tensor), name
    tied = mine["lm_head.weight"].data_ptr() == next(iter(mine.values())).data_ptr()  # the token embedding
    assert tied == options(case).tie_weights


def test_same_logits_and_gradients_on_transformers_weights(case):
    theirs, mine = transformers_model(case, seed=1), ours(case, seed=2)
    mine.load_state_dict(theirs.state_dict())
    x = tokens(3)
    for model in (theirs, mine):
        causal_lm_loss(logits_of(model.eval(), x), x)[0].backward()
    assert torch.equal(logits_of(mine, x), logits_of(theirs, x))  # the same operations in the same order
    grads = dict(theirs.named_parameters())
    for name, p in mine.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=1e-6, msg=name)


def test_training_dropout_draws_as_transformers_does(case):
    theirs, mine = transformers_model(case), ours(case)
    x = tokens(4)
    torch.manual_seed(5)
    want = logits_of(theirs.train(), x)
    torch.manual_seed(5)
    got = logits_of(mine.train(), x)
    assert torch.equal(got, want)
    with torch.no_grad():
        assert torch.equal(mine.eval()(x), mine(x)), "eval is deterministic"
        assert torch.equal(mine.train()(x), mine(x)) == (options(case).dropout == 0)


def test_bf16_autocast_rounds_where_transformers_does(case):
    theirs, mine = transformers_model(case).eval(), ours(case).eval()
    x = tokens(6)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        want, got = logits_of(theirs, x), logits_of(mine, x)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_checkpoint_of_the_wrapped_model_loads_under_any_prefix(case):
    """Checkpoints written while the family wrapped transformers' model name it `hf.`; an objective nests it."""
    theirs = transformers_model(case, seed=7).eval()
    nest = torch.nn.Module()
    nest.model = ours(case)
    nest.load_state_dict({f"model.hf.{name}": t for name, t in theirs.state_dict().items()})  # strict
    x = tokens(8)
    with torch.no_grad():
        assert torch.equal(nest.model.eval()(x), logits_of(theirs, x))
