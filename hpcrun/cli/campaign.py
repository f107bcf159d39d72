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
        from hpcrun.operate.supervision.supervise import run

        def show(rnd: Any) -> None:
            if not as_json:
                stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
                out.print(f"{stamp} {rnd.summary()}", highlight=False, markup=False, soft_wrap=True)
                for name in rnd.parked[:20]:
                    out.print(f"  parked {name}", highlight=False, markup=False)

        def say(text: str) -> None:   # the store's outages: told as they happen, whatever --json says
            stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
            click.echo(f"{stamp} {text}", err=as_json)

        report = run(plan_dir, db=db, once=once, follow=follow, interval=interval, max_rounds=max_rounds,
                     metrics=False if no_metrics else metrics, take_over=take_over, on_round=show, say=say)
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

    _outputs_command(main, db_option, reported)
    _logs_command(main, db_option, reported, out)


def _outputs_command(main: click.Group, db_option: Any, reported: Any) -> None:
    """`hpcrun outputs`: the catalogue export."""
    @main.command("outputs")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @db_option
    @click.option("--json", "as_json", is_flag=True, help="one JSON array, a record a line")
    @click.option("--csv", "as_csv", is_flag=True, help="CSV with a header line (inputs as JSON)")
    @click.option("--generation", type=click.IntRange(1), default=None, help="only this generation's outputs")
    @reported
    def outputs_cmd(plan_dir: Path, db: Optional[str], as_json: bool, as_csv: bool, generation: Optional[int]) -> None:
        """Every output of PLAN_DIR's campaign that passed QA, with its provenance record (for a file
        catalogue), streamed as it is read: text lines (path, size, checksum, generation, job), --json or --csv."""
        import csv
        import sys

        from hpcrun import api
        from hpcrun.operate.outputs.provenance import as_csv_rows, as_json_lines, outputs_of

        if as_json and as_csv:
            raise click.UsageError("give --json or --csv, not both")
        write = sys.stdout.write
        if as_json:   # the records as stored (JSON already): passed on, not parsed and written again
            for piece in as_json_lines(outputs_of(plan_dir, db=db, generation=generation, raw=True)):
                write(piece)
            sys.stdout.flush()
            return
        records = api.outputs(plan_dir, db=db, generation=generation)
        if as_csv:
            writer = csv.writer(sys.stdout, lineterminator="\n")
            for row in as_csv_rows(records):
                writer.writerow(row)
        else:
            for rec in records:
                write(f"{rec['output']}\t{rec.get('size') or '-'}\t{rec.get('checksum') or '-'}\t"
                      f"{rec.get('generation')}\t{rec.get('job_id')}\n")
        sys.stdout.flush()


def _logs_command(main: click.Group, db_option: Any, reported: Any, out: Any) -> None:
    """`hpcrun logs`: one input's logs and run records, folded or not."""
    @main.command("logs")
    @click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
    @click.argument("name")
    @db_option
    @click.option("--json", "as_json", is_flag=True, help="as JSON: the inputs, their logs and runs' files")
    @click.option("--file", "only", default=None, metavar="NAME",
                  help="only the run files whose path ends with NAME (e.g. chains/0.log, reason)")
    @reported
    def logs_cmd(plan_dir: Path, name: str, db: Optional[str], as_json: bool, only: Optional[str]) -> None:
        """The logs and run records of the input NAME of PLAN_DIR's campaign (its path, its file name or its
        job's name): the scheduler's log of each of its jobs (late binding: the pilot's log of each claim),
        then every file of each run, whether the run kept its directory (it failed) or was folded (it
        succeeded). Each file is shown after a ``==> where <==`` line, as tail does."""
        import json
        import sys

        from hpcrun import api

        found = api.logs(plan_dir, name, db=db)
        if as_json:
            json.dump([f.to_dict() for f in found], sys.stdout, indent=1)
            sys.stdout.write("\n")
            return
        write = sys.stdout.write
        for f in found:
            write(f"input {f.input}\tjob {f.job}\tstate {f.state}\tattempts {f.attempts}"
                  + (f"\treason {f.last_reason}" if f.last_reason else "") + "\n")
            for path, text in f.scheduler_logs if only is None else ():
                write(f"==> {path} <==\n{text}" + ("" if text.endswith("\n") or not text else "\n"))
            for run in f.runs:
                for rel, text in run.files.items():
                    if only is None or rel.endswith(only):
                        kind = "folded, " if run.folded else ""
                        write(f"==> {rel} of run {run.run_id} ({kind}{run.where}) <==\n{text}"
                              + ("" if text.endswith("\n") or not text else "\n"))
        sys.stdout.flush()
