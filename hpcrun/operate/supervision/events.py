"""The spec's event hook: a command run on the login node when the campaign finishes, parks work
or stalls (to page someone, post to a chat, open a ticket).

The command is an argv list run without a shell, so nothing in an event (job names come
from the spec) can become shell syntax; the event travels in environment variables and as
JSON on stdin. It runs with a time limit, its output goes to ``PLAN_DIR/events.log``, and
its failure is logged, never fatal: a broken pager must not stop a production.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hpcrun.operate.manifest import Manifest

DEFAULT_STALL_S = 6 * 3600.0
# told while the plan directory's own filesystem may be the one away (a hung mount): the hook runs from
# OUTSIDE, not from the plan directory, lest it hang in its first step
AWAY = ("store_unreachable",)
OUTSIDE = "/"
LOG_NAME = "events.log"


@dataclass
class Hook:
    command: Sequence[str]
    on: Sequence[str]
    stall_after_s: float
    timeout_s: float
    plan_dir: Path
    campaign: str

    @classmethod
    def from_manifest(cls, manifest: Manifest, plan_dir: Path) -> Hook:
        ev: Mapping[str, Any] = manifest.events or {}
        return cls(list(ev.get("command") or []), list(ev.get("on") or []),
                   float(ev.get("stall_after_s") or DEFAULT_STALL_S), float(ev.get("timeout_s") or 60),
                   plan_dir, manifest.campaign)

    def emit(self, event: str, detail: Dict[str, Any]) -> Optional[int]:
        """Log the event; run the command if the spec asks for this event. Returns its exit code."""
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        body = json.dumps({"event": event, "campaign": self.campaign, "at": now, **detail}, sort_keys=True)
        lines = [f"{now} {event} {body}"]
        rc: Optional[int] = None
        if self.command and event in self.on:
            rc, said = self._run(event, body)
            lines.append(f"{now} {event} hook exit {rc}: {said}")
        self._log(lines)
        return rc

    def _run(self, event: str, body: str) -> tuple[int, str]:
        env = {**os.environ, "HPCRUN_EVENT": event, "HPCRUN_CAMPAIGN": self.campaign,
               "HPCRUN_PLAN_DIR": str(self.plan_dir)}
        try:
            proc = subprocess.run(list(self.command), input=body, capture_output=True, text=True, env=env,
                                  timeout=self.timeout_s, cwd=OUTSIDE if event in AWAY else self.plan_dir,
                                  check=False)
        except subprocess.TimeoutExpired:
            return -1, f"killed after {self.timeout_s:.0f} s"
        except OSError as exc:
            return -1, f"could not run {self.command[0]!r}: {exc.strerror}"
        said = (proc.stdout + proc.stderr).strip().replace("\n", " | ")
        return proc.returncode, said[-500:]

    def _log(self, lines: List[str]) -> None:
        try:
            with open(self.plan_dir / LOG_NAME, "a", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in lines))
        except OSError:
            pass   # a full or read-only filesystem must not stop the supervisor
