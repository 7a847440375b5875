"""The architecture registry: a family is a model module (torch) and an options module (torch-free).

A family's torch-free module (OPTIONS_MODULES, `options_module(name)`) exposes what planning needs:
    Options                      frozen pydantic model of the family's options (extra keys forbidden)
    param_count(trial, vocab_size) -> int, the closed-form parameter count
    inter_token_params(trial)      -> int, parameters that mix across positions
    mixing_flops_per_token(trial)  -> float, forward FLOPs/token of token mixing (beyond 2 * params)
Its model module (FAMILIES, `family(name)`) imports torch, re-exports those, and adds
    build(trial, vocab_size)     -> nn.Module mapping input_ids (B, T) -> logits (B, T, V)

Models of the families that the stack-rebuilding objectives support (spec.OBJECTIVE_ARCHITECTURES:
bidirectional, autoencoder, one_step) also expose their parts: embed(input_ids) -> (B, T, D),
hidden_from_embeds(x) -> (B, T, D) through every block, head(hidden) -> logits, and `layers`
(the block ModuleList).

Modules are imported lazily, and reading, planning and registering a spec import only the torch-free
ones, so that they never pay for torch/transformers.
"""

from __future__ import annotations

import importlib
import types
import typing
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from ablate.errors import AblateError, did_you_mean, one_of

FAMILIES: dict[str, str] = {
    "llama": "ablate.models.llama",
    "gpt": "ablate.models.gpt",
    "mixer": "ablate.models.mixer",
    "hybrid": "ablate.models.hybrid",
    "metaformer": "ablate.models.metaformer",
    "mod": "ablate.models.mod",
}

OPTIONS_MODULES: dict[str, str] = {
    "llama": "ablate.models.llama_options",
    "gpt": "ablate.models.gpt_options",
    "mixer": "ablate.models.mixer_options",
    "hybrid": "ablate.models.hybrid_options",
    "metaformer": "ablate.models.metaformer_options",
    "mod": "ablate.models.mod_options",
}

DESCRIPTIONS: dict[str, str] = {
    "llama": "Llama-style transformer (transformers LlamaModel, SDPA attention)",
    "gpt": "early causal-LM transformer (transformers OpenAI GPT; GPT-2 as an option)",
    "mixer": "masked mixer: attention replaced by a causally masked linear map over the sequence",
    "hybrid": "Llama layers with a masked-mixer sequence layer after or beside attention",
    "metaformer": "one block design, swappable token mixer (attention, metric, quadratic, pool, identity)",
    "mod": "mixture-of-depths over Llama-style blocks (capacity routing)",
}


# Objectives that read a whole document at once (a class per document): the only ones that may use a family's
# unmasked option (metaformer `causal: false`); every language-model objective needs causal models.
UNMASKED_OBJECTIVES = ("classification",)


def check_architecture(name: str) -> None:
    if name not in FAMILIES:
        raise AblateError(
            f"unknown architecture {name!r}{did_you_mean(name, FAMILIES)}; known: {one_of(FAMILIES)}"
        )


def family(name: str) -> ModuleType:
    """The family's model module for an architecture name (imports it, and torch): for building."""
    check_architecture(name)
    return importlib.import_module(FAMILIES[name])


def options_module(name: str) -> ModuleType:
    """The family's torch-free module: Options, param_count, inter_token_params, mixing_flops_per_token."""
    check_architecture(name)
    return importlib.import_module(OPTIONS_MODULES[name])


def options_model(name: str) -> type[BaseModel]:
    """The family's Options class."""
    return options_module(name).Options


def build(trial: Any, vocab_size: int):
    """Build the trial's model: the only way the trainer gets one."""
    return family(trial.architecture).build(trial, vocab_size)


def list_families() -> list[dict[str, Any]]:
    """Every family with its description and options (name, type, default, help), for `ablate models`."""
    out = []
    for name in FAMILIES:
        options = [
            {"name": key, "type": _type_name(f.annotation), "default": f.default, "help": f.description or ""}
            for key, f in options_model(name).model_fields.items()
        ]
        out.append({"name": name, "description": DESCRIPTIONS[name], "options": options})
    return out


def _type_name(annotation: Any) -> str:
    """'int', 'bool', 'int | None', "'a' | 'b'" for Literal choices."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))
