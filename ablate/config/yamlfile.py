"""Reading a sweep file safely: a bounded, UTF-8 regular file, and YAML without duplicate keys, deep
nesting or alias bombs. A wrong path or a hostile file fails fast with one message, never hangs."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml

from ablate.config.errors import AblateError, SpecError
from ablate.config.errors import show as _show

MAX_SPEC_BYTES = 2_000_000
MAX_SPEC_DEPTH = 64  # nesting levels; real sweeps use about six
MAX_SPEC_NODES = 100_000  # YAML values once aliases are expanded; real sweeps hold a few hundred


def read_yaml(path: Path) -> Any:
    """The YAML document of a sweep file, or SpecError / AblateError saying what is wrong with the file."""
    text = read_spec_text(path)
    try:
        return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - a SafeLoader
    except SpecFileRefused as exc:
        raise SpecError([str(exc)], str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError([f"not valid YAML{where}: {getattr(exc, 'problem', exc)}"], str(path)) from None
    except RecursionError:  # aliases nesting one deep block inside another, past what the checks see
        raise SpecError([f"nested too deeply: a sweep file has at most {MAX_SPEC_DEPTH} levels"], str(path)) from None


def read_spec_text(path: Path) -> str:
    """The text of a sweep file: a regular file of at most MAX_SPEC_BYTES, UTF-8 (a UTF-8 byte-order mark is dropped)."""
    if not path.exists():
        raise AblateError(f"{path}: no such sweep file (sweep files live in sweeps/*.yaml)")
    if path.is_dir():
        inside = sorted(path.glob("*.yaml"))
        hint = f", e.g. {inside[0]}" if inside else ""
        raise AblateError(f"{path}: is a folder; give one sweep file{hint}")
    if not path.is_file():
        raise AblateError(f"{path}: not a regular file (a device, pipe or socket); give a sweep file such as sweeps/smoke.yaml")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise AblateError(f"{path}: cannot read the sweep file: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        size = max(path.stat().st_size, len(raw))
        raise AblateError(f"{path}: sweep file is {size / 1e6:.1f} MB; the limit is {MAX_SPEC_BYTES / 1e6:g} MB "
                          "(a sweep is a few hundred lines; is this the right file?)")
    for bom, encoding in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                          (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if raw.startswith(bom):
            raise AblateError(f"{path}: sweep files must be UTF-8 text; this one is {encoding} (it starts with a "
                              f"{encoding} byte-order mark). Save it again as UTF-8")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise AblateError(f"{path}: sweep files must be UTF-8 text; byte 0x{raw[exc.start]:02x} at line {line}, "
                          f"column {column} is not UTF-8 (Latin-1 or Windows-1252?). Save it again as UTF-8") from None
    if "\x00" in text:
        raise AblateError(f"{path}: sweep files must be UTF-8 text; this one holds NUL bytes (a binary file, "
                          "or UTF-16 without a byte-order mark). Save it again as UTF-8")
    return text


class SpecFileRefused(yaml.YAMLError):
    """A sweep file that is valid YAML but one we refuse to read (duplicate keys, too deep, too many values)."""


class SpecLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, but refusing duplicate keys (it keeps the last silently), nesting deeper than
    MAX_SPEC_DEPTH (a RecursionError) and aliases expanding past MAX_SPEC_NODES values ("billion laughs")."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
        self._depth += 1
        try:
            if self._depth > MAX_SPEC_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise SpecFileRefused(f"nested more than {MAX_SPEC_DEPTH} levels deep at line {line}; "
                                      "a sweep needs a handful (check for unclosed [ or {)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        _check_expansion(node, self._aliases)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # unhashable: SafeLoader reports it
                continue
            line = key_node.start_mark.line + 1
            if seen is not None:
                raise SpecFileRefused(f"duplicate key {_show(key)} at line {line} (first at line {seen}); "
                                      "YAML would keep only the last. Remove one, or list the values (key: [a, b]) "
                                      "to make an axis")
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node, aliases: int) -> None:
    """Refuse documents holding more than MAX_SPEC_NODES values once aliases are expanded, or an alias
    inside the node it names (a cycle), counting without expanding anything."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth), both capped
    open_nodes: set[int] = set()

    def measure(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise SpecFileRefused(f"the list or mapping at line {node.start_mark.line + 1} holds an alias to itself "
                                  "(a cycle); write the values out")
        open_nodes.add(key)
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        count, depth = 1, 1
        for child in children:
            c, d = measure(child)
            count, depth = min(count + c, MAX_SPEC_NODES + 1), max(depth, d + 1)
            if depth > MAX_SPEC_DEPTH:
                raise SpecFileRefused(f"nested more than {MAX_SPEC_DEPTH} levels deep once its aliases are expanded "
                                      f"(line {node.start_mark.line + 1}); write the values out")
        open_nodes.discard(key)
        sizes[key] = (count, depth)
        return count, depth

    if measure(root)[0] > MAX_SPEC_NODES:
        how = f" once its {aliases} aliases (*name) are expanded" if aliases else ""
        raise SpecFileRefused(f"the file holds more than {MAX_SPEC_NODES:,} values{how}; a sweep needs a few hundred. "
                              "Use fewer aliases, or split the grid over several sweeps")
