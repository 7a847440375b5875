"""Dotted overrides, Hydra's form: `defaults.lr=1e-3`, `grid.0.d_model=[64,128]` on the command line set one field
of a sweep file's contents, as an edit of the file would, before they are parsed (so validation names any
mistake, as it would in the file)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from ablate.config.errors import SpecError
from ablate.config.errors import show as _show
from ablate.config.yamlfile import SpecFileRefused, SpecLoader

FORM = "KEY=VALUE, a dotted path and a YAML value, e.g. defaults.lr=1e-3 or grid.0.d_model=[64,128]"
WHERE = "<overrides>"
ECHO = 200  # characters of an argument an error echoes back at most


class ValueLoader(SpecLoader):
    """The sweep file's bounded reader, but reading `1e-3` as a number, as a user typing it means (YAML 1.1 reads
    an exponent without a dot as text)."""


EXPONENT = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$")  # 1e-3, 2E+5, .5e2
ValueLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT, list("-+0123456789."))


def parse_assignment(text: str) -> tuple[str, Any]:
    """(the dotted key, its value read as YAML) of one `KEY=VALUE`; SpecError saying the form where it is not one."""
    key, equals, raw = str(text).partition("=")
    key = ".".join(part.strip() for part in key.split("."))
    if not equals or not all(key.split(".")):
        raise SpecError([f"override {_show(text, ECHO)}: not of the form {FORM}"], WHERE)
    try:
        value = yaml.load(raw, Loader=ValueLoader) if raw.strip() else ""  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, SpecFileRefused, RecursionError) as exc:
        raise SpecError([f"override {_show(text, ECHO)}: the value is not valid YAML ({getattr(exc, 'problem', exc)}); quote "
                         "the whole argument for the shell, e.g. 'grid.0.d_model=[64, 128]'"], WHERE) from None
    return key, value


def assign(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted; a list's items by index from 0) in `data` to `value`, creating missing mappings on the
    way. A list index past the end, or a path through a value that is neither a mapping nor a list, is refused:
    the message names the path and how to set it instead."""
    parts = key.split(".")
    node: Any = data
    for depth in range(len(parts) - 1):
        slot = _slot(node, parts, depth)
        if isinstance(node, dict) and node.get(slot) is None:
            node[slot] = {}  # a mapping the file does not have yet, as an edit would add it
        node = node[slot]
    node[_slot(node, parts, len(parts) - 1)] = value


MISSING = object()  # `lookup`'s answer for a path the data does not have


def lookup(data: Any, key: str) -> Any:
    """The value at dotted `key` (a list's items by index), or MISSING; never raises (`assign` says what is wrong)."""
    node = data
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def same(before: Any, after: Any) -> bool:
    """Whether an override leaves a value as it was: equal, and a flag still a flag (True == 1 in Python)."""
    return before is not MISSING and before == after and isinstance(before, bool) == isinstance(after, bool)


def value_text(value: Any) -> str:
    """A value as the notes and the sweep's name say it: `0.001`, `[64,128]`, `{"steps":100}`, `h100`."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def _cut(text: str) -> str:
    """An argument as an error echoes it: at most ECHO characters (a pasted file must not come back whole)."""
    return text if len(text) <= ECHO else text[:ECHO - 3] + "..."


def _slot(node: Any, parts: list[str], depth: int) -> Any:
    """Where `parts[depth]` is in `node`: a mapping's key, or a list's index below its length."""
    key, where, part = (_cut(text) for text in (".".join(parts), ".".join(parts[:depth]), parts[depth]))
    if isinstance(node, dict):
        return int(part) if part.isdigit() and int(part) in node and part not in node else part
    if not isinstance(node, list):
        raise SpecError([f"override {key}: {where} is {_show(node)}, neither a mapping nor a list, so it has no "
                         f"{part!r}; set {where} itself, e.g. {where}={{{part}: ...}}"], WHERE)
    if part.isdigit() and int(part) < len(node):
        return int(part)
    span = f"indices 0 to {len(node) - 1}" if node else "no items"
    raise SpecError([f"override {key}: {where} is a list of {len(node)} ({span}); {part!r} is not one of them. To "
                     f"add or remove items, set the whole list, e.g. {where}=[...]"], WHERE)
