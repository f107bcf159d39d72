"""A stop asked of the supervisor by a signal (a batch system's or systemd's stop), seen between rounds."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable, Dict, Optional


class Stop:
    """SIGTERM/SIGINT end the supervisor between rounds (a batch system's or systemd's stop)."""

    def __init__(self) -> None:
        self.asked = False
        self._old: Dict[int, Any] = {}

    def __enter__(self) -> Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, _sig: int, _frame: Any) -> None:
        self.asked = True

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def sleep(self, seconds: float, sleep: Callable[[float], None],
              between: Optional[Callable[[], bool]] = None, slice_s: Callable[[], float] = lambda: 1.0) -> None:
        """The pause, in slices of a second (or ``slice_s()``); ``between`` runs after each, its own time counted
        in the pause (a read of the queue that takes seconds on a busy login node does not stretch it), and cuts
        the pause short by returning True (the campaign may have ended)."""
        left = seconds
        while not self.asked and left > 0:   # in slices, so a stop is seen within a second
            step = min(1.0, slice_s(), left)
            sleep(step)
            left -= step
            if between is not None:
                t0 = time.monotonic()
                if between():
                    return
                left -= time.monotonic() - t0
