"""What every remote storage answers at plan time, and the registry of URL schemes."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Sequence, Type

_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://")


class StorageError(Exception):
    """The storage could not be asked at all (server unreachable, client missing)."""


@dataclass(frozen=True)
class Described:
    """One file as its server describes it; ``missing`` when the server says it does not exist,
    ``error`` for any other refusal (kept whole, for the planner's message)."""
    size: Optional[int] = None
    checksum: Optional[str] = None   # "<algo>:<hex>", lower case
    missing: bool = False
    error: Optional[str] = None


class Storage(ABC):
    """A remote storage protocol, as the planner sees it (the job's side is in the templates)."""

    scheme: ClassVar[str]

    @abstractmethod
    def syntax_error(self, url: str) -> Optional[str]:
        """Why this URL cannot be an input (None when it can)."""

    @abstractmethod
    def describe(self, urls: Sequence[str], algo: Optional[str], settings: object) -> Dict[str, Described]:
        """Size (and the ``algo`` checksum when asked) of every URL, asked in bulk, bounded in
        time. Raises StorageError when a server cannot be reached at all."""


_STORAGES: Dict[str, Type[Storage]] = {}


def register(cls: Type[Storage]) -> Type[Storage]:
    _STORAGES[cls.scheme] = cls
    return cls


def registered() -> List[str]:
    return sorted(_STORAGES)


def scheme_of(path: str) -> Optional[str]:
    """``root`` for ``root://host//file``; None for a plain path."""
    m = _SCHEME.match(path)
    return m.group(1) if m else None


def url_problem(url: str) -> Optional[str]:
    """Why ``url`` cannot be an input (None when it can): an unknown scheme, or the storage's own
    syntax rule. The one check behind the spec's ``inputs.files`` and the list file's lines."""
    scheme = scheme_of(url)
    storage = storage_for(scheme) if scheme else None
    if storage is None:
        return f"'{url}': URLs may use these schemes: " + ", ".join(f"{s}://" for s in registered())
    return storage.syntax_error(url)


def storage_for(scheme: str) -> Optional[Storage]:
    from hpcrun.backends import storage  # noqa: F401  (importing the package registers every scheme)

    cls = _STORAGES.get(scheme)
    return cls() if cls else None
