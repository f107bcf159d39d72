"""Operators' commands on a running campaign: ``cancel``, ``pause``, ``resume`` and ``log`` (the audit
trail). Each action is recorded in the store with who (user@host) and when."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Tuple

import click


def _split(values: Tuple[str, ...]) -> Tuple[str, ...]:
    return tuple(v for value in values for v in value.split(",") if v)


def register(main: click.Group, db_option: Any, reported: Any, out: Any) -> None:
    """Add the commands to the top-level group."""
    plain = {"highlight": False, "markup": False, "soft_wrap": True}

    @main.command("cancel")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @db_option
    @click.option("--jobs", multiple=True, metavar="NAME[,NAME...]", help="plan jobs by name (see `hpcrun status`)")
    @click.option("--inputs", multiple=True, metavar="PATH[,PATH...]", help="the plan jobs holding these inputs")
    @click.option("--all", "all_jobs", is_flag=True, help="every plan job in flight")
    @click.option("--json", "as_json", is_flag=True)
    @reported
    def cancel_cmd(plan_dir: Path, db: Optional[str], jobs: Tuple[str, ...], inputs: Tuple[str, ...],
                   all_jobs: bool, as_json: bool) -> None:
        """Cancel plan jobs in flight through the scheduler. They end CANCELLED and are not retried
        unless asked (`hpcrun retry --cancelled`); `hpcrun pause` first holds new submissions too."""
        from hpcrun.operate.supervision.control import cancel

        report = cancel(plan_dir, db=db, jobs=_split(jobs), inputs=_split(inputs), all_jobs=all_jobs)
        if as_json:
            click.echo(json.dumps(report.as_dict(), indent=1))
            return
        for name, job_id in sorted(report.cancelled.items()):
            out.print(f"cancelled {name} ({job_id})", **plain)
        if report.not_in_flight:
            out.print(f"not in flight (nothing to cancel): {', '.join(report.not_in_flight)}", **plain)
        if not report.cancelled:
            out.print("nothing in flight to cancel", **plain)

    @main.command("pause")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @db_option
    @click.option("--note", default=None, help="why, for the other operators (shown by status and serve)")
    @reported
    def pause_cmd(plan_dir: Path, db: Optional[str], note: Optional[str]) -> None:
        """Hold new submissions: the supervisor keeps polling and recording, and no submit (its own or one
        by hand) sends anything until `hpcrun resume`."""
        from hpcrun.operate.supervision.control import pause

        already = pause(plan_dir, db=db, note=note)
        out.print(f"already {already.text()}" if already else "paused: no new submissions until `hpcrun resume`",
                  **plain)

    @main.command("resume")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @db_option
    @reported
    def resume_cmd(plan_dir: Path, db: Optional[str]) -> None:
        """Allow submissions again after `hpcrun pause`."""
        from hpcrun.operate.supervision.control import resume

        lifted = resume(plan_dir, db=db)
        out.print(f"resumed ({lifted.text()})" if lifted else "the campaign was not paused", **plain)

    @main.command("log")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @db_option
    @click.option("--json", "as_json", is_flag=True)
    @reported
    def log_cmd(plan_dir: Path, db: Optional[str], as_json: bool) -> None:
        """The audit trail: every state-changing action on the campaign (who as user@host, when, the
        command, what it changed), oldest first."""
        from hpcrun.operate.supervision.control import audit_log

        entries = audit_log(plan_dir, db=db)
        if as_json:
            click.echo(json.dumps([{"at": e.at.isoformat(timespec="seconds"), "who": e.who, "command": e.command,
                                    "detail": e.detail} for e in entries], indent=1))
            return
        for e in entries:
            out.print(f"{e.at:%Y-%m-%d %H:%M:%S} {e.who} {e.command}: {e.detail}", **plain)
