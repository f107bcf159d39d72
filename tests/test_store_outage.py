"""The supervisor outlives its own store (issue 57): a real PostgreSQL server stopped mid-campaign, then started
again. The supervisor's pauses are shortened (``STORE_WAITS_S``) so that the outage spans many more tries than
the old give-up horizon of 11, in seconds rather than minutes: the same code path as a 20-minute outage
(benchmarks/store_outage.py runs that one). Fake sbatch/squeue/sacct (tests/fake_slurm.py) for array mode; late
binding's real bash pilot and agent (as tests/test_late_binding.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.supervision import store_outage
from hpcrun.operate.supervision.supervise import run

from .test_supervise import Cluster, _plan

# benchmarks/store_outage.py sets a 20-minute outage and the supervisor's own pauses (HPCRUN_OUTAGE_REAL_WAITS)
OUTAGE_S = float(os.environ.get("HPCRUN_OUTAGE_S", "12"))
WAITS_S = store_outage.STORE_WAITS_S if os.environ.get("HPCRUN_OUTAGE_REAL_WAITS") else (0.2, 0.4)
# the growing pause, shortened: about 30 tries in a 12-s outage (the old horizon gave up after 11)


@pytest.fixture
def own_server(monkeypatch, own_pg_server):
    """A PostgreSQL server of this test's own (the shared one serves other tests meanwhile), and a database."""
    from tests import pg
    monkeypatch.setattr(store_outage, "STORE_WAITS_S", WAITS_S)
    return pg.fresh_database(own_pg_server)


def _hook(seen: Path) -> list:
    return [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'a').write("
            "os.environ['HPCRUN_EVENT'] + ' ' + sys.stdin.read() + chr(10))", str(seen)]


def _status(plan_dir: Path, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrun.cli", "status", str(plan_dir), "--db", url],
                          capture_output=True, text=True, timeout=120)


class Outage(threading.Thread):
    """Stops the server, lets ``meanwhile`` run (the campaign goes on without its store), looks at what the
    operator sees, starts the server again."""

    def __init__(self, url: str, plan_dir: Path, meanwhile):
        super().__init__(daemon=True)
        self.url, self.plan_dir, self.meanwhile = url, plan_dir, meanwhile
        self.seen: dict = {}

    def run(self) -> None:
        from tests import pg
        pg.halt(self.url)
        self.seen["halted"] = time.time()
        try:
            time.sleep(OUTAGE_S / 2)
            self.meanwhile()
            self.seen["metrics"] = (self.plan_dir / "metrics.prom").read_text()
            self.seen["status"] = _status(self.plan_dir, self.url)
            time.sleep(max(0.0, self.seen["halted"] + OUTAGE_S - time.time()))
        finally:
            pg.resume(self.url)
            self.seen["back"] = time.time()


@pytest.mark.postgres
def test_array_jobs_that_end_while_the_store_is_away_are_recorded_at_its_return(tmp_path, spec_factory, fake_slurm,
                                                                               own_server):
    url = own_server
    seen = tmp_path / "events.txt"
    plan_dir = _plan(tmp_path, spec_factory, events={"command": _hook(seen), "on": ["store_unreachable",
                                                                                    "store_back"]})
    cluster = Cluster(fake_slurm, {})
    outage: list = []
    rounds: list = []
    said: list = []

    def between(rnd):
        rounds.append((time.time(), rnd))
        if not outage:   # the jobs are out: the store goes away, and they end while it is away
            with open_plan_store(plan_dir, url) as store:
                c = store.get_campaign("test-campaign")
                cluster.names = {j.slurm_id: j.job_name for j in store.job_states(c.id) if j.slurm_id}
            assert len(cluster.names) == 3
            outage.append(Outage(url, plan_dir, lambda: cluster.after_round(None)))
            outage[0].start()

    report = run(plan_dir, db=url, interval=1, on_round=between, sleep=time.sleep, max_rounds=30,
                 say=said.append)
    assert report.outcome == "finished", [r.summary() for _, r in rounds]
    o = outage[0]
    o.join(10)
    tries = [s for s in said if "cannot be reached" in s]
    assert len(tries) > 11 or o.seen["back"] - o.seen["halted"] > 600, said   # more than the old horizon
    assert any("answers again" in s for s in said), said
    after = [(t, r) for t, r in rounds if t > o.seen["back"]]
    assert after and after[0][1].observed == 3, [(t - o.seen["back"], r.summary()) for t, r in after]
    assert after[0][0] - o.seen["back"] < WAITS_S[-1] + 5   # within one round of its return
    assert len([a for a in fake_slurm.args() if "--job-name=" in a]) == 3   # each job once, none twice
    with open_plan_store(plan_dir, url) as store:
        c = store.get_campaign("test-campaign")
        assert {j.state for j in store.job_states(c.id)} == {"done"}
    events = [line.split(" ", 1) for line in seen.read_text().splitlines()]
    assert [e for e, _ in events] == ["store_unreachable", "store_back"], events
    back = json.loads(events[1][1])
    assert back["seconds"] >= OUTAGE_S - 1 and "since" in back and "back_at" in back
    assert "hpcrun_store_up" in o.seen["metrics"] and 'hpcrun_store_up{campaign="test-campaign"} 0' in \
        o.seen["metrics"], o.seen["metrics"]
    st = o.seen["status"]
    assert st.returncode == 75 and "Traceback" not in st.stderr, st.stderr   # EX_TEMPFAIL: try again later
    assert len(st.stderr.strip().splitlines()) == 1 and "cannot be reached" in st.stderr, st.stderr


@pytest.mark.postgres
def test_late_bound_results_committed_while_the_store_is_away_are_recorded_at_its_return(tmp_path, fake_slurm,
                                                                                        own_server):
    """The pilot keeps claiming and committing while the store is away (it never touches it); the supervisor
    keeps it (no fence, no new pilot), and its first round after the store's return records every result."""
    from hpcrun.backends.late import ledger
    from hpcrun.backends.late.queue import Queue

    from .test_late_binding import _pilot, _spec
    from .test_late_binding import _plan as _late_plan

    url = own_server
    runs = tmp_path / "runs.txt"   # written by the chain itself, a line per run: hpcrun never writes it
    chain = ["/bin/sh", "-c", 'echo "$0" >> "$2"; sleep 1; exec cp "$0" "$1"', "{input}", "{output}", str(runs)]
    n = 8
    plan = _late_plan(tmp_path, _spec(tmp_path, n, chain, jobs__pilot={
        "walltime": "00:10:00", "slots": 2, "idle_release": "60s", "input_time": "5s"}))
    q = Queue(plan / "queue")
    pilots: list = []
    outage: list = []
    rounds: list = []

    def committed() -> int:
        return len({t for p in q.d("results").glob("*") for t in p.read_text().split()})

    def meanwhile() -> None:   # the pilot works on: every input committed while the store is away
        deadline = time.monotonic() + 60
        while committed() < n and time.monotonic() < deadline:
            time.sleep(0.2)

    def between(rnd):
        rounds.append((time.time(), rnd))
        if not pilots and q.waiting():
            pilots.append(_pilot(plan, "900"))
        if pilots and not outage and any(q.claims(("live",))):
            outage.append(Outage(url, plan, meanwhile))
            outage[0].start()

    report = run(plan, db=url, interval=1, on_round=between, sleep=time.sleep, max_rounds=60)
    assert report.outcome == "finished", [r.summary() for _, r in rounds]
    o = outage[0]
    o.join(10)
    assert committed() == n
    lines = runs.read_text().splitlines()
    assert len(lines) == n and len(set(lines)) == n, lines   # every input run once, none twice
    assert report.outages and "reconnecting" in report.outages[0], report.outages   # it saw the outage
    after = [(t, r) for t, r in rounds if t > o.seen["back"]]
    assert after and after[0][1].inputs.get("done") == n, [(t - o.seen["back"], r.summary()) for t, r in after]
    assert not list(q.d("fenced").iterdir()) and not list(q.d("ended").iterdir()), "the pilot was fenced"
    assert len([a for a in fake_slurm.args() if "--job-name=latelocal.pilot" in a]) == 1   # no second pilot
    assert len({r[0] for r in ledger.results(q.root)}) == n
    with open_plan_store(plan, url) as store:
        c = store.get_campaign("latelocal")
        assert {s: k for s, k in store.counts_by_state(c.id).items() if k} == {"done": n}
    pilots[0].kill()


@pytest.fixture
def primary_and_standby(monkeypatch):
    """A primary with a database, and a streaming-replication standby of it, both on loopback; the URL names
    both, as libpq's own syntax does (the primary first, ``target_session_attrs=read-write``)."""
    from sqlalchemy.engine import make_url

    from tests import pg
    user = pg.user_or_skip()
    bases = [Path(tempfile.mkdtemp(prefix=f"hpcrun-pg-{role}-")) for role in ("primary", "standby")]
    monkeypatch.setattr(store_outage, "STORE_WAITS_S", WAITS_S)
    try:
        primary = pg.fresh_database(pg.start(bases[0], user))
        standby = pg.standby(primary, bases[1], user)
        db = make_url(primary).database
        both = (f"postgresql+psycopg://{pg.ROLE}@127.0.0.1:{make_url(primary).port},"
                f"127.0.0.1:{make_url(standby).port}/{db}?target_session_attrs=read-write")
        yield primary, make_url(standby).set(database=db).render_as_string(hide_password=False), both
    finally:
        for base in bases:
            pg.stop(base, user)
            shutil.rmtree(base, ignore_errors=True)


@pytest.mark.postgres
def test_the_supervisor_goes_on_against_a_standby_promoted_after_its_primary_stopped(tmp_path, spec_factory,
                                                                                    fake_slurm,
                                                                                    primary_and_standby):
    from sqlalchemy import create_engine, text

    from tests import pg
    primary, standby, url = primary_and_standby
    seen = tmp_path / "events.txt"
    plan_dir = _plan(tmp_path, spec_factory, events={"command": _hook(seen), "on": ["store_unreachable",
                                                                                    "store_back"]})
    cluster = Cluster(fake_slurm, {})
    failover: list = []
    rounds: list = []

    def fail_over() -> None:   # the primary goes; the jobs end meanwhile; the standby is promoted
        pg.halt(primary)
        failover.append(time.time())
        time.sleep(OUTAGE_S / 2)
        cluster.after_round(None)
        time.sleep(OUTAGE_S / 2)
        pg.promote(standby)
        failover.append(time.time())

    def between(rnd):
        rounds.append((time.time(), rnd))
        if not failover:
            with open_plan_store(plan_dir, url) as store:
                c = store.get_campaign("test-campaign")
                cluster.names = {j.slurm_id: j.job_name for j in store.job_states(c.id) if j.slurm_id}
            assert len(cluster.names) == 3
            threading.Thread(target=fail_over, daemon=True).start()
            while not failover:
                time.sleep(0.05)

    report = run(plan_dir, db=url, interval=1, on_round=between, sleep=time.sleep, max_rounds=30)
    assert report.outcome == "finished", [r.summary() for _, r in rounds]
    assert len(failover) == 2
    after = [(t, r) for t, r in rounds if t > failover[1]]
    assert after and after[0][1].observed == 3, [r.summary() for _, r in after]
    assert len([a for a in fake_slurm.args() if "--job-name=" in a]) == 3   # each job once, none twice
    engine = create_engine(standby)   # the new primary holds every record
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_is_in_recovery()")).scalar() is False
    finally:
        engine.dispose()
    with open_plan_store(plan_dir, standby) as store:
        c = store.get_campaign("test-campaign")
        assert {j.state for j in store.job_states(c.id)} == {"done"}
    assert [line.split(" ", 1)[0] for line in seen.read_text().splitlines()] == ["store_unreachable", "store_back"]


CUT_S = float(os.environ.get("HPCRUN_CUT_S", "120"))


def test_sqlite_on_a_network_filesystem_cut_off_for_two_minutes(tmp_path, spec_factory, fake_slurm, monkeypatch):
    """The plan directory, and so the default SQLite store, on sshfs; the mount is cut off for two minutes (its
    ssh client stopped: every call on it hangs, as an NFS client's does while its server fails over), the jobs
    end meanwhile, then the mount comes back. The supervisor is still running and records them; the store
    passes ``PRAGMA integrity_check``."""
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan
    from hpcrun.store.store import StateStore
    from tests import netfs

    reason = netfs.why_not()
    if reason:
        pytest.skip(f"no real network filesystem here: {reason}")
    monkeypatch.setattr(store_outage, "HUNG_S", 10.0)
    monkeypatch.setattr(store_outage, "WATCH_EVERY_S", 1.0)
    mount = netfs.SshfsMount(Path(tempfile.mkdtemp(prefix="hpcrun-cut-")))
    try:
        seen = tmp_path / "events.txt"
        spec = spec_factory({"jobs": {"array": "never"},
                             "events": {"command": _hook(seen), "on": ["store_unreachable", "store_back"]}})
        plan_dir = write_plan(load_plan(spec), mount.mount_point / "plan").out_dir
        cluster = Cluster(fake_slurm, {})
        cut: list = []
        rounds: list = []
        said: list = []

        def cut_off() -> None:
            mount.cut()
            cut.append(time.time())
            try:
                time.sleep(CUT_S / 2)
                cluster.after_round(None)   # the jobs end while the mount is cut off
                time.sleep(CUT_S / 2)
            finally:
                mount.restore()
                cut.append(time.time())

        def between(rnd):
            rounds.append((time.time(), rnd))
            if not cut:
                with open_plan_store(plan_dir) as store:
                    c = store.get_campaign("test-campaign")
                    cluster.names = {j.slurm_id: j.job_name for j in store.job_states(c.id) if j.slurm_id}
                assert len(cluster.names) == 3
                threading.Thread(target=cut_off, daemon=True).start()
                while not cut:
                    time.sleep(0.05)

        report = run(plan_dir, interval=1, on_round=between, sleep=time.sleep, max_rounds=30, say=said.append)
        assert report.outcome == "finished", [r.summary() for _, r in rounds]
        assert len(cut) == 2 and cut[1] - cut[0] >= CUT_S
        after = [(t, r) for t, r in rounds if t > cut[1]]
        assert after and after[0][1].observed == 3, [r.summary() for _, r in after]
        assert len([a for a in fake_slurm.args() if "--job-name=" in a]) == 3   # each job once, none twice
        assert any("has not answered" in s for s in said) and any("answers again" in s for s in said), said
        assert [line.split(" ", 1)[0] for line in seen.read_text().splitlines()] == ["store_unreachable",
                                                                                     "store_back"]
        with StateStore.open(plan_dir) as store:
            with store.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            c = store.get_campaign("test-campaign")
            assert {j.state for j in store.job_states(c.id)} == {"done"}
    finally:
        mount.close()
