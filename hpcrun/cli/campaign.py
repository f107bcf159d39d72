"""``hpcrun run`` (the unattended supervisor) and ``hpcrun serve`` (the operators' live view)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Optional

import click


def register(main: click.Group, db_option: Any, reported: Any, out: Any) -> None:
    """Add the commands to the top-level group (kept here so cli/__init__ stays small)."""

    @main.command("run")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @db_option
    @click.option("--once", is_flag=True, help="one round, then exit (for cron or scrontab)")
    @click.option("--follow", is_flag=True, help="keep supervising after the campaign finished (work unparked "
                  "or retried by hand goes out too)")
    @click.option("--interval", type=float, default=None, help=(
        "seconds between rounds (default 60, doubling up to 10x while nothing changes; never below the "
        "site's scheduler.min_poll_interval)"))
    @click.option("--max-rounds", type=click.IntRange(min=1), default=None, help="stop after this many rounds")
    @click.option("--metrics", type=click.Path(path_type=Path, dir_okay=False), default=None,
                  help="Prometheus text file rewritten every round (default PLAN_DIR/metrics.prom)")
    @click.option("--no-metrics", is_flag=True, help="write no metrics file")
    @click.option("--take-over", is_flag=True, help=(
        "start although another host's supervisor has a recent heartbeat (only when you know it is dead)"))
    @click.option("--json", "as_json", is_flag=True, help="print the rounds as JSON at the end")
    @reported
    def run_cmd(plan_dir: Path, db: Optional[str], once: bool, follow: bool, interval: Optional[float],
                max_rounds: Optional[int], metrics: Optional[Path], no_metrics: bool, take_over: bool,
                as_json: bool) -> None:
        """Drive PLAN_DIR's campaign to the end unattended: poll, retry by the spec's policy, submit
        within the queue's limits, finalize; safe to kill and restart at any moment."""
        from hpcrun.operate.supervise import run

        def show(rnd: Any) -> None:
            if not as_json:
                stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
                out.print(f"{stamp} {rnd.summary()}", highlight=False, markup=False, soft_wrap=True)
                for name in rnd.parked[:20]:
                    out.print(f"  parked {name}", highlight=False, markup=False)

        report = run(plan_dir, db=db, once=once, follow=follow, interval=interval, max_rounds=max_rounds,
                     metrics=False if no_metrics else metrics, take_over=take_over, on_round=show)
        if as_json:
            click.echo(json.dumps(report.as_dict(), indent=1))
        elif report.took_over:
            out.print(f"took over from {report.took_over}", highlight=False, markup=False)
        if report.outcome == "superseded":
            out.print("another supervisor took this campaign over; stopping", highlight=False, markup=False)

    @main.command("serve")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @db_option
    @click.option("--host", default="127.0.0.1", show_default=True, help=(
        "address to listen on; the default is loopback only (reach it with `ssh -L PORT:127.0.0.1:PORT`)"))
    @click.option("--port", type=click.IntRange(0, 65535), default=8750, show_default=True,
                  help="TCP port (0: any free port)")
    @reported
    def serve_cmd(plan_dir: Path, db: Optional[str], host: str, port: int) -> None:
        """A read-only live page of PLAN_DIR's campaign: progress over time, states, failures,
        efficiency, the supervisor's heartbeat (and /metrics, /api/summary.json)."""
        from hpcrun.report.web import make_server

        try:
            server = make_server(plan_dir, db=db, host=host, port=port)
        except OSError as exc:
            from hpcrun.errors import InputError, Problem
            raise InputError([Problem("--port", None, "", f"cannot listen on {host}:{port}: {exc.strerror}; "
                                      "give another --port (0 picks a free one)")]) from None
        bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
        out.print(f"serving {plan_dir} on http://{bound_host}:{bound_port}/ (Ctrl-C stops)", highlight=False,
                  markup=False, soft_wrap=True)
        try:
            server.serve_forever()
        finally:
            server.server_close()
