"""What every remote storage answers at plan time, and the registry of URL schemes."""

from __future__ import annotations

import hashlib
import re
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple, Type

CHUNK = 8 * 1024 * 1024
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


class TransferError(Exception):
    """One copy to a destination failed; the message is the server's or the client's own words."""


@dataclass(frozen=True)
class Sender:
    """How the supervisor runs a protocol's client to send files (from the site profile)."""
    copy: Sequence[str] = ("xrdcp",)
    ask: Sequence[str] = ("xrdfs",)
    env: Tuple[Tuple[str, str], ...] = ()
    timeout_s: float = 6 * 3600.0
    request_timeout_s: int = 60


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

    def put(self, local: str, url: str, sender: Sender) -> None:
        """Copy ``local`` to ``url`` under a temporary name, then rename it (a killed copy never
        leaves a partial file under the final name). Raises TransferError."""
        raise TransferError(f"hpcrun cannot send files to {self.scheme}:// URLs")

    def stored(self, urls: Sequence[str], sender: Sender) -> Dict[str, Described]:
        """Size and adler32 of each URL as the destination holds it now. Raises StorageError."""
        raise StorageError(f"hpcrun cannot ask {self.scheme}:// servers what they hold")


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


def file_checksum(path: str, algo: str = "adler32") -> str:
    """The checksum value of a file (``adler32:0a1b2c3d``, ``md5:...``), read in 8 MiB chunks. Raises OSError."""
    with open(path, "rb") as f:
        if algo == "adler32":
            value = 1
            for chunk in iter(lambda: f.read(CHUNK), b""):
                value = zlib.adler32(chunk, value)
            return f"adler32:{value & 0xFFFFFFFF:08x}"
        digest = hashlib.md5(usedforsecurity=False)
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
        return f"md5:{digest.hexdigest()}"


def storage_for(scheme: str) -> Optional[Storage]:
    from hpcrun.backends import storage  # noqa: F401  (importing the package registers every scheme)

    cls = _STORAGES.get(scheme)
    return cls() if cls else None
