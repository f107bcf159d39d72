"""What is done to 10^5-10^6 things at once: the cyclic garbage collector paused while they are made, and the
removals of a round's folded runs done several at a time."""

from __future__ import annotations

import gc
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, List, Sequence, TypeVar

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


# removals in flight at once: each waits on the filesystem (a metadata server's answer; on a local disk mounted with
# -o discard, the freed blocks' discard), and the fold's runs are each in a directory of their own, so their waits
# overlap (benchmarks/removals.py)
AT_ONCE = 8


def each_at_once(do: Callable[[T], None], items: Sequence[T]) -> None:
    """``do`` for every item, up to AT_ONCE of them at a time in threads, returning once all have: made for the
    fold's removals of runs' directories, each of which waits on the filesystem rather than the CPU, so that a
    round removing a thousand runs takes the time of a few hundred (issue 55). An error of ``do`` is raised once
    every item was tried. A single item, or a process that may start no thread (a login node's limit on a
    user's processes), is done here, one item at a time (``do`` must bear an item done twice)."""
    futures: List[Future] = []
    if len(items) > 1:
        try:
            with ThreadPoolExecutor(max_workers=min(AT_ONCE, len(items)), thread_name_prefix="hpcrun-remove") as pool:
                for item in items:
                    futures.append(pool.submit(do, item))
        except RuntimeError:   # "can't start new thread": the rest are done here (one queued meanwhile may be twice)
            pass
    errors: List[BaseException] = []
    for item in items[len(futures):]:
        try:
            do(item)
        except Exception as exc:   # raised once every item was tried, as a worker's is
            errors.append(exc)
    errors[:0] = [exc for exc in (f.exception() for f in futures) if exc is not None]
    if errors:
        raise errors[0]
