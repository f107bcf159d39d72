"""Remote input storage: an abstract :class:`Storage` and one module per URL scheme.

An input given as ``scheme://...`` is planned through the storage registered for its scheme:
the planner asks it for sizes and checksums; the job reads it through the site's settings
(stream it, or copy it in, through a cache or not: templates/base.sh.j2 and the chain helper).
Adding a protocol is one module here and its line below; the schemes a spec may use follow
from :func:`schemes`.
"""

from typing import List

from hpcrun.backends.storage import xrootd  # noqa: F401
from hpcrun.backends.storage.base import (
    Described,
    Sender,
    Storage,
    StorageError,
    TransferError,
    registered,
    scheme_of,
    storage_for,
    url_problem,
)

__all__ = ["Described", "Sender", "Storage", "StorageError", "TransferError", "scheme_of", "schemes",
           "storage_for", "url_problem"]


def schemes() -> List[str]:
    """Every registered URL scheme (``root`` ...)."""
    return registered()
