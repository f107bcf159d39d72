"""An input's stem from its path: a module of its own, so that the supervisor, which names QA rows by stem, does
not load the spec's models with the intake's."""

from __future__ import annotations


def stem_of(path: str) -> str:
    name = path.rpartition("/")[2]   # os.path.basename, at 10^5 calls
    return name.split(".", 1)[0] if not name.startswith(".") else name
