"""``hpcrun serve``: a read-only live page for operators, served from the state store.

The standard library's threading HTTP server is the whole web stack: the page is read-only,
serves one campaign to a handful of operators on loopback, and a login node should not need
a framework installed for it. Nothing a browser sends reaches a query or a shell: only a
fixed set of paths is answered (``/``, ``/app.js``, ``/api/summary.json``, ``/metrics``),
the query string is ignored, and every value in the page is HTML-escaped by Jinja2.
The store is read at most once per ``min_age`` seconds however many browsers poll.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import jinja2

from hpcrun import __version__
from hpcrun.backends.late.queue import Queue
from hpcrun.operate.campaign.forecast import line as forecast_line
from hpcrun.operate.plandir import clusters_of
from hpcrun.operate.tracking import footprint
from hpcrun.operate.tracking.outages import ALLOCATION
from hpcrun.operate.tracking.outages import rows as outage_rows
from hpcrun.report.figures import CampaignReport
from hpcrun.report.gather import open_campaign, report_of
from hpcrun.report.html import merit_rows
from hpcrun.resources import templates_dir

REFRESH_S = 30             # the page asks again this often
AUDIT_ROWS = 50             # the latest operator actions the page lists
MIN_AGE_S = 10.0           # the store is read at most this often
CHART_W, CHART_H = 640, 220


def _points(series: List[Tuple[str, int]], t0: float, t1: float, top: int) -> str:
    """SVG polyline points of a cumulative series on the chart's axes (time right, count up)."""
    span = max(t1 - t0, 1.0)
    out = [f"0,{CHART_H}"]
    for stamp, n in series:
        x = (dt.datetime.fromisoformat(stamp).timestamp() - t0) / span * CHART_W
        out.append(f"{x:.1f},{CHART_H - n / max(top, 1) * CHART_H:.1f}")
    return " ".join(out)


def chart(report: CampaignReport) -> Dict[str, Any]:
    """Completed and QA-passed inputs over time, as in the STAR production monitor; with a forecast, a
    line from now to the forecast end at every input done, and the time axis runs to its later bound."""
    stamps = [dt.datetime.fromisoformat(s).timestamp() for s, _ in report.timeline + report.qa_timeline]
    f = report.forecast
    if not stamps:
        return {"completed": "", "qa": "", "forecast": "", "start": None, "end": None, "top": report.inputs_total}
    t0, t1 = min(stamps), max(stamps)
    top = max(report.inputs_total, 1)
    ahead: List[Tuple[str, int]] = []
    if f and f["ready"] and f["remaining_s"]:
        ahead = [(f["made_at"], report.timeline[-1][1] if report.timeline else 0), (f["end"], top)]
        t1 = max(t1, dt.datetime.fromisoformat(f["end_high"]).timestamp())
    iso = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    return {"completed": _points(report.timeline, t0, t1, top), "qa": _points(report.qa_timeline, t0, t1, top),
            "forecast": _points(ahead, t0, t1, top).partition(" ")[2] if ahead else "",
            "start": iso(t0), "end": iso(t1), "top": top}


def _heartbeat(row: Any) -> Optional[Dict[str, Any]]:
    if row is None:
        return None
    return {"holder": row.holder, "phase": row.phase, "rounds": row.rounds, "note": row.note or "",
            "age_s": round(row.age_s()), "at": row.heartbeat_at.isoformat(timespec="seconds"),
            "pause_s": row.poll_interval_s}


def summary(plan_dir: Path, db: Optional[str] = None) -> Dict[str, Any]:
    """Everything the page shows, from the store alone (no scheduler call)."""
    with open_campaign(plan_dir, db) as (manifest, store, campaign):
        report = report_of(manifest, store, campaign)
        jobs = store.job_counts(campaign.id)
        beat = _heartbeat(store.supervisor(campaign.id))
        held = store.paused(campaign.id)
        log = [{"at": e.at.isoformat(timespec="seconds"), "who": e.who, "command": e.command, "detail": e.detail}
               for e in store.audit_log(campaign.id, limit=AUDIT_ROWS)]
        health = [(f"cluster {h.name or '(default)'} health", f"{h.state} since {h.since:%Y-%m-%d %H:%M:%S} UTC"
                   + (f": {h.detail}" if h.detail and h.state != "up" else ""))
                  for h in store.cluster_health(campaign.id)]
        outages = [o["line"] if o["daemon"] == ALLOCATION else o["text"]   # the held jobs, not the daemon's words
                   for o in outage_rows(store.outages(campaign.id), clusters_of(manifest)[0].sched)]
        pilots = Queue(Path(manifest.pilots["queue"])).view() if manifest.pilots else None   # late binding
        made = footprint.made_so_far(plan_dir, manifest, store, campaign.id,
                                     footprint.Seen(report.inputs, jobs, pilots))   # per filesystem, est.
    return {"campaign": report.campaign, "generated_at": report.generated_at, "version": __version__,
            "inputs": report.inputs, "inputs_total": report.inputs_total, "jobs": jobs,
            "succeeded": report.succeeded, "merit": merit_rows(report) + health,
            "clusters": report.clusters, "exports": report.exports,
            "failures": [{"reason": f.reason, "count": f.count, "example": f.example} for f in report.failures],
            "attempts_by_class": report.attempts_by_class, "attempts": {str(k): v for k, v in report.attempts.items()},
            "heartbeat": beat, "chart": chart(report), "refresh_s": REFRESH_S,
            "paused": held.text() if held else None, "outages": outages, "audit": log,
            "forecast": forecast_line(report.forecast) if report.forecast else "", "pilots": pilots,
            "footprint": [dict(f, cells=footprint.cells(f)) for f in made]}


@dataclass
class Cache:
    """The last summary, recomputed at most every ``min_age`` seconds."""

    compute: Callable[[], Dict[str, Any]]
    min_age: float = MIN_AGE_S
    value: Optional[Dict[str, Any]] = None
    at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> Dict[str, Any]:
        with self.lock:
            if self.value is None or time.monotonic() - self.at >= self.min_age:
                self.value = self.compute()
                self.at = time.monotonic()
            return self.value


def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              comment_start_string="{##", comment_end_string="##}")


class _Handler(BaseHTTPRequestHandler):
    """Answers a fixed set of paths; everything else is 404. Set up by :func:`make_server`."""

    server_version = f"hpcrun/{__version__}"
    routes: Dict[str, Callable[[_Handler], Tuple[str, bytes]]] = {}

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        route = self.routes.get(self.path.split("?", 1)[0])
        if route is None:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")
            return
        try:
            kind, body = route(self)
        except Exception as exc:   # a store that is busy or gone: say so, keep serving
            self._send(503, "text/plain; charset=utf-8", f"state store unavailable: {exc}\n".encode())
            return
        self._send(200, kind, body)

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet on a shared login node
        pass


def make_server(plan_dir: Path, *, db: Optional[str] = None, host: str = "127.0.0.1", port: int = 0,
                min_age: float = MIN_AGE_S) -> ThreadingHTTPServer:
    """A server for one plan directory (port 0: a free one; read ``server.server_address``)."""
    plan_dir = plan_dir.resolve()
    summary(plan_dir, db)   # refuse a plan without state now, not on the first request
    cache = Cache(lambda: summary(plan_dir, db), min_age)
    env = _environment()
    page = env.get_template("serve.html.j2")
    script = (templates_dir() / "serve.js").read_bytes()
    metrics = plan_dir / "metrics.prom"
    routes: Dict[str, Callable[[_Handler], Tuple[str, bytes]]] = {
        "/": lambda h: ("text/html; charset=utf-8", page.render(s=cache.get(), w=CHART_W, h=CHART_H).encode()),
        "/app.js": lambda h: ("text/javascript; charset=utf-8", script),
        "/api/summary.json": lambda h: ("application/json", json.dumps(cache.get()).encode()),
        "/metrics": lambda h: ("text/plain; version=0.0.4; charset=utf-8",
                               metrics.read_bytes() if metrics.exists() else b""),
    }
    handler = type("Handler", (_Handler,), {"routes": routes})
    return ThreadingHTTPServer((host, port), handler)
