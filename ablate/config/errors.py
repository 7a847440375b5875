"""User-facing errors: what was wrong, where (file, key path) and what would be right."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AblateError(Exception):
    """An error caused by the user's input or environment; the CLI prints it without a traceback."""


class SpecError(AblateError):
    """One or more problems in a sweep spec, each located by file and key path."""

    def __init__(self, problems: list[str], source: str = "<spec>"):
        self.problems = problems
        self.source = source
        head = f"{source}: {len(problems)} problem{'s' if len(problems) != 1 else ''} in sweep spec"
        super().__init__(head + "\n" + "\n".join(f"  - {p}" for p in problems))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean 'x'?)' suffix when a close match exists, else ''."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def one_of(choices: Iterable[str]) -> str:
    return ", ".join(repr(c) for c in sorted(choices))


def show(value: object, limit: int = 80) -> str:
    """repr(value), cut short: an error message must not echo a huge value back."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flow(where: dict) -> str:
    """A mapping as a spec writes it inline, e.g. a claim's side: {architecture: mixer, d_model: 32}."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in where.items()) + "}"


def one_line(exc: BaseException, whole: str) -> str:
    """What a run row stores of an error: an AblateError's message; else the exception's type and first line, where
    it was raised, and where its whole traceback is (`whole`); `runs.error` never holds a traceback."""
    if isinstance(exc, AblateError):
        return str(exc)
    import traceback
    from pathlib import Path

    frames = traceback.extract_tb(exc.__traceback__)
    at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}{at}; the whole traceback is in {whole}"
