"""Shell quoting: every value that reaches a generated script goes through here."""

from __future__ import annotations

import re
from typing import Iterable

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def quote(value: object) -> str:
    """Quote one shell word so bash reads it back byte for byte.

    Single quotes stop every expansion; an embedded single quote is closed,
    escaped and reopened. Newlines stay literal inside single quotes.
    """
    text = str(value)
    if text and _SAFE.fullmatch(text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def join(words: Iterable[object]) -> str:
    return " ".join(quote(w) for w in words)


_DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]*$")


def sbatch_value(value: object) -> str:
    """A value for an ``#SBATCH --opt=value`` line (sbatch strips double quotes)."""
    text = str(value)
    if "\n" in text or "\r" in text or '"' in text:
        raise ValueError(f"{text!r} cannot be written into an #SBATCH line")
    return text if _DIRECTIVE_SAFE.match(text) else f'"{text}"'
