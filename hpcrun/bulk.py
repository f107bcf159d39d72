"""What is done to 10^5-10^6 things at once: the cyclic garbage collector paused while they are made, and the
removals of a round's runs and results done several at a time."""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")


@contextmanager
def bulk() -> Iterator[None]:
    """No cyclic garbage collection while a plan of 10^5-10^6 inputs is built or written, or a poll
    records 10^5 transitions: the objects made live until the end (nothing to collect), and each
    collection would scan them all again (a third of the planning time at 10^5 inputs, a quarter of
    a poll's). Reference counting still frees; cycles are collected once the pause ends."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# removals in flight at once: a metadata server (Lustre's, GPFS's, an NFS server) serves several requests of one
# client at a time, and each removal's wait on a local disk mounted with -o discard (the freed block's discard) is
# its own
AT_ONCE = 8


def each_at_once(do: Callable[[T], None], items: Sequence[T]) -> None:
    """``do`` for every item, up to AT_ONCE of them at a time in threads, returning once all have: made for
    removals, each of which waits on the filesystem rather than the CPU (a metadata server's answer; on a local
    disk, a freed block's discard), so that a round removing a thousand runs' directories takes the time of a
    hundred (issue 55). An error of ``do`` is raised once every item was tried; a single item is done here (no
    thread for it)."""
    if len(items) <= 1:
        for item in items:
            do(item)
        return
    with ThreadPoolExecutor(max_workers=min(AT_ONCE, len(items)), thread_name_prefix="hpcrun-remove") as pool:
        futures = [pool.submit(do, item) for item in items]
    for future in futures:   # every one ended (the pool's end waits for all): the first error, if any
        future.result()
