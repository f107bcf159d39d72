"""Inputs given as URLs: what their servers say (size, checksum), asked once per plan, in bulk."""

from __future__ import annotations

import shlex
from typing import Dict, List, Optional, Sequence

from hpcrun.backends.storage import Described, StorageError, scheme_of, storage_for
from hpcrun.backends.storage.xrootd import Client
from hpcrun.model.site import SiteProfile


class Remote:
    """The planner's one view of remote inputs: each URL is asked about at most once."""

    def __init__(self, profile: Optional[SiteProfile], algo: Optional[str]):
        self.algo = algo if algo in ("adler32", "md5") else None
        x = profile.xrootd if profile is not None else None
        self.settings: Dict[str, object] = {"root": Client(
            xrdfs=tuple(shlex.split(x.xrdfs)) if x else ("xrdfs",),
            request_timeout_s=int(x.plan_timeout) if x else 10,
            parallel=x.plan_parallel if x else 4)}
        self.known: Dict[str, Described] = {}

    def ask(self, urls: Sequence[str]) -> Dict[str, Described]:
        """Size and checksum of each URL. Raises StorageError when a server cannot be asked."""
        todo: Dict[str, List[str]] = {}
        for url in urls:
            if url not in self.known:
                todo.setdefault(scheme_of(url) or "", []).append(url)
        for scheme, group in todo.items():
            storage = storage_for(scheme)
            if storage is None:
                raise StorageError(f"no storage for '{scheme}://' URLs")
            self.known.update(storage.describe(group, self.algo, self.settings.get(scheme)))
        return {u: self.known[u] for u in urls}


def is_url(path: str) -> bool:
    return "://" in path and scheme_of(path) is not None   # most inputs are paths: no regex for them
