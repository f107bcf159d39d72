"""A pause of the cyclic garbage collector while 10^5-10^6 objects are made at once."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


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
