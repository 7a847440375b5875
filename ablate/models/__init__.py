"""The built-in architecture zoo, registered in `ablate.config.registry` (one line per family below).

A family is a model module (torch) and an options module (torch-free); the registry's docstring says what each
exposes. They register through `ablate.architecture`, as a plugin does, in its lazy form (import paths). Models of the families that the stack-rebuilding objectives support (objectives.stack_options.WITH_PARTS:
bidirectional, autoencoder, one_step) also expose their parts: embed(input_ids) -> (B, T, D),
hidden_from_embeds(x) -> (B, T, D) through every block, head(hidden) -> logits, and `layers` (the block ModuleList).

Modules are imported lazily, and reading, planning and registering a spec import only the torch-free ones, so that
they never pay for torch/transformers.
"""

from __future__ import annotations

import types
import typing
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ablate.config.registry import (check_architecture, families, model_module, options_model, options_module,
                                    register_architecture)
from ablate.config.registration import architecture

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

__all__ = ["build", "check_architecture", "families", "family", "list_families",
           "options_model", "options_module", "register_architecture", "ZOO"]

ZOO = {  # name: what it is; its modules are ablate/models/NAME.py (torch) and NAME_options.py (torch-free)
    "llama": "Llama-style transformer (transformers' Llama written as our own modules, SDPA attention)",
    "gpt": "early causal-LM transformer (transformers OpenAI GPT; GPT-2 as an option)",
    "mixer": "masked mixer: attention replaced by a causally masked linear map over the sequence",
    "hybrid": "Llama layers with a masked-mixer sequence layer after or beside attention",
    "metaformer": "one block design, swappable token mixer (attention, metric, quadratic, pool, identity)",
    "mod": "mixture-of-depths over Llama-style blocks (capacity routing)",
}
for _name, _description in ZOO.items():  # the zoo is the first plugin: the public API's lazy form
    architecture(_name, options=f"ablate.models.{_name}_options", build=f"ablate.models.{_name}",
                 description=_description)

def family(name: str) -> ModuleType:
    """The family's model module for an architecture name (imports it, and torch): for building."""
    return model_module(name)


def build(trial: TrialConfig, vocab_size: int):
    """Build the trial's model: the only way the trainer gets one."""
    return family(trial.architecture).build(trial, vocab_size)


def list_families() -> list[dict[str, Any]]:
    """Every family with its description and options (name, type, default, help), for `ablate models`."""
    out = []
    for name, fam in families().items():
        options = [
            {"name": key, "type": _type_name(f.annotation), "default": f.default, "help": f.description or ""}
            for key, f in options_model(name).model_fields.items()
        ]
        out.append({"name": name, "description": fam.description, "options": options,
                    "source": fam.source.describe()})
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
