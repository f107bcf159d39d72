"""The supervisor sends each output on to ``outputs.export`` once its input is done, and verifies it.

Why here: the copy needs the network a login or transfer node has, and must never rerun the
reconstruction; a short transfer job per output would wait in the queue for minutes to copy
seconds' worth. The supervisor runs ``streams`` copies at once in threads, records every
outcome in the store from its own thread, and counts an input done only when the destination
answers with the source's size and adler32. A failed copy is tried again after a doubling
wait; when the failure class ``export`` has no attempts left the export is given up (the
output stays on the cluster's filesystem, ``hpcrun retry --exports`` re-arms it).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from hpcrun.backends.storage import Sender, StorageError, TransferError, scheme_of, storage_for
from hpcrun.backends.storage.base import file_checksum
from hpcrun.backends.storage.posix import Directory
from hpcrun.operate.manifest import ExportEntry, Manifest
from hpcrun.operate.metrics import Family
from hpcrun.store.records import ExportRecord, ExportSummary
from hpcrun.store.store import StateStore


@dataclass(frozen=True)
class Outcome:
    ok: bool
    size: Optional[int] = None
    checksum: Optional[str] = None
    seconds: Optional[float] = None
    error: Optional[str] = None


@dataclass
class ExportRound:
    """What one round of the exporter did."""

    queued: int = 0
    started: int = 0
    verified: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)   # "dest: why" of this round's failed attempts
    given_up: int = 0
    in_flight: int = 0


def outputs_of(manifest: Manifest) -> Dict[Tuple[int, str], Tuple[str, str]]:
    """(plan job, input path) -> (source, destination) of its output, by the manifest's own export settings
    (each generation's: its outputs location and destination may differ)."""
    spec = manifest.export
    if not spec:
        return {}
    location, to = spec["location"], spec["to"].rstrip("/")
    return {(j["index"], path): (os.path.join(location, name), f"{to}/{name}") for j in manifest.jobs
            for path, name in zip(j["inputs"], j.get("outputs") or [])}


class Exporter:
    """Owned by one supervisor; ``step`` once per round, ``close`` at the end."""

    def __init__(self, manifest: Manifest, store: StateStore, campaign_id: int,
                 earlier: Iterable[Manifest] = ()):
        self.spec: Optional[ExportEntry] = None
        self.store = store
        self.campaign_id = campaign_id
        self.names: Dict[Tuple[int, str], Tuple[str, str]] = {}
        self.running: Dict[int, Tuple[ExportRecord, Future[Outcome]]] = {}
        self.pool: Optional[ThreadPoolExecutor] = None
        for older in earlier:   # the jobs of earlier generations, still in flight when this one was planned
            self.names.update(outputs_of(older))
        self.adopt(manifest)

    def adopt(self, manifest: Manifest) -> None:
        """The outputs of a (new) generation's jobs, and its export settings for the copies to come."""
        self.names.update(outputs_of(manifest))
        self.spec = manifest.export or self.spec
        if self.spec and self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=self.spec["streams"], thread_name_prefix="hpcrun-export")

    @property
    def active(self) -> bool:
        return self.spec is not None

    def step(self) -> ExportRound:
        rnd = ExportRound()
        if self.spec is None or self.pool is None:
            return rnd
        self._collect(rnd)
        rnd.queued = self._queue_new()
        self._start(rnd)
        return rnd

    def _start(self, rnd: ExportRound) -> None:
        assert self.spec is not None and self.pool is not None
        room = self.spec["streams"] - len(self.running)
        for rec in self.store.due_exports(self.campaign_id, room, skip=list(self.running)) if room > 0 else []:
            self.running[rec.input_id] = (rec, self.pool.submit(send, rec, self.spec))
            rnd.started += 1
        rnd.in_flight = len(self.running)

    def pump(self) -> None:
        """Between rounds: record ended copies and start the next ones, so streams do not idle
        for a whole poll interval (the scheduler is not asked)."""
        if self.spec is None or not any(f.done() for _, f in self.running.values()):
            return
        rnd = ExportRound()
        self._collect(rnd)
        self._start(rnd)

    def settled(self, backlog: int) -> bool:
        """Nothing copying and nothing waiting (``backlog``: this round's pending exports): every
        export verified or given up."""
        if self.spec is None:
            return True
        return not self.running and backlog == 0 and not self.store.done_unexported(self.campaign_id, limit=1)

    def close(self, wait: bool = False) -> None:
        """``wait``: let the copies in flight end and record them. Else stop without them: their rows
        stay pending and the next supervisor copies them again (a copy overwrites, so this is safe)."""
        if self.pool is None:
            return
        self.pool.shutdown(wait=wait, cancel_futures=not wait)
        if wait:
            self._collect(ExportRound())

    def _collect(self, rnd: ExportRound) -> None:
        assert self.spec is not None
        for iid, (rec, fut) in list(self.running.items()):
            if not fut.done():
                continue
            del self.running[iid]
            out = fut.result()
            attempts = rec.attempts + 1
            if out.ok:
                self.store.record_export(iid, state="verified", attempts=attempts, size=out.size,
                                         checksum=out.checksum, seconds=out.seconds)
                rnd.verified.append(rec.dest)
                continue
            rnd.failed.append(f"{rec.dest}: {out.error}")
            if attempts >= self.spec["max_attempts"]:
                self.store.record_export(iid, state="failed", attempts=attempts, error=out.error)
                rnd.given_up += 1
                continue
            wait = min(self.spec["max_backoff_s"], self.spec["backoff_s"] * 2 ** (attempts - 1))
            self.store.record_export(iid, state="pending", attempts=attempts, error=out.error,
                                     next_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=wait))

    def _queue_new(self) -> int:
        """Export rows for inputs that became done (source on the cluster, destination by output name)."""
        assert self.spec is not None
        rows = []
        for iid, path, job in self.store.done_unexported(self.campaign_id):
            where = self.names.get((job, path)) if job is not None else None
            if where is not None:
                rows.append((iid, *where))
        return self.store.queue_exports(self.campaign_id, rows)


def exported_counts(store: StateStore, campaign_id: int, inputs: Dict[str, int], exports: bool = True
                    ) -> Tuple[Dict[str, int], Optional[Dict[str, Any]]]:
    """Inputs per state where an input counts as done only once its output is verified at the
    destination (``exporting``: done, not yet verified; ``export_failed``: given up), and the
    export figures; unchanged (and None) for a campaign that exports nothing (``exports`` false)."""
    summary = store.export_summary(campaign_id)
    if summary is None and not exports:
        return inputs, None
    summary = summary or ExportSummary({"pending": 0, "verified": 0, "failed": 0}, 0, 0.0, 0)
    out = dict(inputs)
    verified, failed = summary.files["verified"], summary.files["failed"]
    out["exporting"] = max(0, inputs.get("done", 0) - verified - failed)
    out["export_failed"] = failed
    out["done"] = verified
    return out, summary.as_dict()


def export_families(e: Dict[str, Any]) -> List[Family]:
    """The exports' Prometheus families (metrics.prom)."""
    files = Family("hpcrun_export_files", "Outputs for outputs.export per state (pending, verified, failed).")
    for state, n in e["files"].items():
        files.add(n, state=state)
    return [files,
            Family("hpcrun_export_bytes_total", "Bytes verified at the export destination.", "counter").add(e["bytes"]),
            Family("hpcrun_export_backlog", "Outputs waiting to be sent or verified.").add(e["backlog"]),
            Family("hpcrun_export_failed_attempts_total", "Failed copies or verifications.", "counter")
            .add(e["failed_attempts"]),
            Family("hpcrun_export_mb_per_second", "Bytes verified / time of their copies.").add(e["mb_per_s"])]


def sender_of(spec: ExportEntry) -> Sender:
    env = tuple((str(k), str(v)) for k, v in spec["client_env"])
    return Sender(copy=tuple(spec["copy"]), ask=tuple(spec["ask"]), env=env, timeout_s=float(spec["timeout_s"]))


def send(rec: ExportRecord, spec: ExportEntry) -> Outcome:
    """Copy one output and ask the destination for its size and adler32 (a worker thread)."""
    sender = sender_of(spec)
    scheme = scheme_of(rec.dest)
    target: Any = storage_for(scheme) if scheme else Directory()
    try:
        size = os.stat(rec.source).st_size
        checksum = file_checksum(rec.source)
    except OSError as exc:
        return Outcome(False, error=f"the output {rec.source} cannot be read: {exc.strerror or exc}")
    started = time.monotonic()
    try:
        target.put(rec.source, rec.dest, sender)
        seconds = time.monotonic() - started
        there = target.stored([rec.dest], sender)[rec.dest]
    except (TransferError, StorageError) as exc:
        return Outcome(False, error=str(exc))
    if there.error or there.missing:
        return Outcome(False, error=f"the destination does not show {rec.dest}: {there.error or 'missing'}")
    if there.size != size or there.checksum != checksum:
        return Outcome(False, error=f"{rec.dest} holds {there.size} bytes {there.checksum}, the source "
                                    f"{size} bytes {checksum}")
    return Outcome(True, size, checksum, seconds)
