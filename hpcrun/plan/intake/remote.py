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
        self.settings: Dict[str, object] = {"root": plan_client(profile)}
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


def plan_client(profile: Optional[SiteProfile]) -> Client:
    """How hpcrun plan runs the XRootD client here (the profile's xrdfs, timeout, parallelism)."""
    x = profile.xrootd if profile is not None else None
    if x is None:
        return Client()
    return Client(xrdfs=tuple(shlex.split(x.xrdfs)), request_timeout_s=int(x.plan_timeout), parallel=x.plan_parallel)


def is_url(path: str) -> bool:
    return "://" in path and scheme_of(path) is not None   # most inputs are paths: no regex for them


def urls_of(paths: Sequence[str]) -> List[str]:
    """The URLs among these paths, in order: one look at their joined text when there are none (the
    usual campaign: 10^5-10^6 local paths, no call per path)."""
    return [p for p in paths if is_url(p)] if "://" in "".join(paths) else []
