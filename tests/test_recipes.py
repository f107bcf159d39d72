"""The supervisor recipes in contrib/supervisor/: parsed, and the command each names run for real
against a plan (on the fake Slurm). This machine has neither systemd (PID 1 is not systemd) nor
Debian's scrontab binary, so the units themselves cannot be started here."""

from __future__ import annotations

import configparser
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.store.store import open_store

RECIPES = Path(__file__).resolve().parents[1] / "contrib" / "supervisor"
EXAMPLE_PLAN = "/global/cscratch1/prod/reco.plan"
HPCRUN = [sys.executable, "-m", "hpcrun"]


def _plan(tmp_path, spec_factory) -> Path:
    return write_plan(load_plan(spec_factory({"jobs": {"array": "never"}})), tmp_path / "plan").out_dir


def _argv(command: str, plan_dir: Path) -> list:
    """The recipe's hpcrun command with this test's plan and this checkout's hpcrun."""
    words = shlex.split(command.replace(EXAMPLE_PLAN, str(plan_dir)))
    at = next(i for i, w in enumerate(words) if w.endswith("hpcrun"))
    return HPCRUN + words[at + 1:]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def test_systemd_unit_runs_the_supervisor_and_stops_it_cleanly(tmp_path, spec_factory, fake_slurm):
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str   # systemd keys are case-sensitive
    unit.read(RECIPES / "hpcrun-campaign.service")
    service = unit["Service"]
    assert service["Restart"] == "on-failure" and service["KillSignal"] == "SIGTERM"
    assert service["ExecStart"].startswith("%h/.local/bin/hpcrun run ") and unit["Install"]["WantedBy"]
    plan_dir = _plan(tmp_path, spec_factory)
    argv = _argv(service["ExecStart"].replace("%h", str(Path.home())), plan_dir) + ["--interval", "1"]
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()          # the first round is done: systemd stops the unit now
    assert "round 1: jobs 3 submitted; submitted 3" in first, first + proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err         # a stop is not a failure: Restart=on-failure leaves it stopped
    with open_store(plan_dir) as store:
        beat = store.supervisor(store.get_campaign("test-campaign").id)
    assert beat.phase == "stopped"


def test_scrontab_and_crontab_entries_run_one_round(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    lines = [ln for ln in (RECIPES / "scrontab.example").read_text().splitlines() if ln and not ln.startswith("# ")]
    scron, entry = lines
    opts = shlex.split(scron)[1:]
    assert scron.startswith("#SCRON ") and {"-p", "-t", "-J"} <= set(opts)
    fields = entry.split(None, 5)
    assert fields[:5] == ["*/5", "*", "*", "*", "*"]
    proc = subprocess.run(_argv(fields[5], plan_dir), env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "round 1:" in proc.stdout, proc.stderr
    cron = [ln for ln in (RECIPES / "crontab.example").read_text().splitlines() if ln and not ln.startswith("#")]
    command = cron[0].split(None, 5)[5]
    assert command.startswith("flock -n ") and " --once " in command
    hp = command.split(" hpcrun ", 1)[1].split(" >>", 1)[0]
    proc = subprocess.run(HPCRUN + shlex.split(hp.replace(EXAMPLE_PLAN, str(plan_dir))), env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "round 1:" in proc.stdout and "submitted 0" not in proc.stdout, proc.stderr
    assert len([a for a in fake_slurm.args() if "--job-name=" in a]) == 3   # the second round submitted nothing new
