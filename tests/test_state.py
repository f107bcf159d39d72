"""Campaign state store (hpcrun/store/store.py): schema, migrations, claims, records, mount-table checks.

SQLite is tested for real, including two processes claiming from one file. The same
scenarios run on a throwaway PostgreSQL server (marker ``postgres``) when the server
binaries and psycopg are installed.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import multiprocessing
import os
import random
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from sqlalchemy import create_engine, insert, inspect, text

from hpcrun.backends.scheduler.base import normalize_state, parse_exit_code
from hpcrun.errors import InputError
from hpcrun.store.base import SchemaVersionError, StateStoreError
from hpcrun.store.locking.lockprobe import probe_locks
from hpcrun.store.locking.mounts import (
    OVERRIDE_FLAG,
    Mount,
    NetworkFilesystemWarning,
    check_sqlite_location,
    find_mount,
    is_network_fs,
    parse_mount_table,
)
from hpcrun.store.records import (
    NewInput,
    NewStateChange,
    NewSubmission,
    QaResult,
)
from hpcrun.store.sql import schema
from hpcrun.store.store import StateStore, _configure_sqlite

SPEC = "a" * 64
PROFILE = "b" * 64
LOCAL_ONLY = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"


def _open(target) -> StateStore:
    # the tests' temporary directories are local; a fixed table keeps them independent of the host
    return StateStore.open(target, mount_table=LOCAL_ONLY if "://" not in str(target) else None)


# ---------------------------------------------------------------------------------------------
# schema and migrations


def test_migrations_from_empty(tmp_path):
    with _open(tmp_path) as store:
        assert (tmp_path / "state.db").is_file()
        assert store.schema_version() == len(schema.MIGRATIONS)
        tables = set(inspect(store.engine).get_table_names())
        assert {"hpcrun_schema_version", "hpcrun_campaign", "hpcrun_input", "hpcrun_submission",
                "hpcrun_submission_input", "hpcrun_state_change", "hpcrun_qa_outcome"} <= tables
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        indexes = {ix["name"] for ix in inspect(store.engine).get_indexes("hpcrun_input")}
        assert "ix_hpcrun_input_campaign_id_state" in indexes


def test_reopen_is_idempotent(tmp_path):
    with _open(tmp_path) as store:
        c = store.register_campaign("reco", SPEC, PROFILE)
        store.add_inputs(c.id, [NewInput("/data/a.raw", size=1)])
    for _ in range(2):
        with _open(tmp_path) as store:
            assert store.schema_version() == len(schema.MIGRATIONS)
            assert store.register_campaign("reco", SPEC, PROFILE).id == c.id
            assert store.counts_by_state(c.id)["pending"] == 1
            with store.engine.connect() as conn:
                versions = conn.execute(text("SELECT version FROM hpcrun_schema_version")).scalars().all()
            assert versions == list(range(1, len(schema.MIGRATIONS) + 1))


def test_version_too_new_is_a_clear_error(tmp_path):
    with _open(tmp_path) as store:
        with store.engine.begin() as conn:
            conn.execute(insert(schema.schema_version).values(
                version=99, description="from the future", applied_at=dt.datetime.now(dt.timezone.utc)))
    with pytest.raises(SchemaVersionError) as exc:
        _open(tmp_path)
    message = str(exc.value)
    assert "schema version 99" in message and f"up to {len(schema.MIGRATIONS)}" in message
    assert "newer hpcrun" in message and str(tmp_path / "state.db") in message


def test_migrations_are_ordered_and_atomic(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    _configure_sqlite(engine, 5.0, memory=False)
    applied: List[int] = []

    def step(version: int, fail: bool = False):
        def apply(conn):
            applied.append(version)
            conn.execute(text(f"CREATE TABLE extra_{version} (x INTEGER)"))
            if fail:
                raise RuntimeError("step failed")
        return schema.Migration(version, f"step {version}", apply)

    steps = [schema.MIGRATIONS[0], step(2)]
    with engine.begin() as conn:
        assert schema.migrate(conn, steps) == 2
    with pytest.raises(RuntimeError):
        with engine.begin() as conn:
            schema.migrate(conn, [*steps, step(3), step(4, fail=True)])
    assert applied == [2, 3, 4]
    with engine.connect() as conn:  # the failed run left nothing behind, not even step 3
        assert schema.current_version(conn) == 2
    assert "extra_3" not in inspect(engine).get_table_names()
    with engine.begin() as conn:  # applying again only runs what is missing
        assert schema.migrate(conn, [*steps, step(3)]) == 3
    assert applied == [2, 3, 4, 3]
    with pytest.raises(ValueError, match="1, 2, 3"):
        schema.check_migrations([schema.MIGRATIONS[0], step(3)])
    engine.dispose()


def test_utc_datetimes_round_trip(tmp_path):
    with _open(tmp_path) as store:
        c = store.register_campaign("reco", SPEC, PROFILE)
        assert c.created_at.tzinfo is not None and c.created_at.utcoffset() == dt.timedelta(0)
        assert abs((dt.datetime.now(dt.timezone.utc) - c.created_at).total_seconds()) < 60


# ---------------------------------------------------------------------------------------------
# opening


def test_open_refuses_missing_plan_dir(tmp_path):
    with pytest.raises(InputError, match="is not a directory"):
        StateStore.open(tmp_path / "nope")


def test_open_by_url(tmp_path):
    with StateStore.open(f"sqlite:///{tmp_path / 'x.db'}", mount_table=LOCAL_ONLY) as store:
        assert store.schema_version() == len(schema.MIGRATIONS)
    with StateStore.open("sqlite://") as store:  # in memory: one shared connection
        c = store.register_campaign("m", SPEC, PROFILE)
        assert store.add_inputs(c.id, [NewInput("/x")]) == 1
        assert store.counts_by_state(c.id)["pending"] == 1
    with pytest.raises(InputError, match="not a database URL"):
        StateStore.open("nonsense://x")
    with pytest.raises(InputError, match="not a database URL"):
        StateStore.open("mysql+nosuchdriver://u@127.0.0.1/x")
    if importlib.util.find_spec("pymysql") is None:
        with pytest.raises(InputError, match="needs a database driver that is not installed"):
            StateStore.open("mysql+pymysql://u@127.0.0.1/x")


def test_campaign_digests_are_fixed(tmp_path):
    with _open(tmp_path) as store:
        c = store.register_campaign("reco", SPEC, PROFILE)
        assert store.register_campaign("reco", SPEC, PROFILE) == c
        assert store.get_campaign("reco") == c
        with pytest.raises(StateStoreError, match="registered with spec digest aaaaaaaaaaaa"):
            store.register_campaign("reco", "c" * 64, PROFILE)
        with pytest.raises(StateStoreError, match="no campaign named 'other'"):
            store.get_campaign("other")


# ---------------------------------------------------------------------------------------------
# bulk insert


def test_bulk_insert_100k_inputs(tmp_path):
    n = 100_000
    with _open(tmp_path) as store:
        c = store.register_campaign("big", SPEC, PROFILE)
        t0 = time.perf_counter()
        added = store.add_inputs(c.id, (NewInput(f"/data/run{i:06d}.raw", size=i) for i in range(n)))
        elapsed = time.perf_counter() - t0
        print(f"\nadd_inputs: {n} inputs in {elapsed:.2f} s ({n / elapsed:,.0f}/s) on SQLite")
        assert added == n
        assert store.counts_by_state(c.id) == {"pending": n, "submitted": 0, "running": 0, "done": 0,
                                               "failed": 0, "parked": 0}
        # registering again adds only what is new; duplicates within a batch count once
        again = [NewInput("/data/run000000.raw"), NewInput("/data/new.raw"), NewInput("/data/new.raw")]
        assert store.add_inputs(c.id, again) == 1


def test_add_inputs_in_chunks_is_one_registration(tmp_path, monkeypatch):
    """Taken a few inputs at a time, a path repeated across chunks is added once, a known input moved
    to another job is moved, its checksum recorded once, and the count is what was new."""
    from hpcrun.store import queries
    monkeypatch.setattr(queries, "ADD_CHUNK", 3)
    with _open(tmp_path) as store:
        c = store.register_campaign("chunks", SPEC, PROFILE)
        first = [NewInput(f"/d/f{i}", size=i, job_index=i, job_name=f"j{i}") for i in range(7)]
        assert store.add_inputs(c.id, iter(first + [NewInput("/d/f1", job_index=1, job_name="j1")])) == 7
        again = [NewInput(f"/d/f{i}", size=i, job_index=i + 10 if i in (2, 5) else i, job_name=f"j{i}",
                          checksum="0a0b0c0d" if i == 6 else None, checksum_algo="adler32" if i == 6 else None)
                 for i in range(9)]
        assert store.add_inputs(c.id, iter(again)) == 2
        rows = {r.path: r for r in store.inputs(c.id)}
        assert len(rows) == 9
        assert {p: r.job_index for p, r in rows.items()} == {f"/d/f{i}": i + 10 if i in (2, 5) else i for i in range(9)}
        assert (rows["/d/f6"].checksum, rows["/d/f6"].checksum_algo) == ("0a0b0c0d", "adler32")


# ---------------------------------------------------------------------------------------------
# claim, submit, observe


def _flow(target) -> None:
    """The life of a few inputs: claim, submit as an array, observe, retry, QA."""
    with _open(target) as store:
        c = store.register_campaign("flow", SPEC, PROFILE)
        store.add_inputs(c.id, [NewInput(f"/d/f{i}.raw", size=100 + i, checksum=f"{i:08x}", checksum_algo="adler32")
                                for i in range(6)])
        claim = store.claim_pending(c.id, 4, claimed_by="alice@login1:42")
        assert len(claim.inputs) == 4 and all(i.state == "submitted" for i in claim.inputs)
        assert claim.inputs[0].checksum == "00000000" and claim.inputs[0].checksum_algo == "adler32"
        assert store.counts_by_state(c.id) == {"pending": 2, "submitted": 4, "running": 0, "done": 0,
                                               "failed": 0, "parked": 0}

        # an unclaimed input, or one claimed under another token, cannot be recorded as submitted
        pending = store.inputs(c.id, ["pending"])
        with pytest.raises(StateStoreError, match="not claimed"):
            store.record_submission(c.id, NewSubmission("99", "jobs/x.sbatch", "d", "t", [pending[0].id]))
        with pytest.raises(StateStoreError, match="not claimed"):
            store.record_submission(c.id, NewSubmission("99", "jobs/x.sbatch", "d", "t", [claim.ids[0]],
                                                        claim_token="someone-else"))

        subs = [NewSubmission("1000", "jobs/reco.sbatch", "e" * 64, f"hpcrun:flow:{claim.token}", [iid],
                              array_index=k, claim_token=claim.token) for k, iid in enumerate(claim.ids[:3])]
        sids = store.record_submissions(c.id, subs)
        assert len(set(sids)) == 3
        # sbatch refused the fourth: give it back
        assert store.release_claim(claim.token, "sbatch: error: QOSMaxSubmitJobPerUserLimit") == 1
        assert store.counts_by_state(c.id)["pending"] == 3

        t0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
        assert store.record_state_changes(c.id, [NewStateChange(s, "PENDING", t0) for s in sids]) == 3
        assert store.record_state_changes(c.id, [NewStateChange(s, "PENDING", t0) for s in sids]) == 0  # re-poll
        assert store.record_state_changes(c.id, [NewStateChange(s, "RUNNING", t0 + dt.timedelta(minutes=1),
                                                                node="nid001") for s in sids]) == 3
        assert store.counts_by_state(c.id)["running"] == 3
        code, sig = parse_exit_code("7:0")
        t2 = t0 + dt.timedelta(minutes=9)
        done = [NewStateChange(sids[0], "COMPLETED", t2, 0, 0, "nid001", 480.0, 470.5, 2 * 1024 ** 3),
                NewStateChange(sids[1], "FAILED", t2, code, sig, "nid001", 60.0, 50.0, 10 ** 9, "NonZeroExitCode"),
                NewStateChange(sids[2], "CANCELLED by 1001", t2, 0, 15, "nid002")]
        assert store.record_state_changes(c.id, done) == 3
        by_id = {i.id: i for i in store.inputs(c.id)}
        first, second, third = (by_id[i] for i in claim.ids[:3])
        assert (first.state, first.attempts, first.last_reason, first.last_submission_id) == ("done", 1, None, sids[0])
        assert (second.state, second.last_reason) == ("failed", "FAILED exit 7: NonZeroExitCode")
        assert (third.state, third.last_reason) == ("failed", "CANCELLED exit 0 signal 15")
        assert by_id[claim.ids[3]].last_reason == "sbatch: error: QOSMaxSubmitJobPerUserLimit"

        history = store.state_changes(sids[0])
        assert [h.slurm_state for h in history] == ["PENDING", "RUNNING", "COMPLETED"]
        assert history[-1].observed_at == t2 and history[-1].max_rss_bytes == 2 * 1024 ** 3
        assert history[-1].cpu_s == 470.5 and history[-1].node == "nid001"

        # retry the failed one: a late observation of its old job must not touch the new attempt
        with store.engine.begin() as conn:
            conn.execute(schema.input_file.update().where(schema.input_file.c.id == second.id)
                         .values(state="pending"))
        retry = store.claim_pending(c.id, 10)
        assert second.id in retry.ids
        [new_sid] = store.record_submissions(c.id, [NewSubmission("1001", "jobs/reco.sbatch", "e" * 64, "t",
                                                                  [second.id], claim_token=retry.token)])
        assert store.record_state_changes(c.id, [NewStateChange(sids[1], "COMPLETED", t2)]) == 1
        again = {i.id: i for i in store.inputs(c.id)}[second.id]
        assert (again.state, again.attempts, again.last_submission_id) == ("submitted", 2, new_sid)

        with pytest.raises(StateStoreError, match="has no submission with id"):
            store.record_state_change(c.id, NewStateChange(10 ** 9, "RUNNING"))
        qa = store.record_qa([QaResult(first.id, "/out/f0.reco", True, 100, 99, sids[0])])
        assert len(qa) == 1


def test_claim_submit_observe_sqlite(tmp_path):
    _flow(tmp_path)


def _claim_worker(target: str, campaign_id: int, seed: int, barrier, out) -> None:
    """Claim small random batches until nothing is left (runs in a spawned process)."""
    rng = random.Random(seed)
    claims: List[Tuple[str, List[int]]] = []
    store = StateStore.open(target, mount_table=LOCAL_ONLY if "://" not in target else None)
    try:
        barrier.wait(timeout=60)
        while True:
            claim = store.claim_pending(campaign_id, rng.randint(1, 9), claimed_by=f"worker{seed}")
            if not claim.inputs:
                break
            claims.append((claim.token, claim.ids))
            time.sleep(0.002)  # sbatch would run here; without a pause SQLite lets one process starve the other
    finally:
        store.close()
        out.put(claims)


def _concurrent_claims(target: str, n_inputs: int) -> None:
    with _open(target) as store:
        c = store.register_campaign("race", SPEC, PROFILE)
        store.add_inputs(c.id, [NewInput(f"/race/{i:05d}") for i in range(n_inputs)])
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claim_worker, args=(str(target), c.id, seed, barrier, out)) for seed in (1, 2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = [iid for claims in results for _, ids in claims for iid in ids]
    print(f"\nconcurrent claims: {[len(r) for r in results]} claims, {len(claimed)} inputs")
    assert len(claimed) == len(set(claimed)), "an input was claimed twice"
    assert len(claimed) == n_inputs
    assert all(results), "both processes should have claimed something"
    with _open(target) as store:
        rows = store.inputs(c.id)
        assert {i.state for i in rows} == {"submitted"}
        token_of = {iid: token for claims in results for token, ids in claims for iid in ids}
        assert all(i.claim_token == token_of[i.id] for i in rows)


def test_concurrent_claims_two_processes_sqlite(tmp_path):
    _concurrent_claims(str(tmp_path), 3000)


def test_foreign_keys_are_enforced(tmp_path):
    with _open(tmp_path) as store:
        with pytest.raises(StateStoreError, match="refused the change") as exc:
            store.record_submission(999, NewSubmission("1", "jobs/a.sbatch", "d", "t"))
        assert "FOREIGN KEY" in str(exc.value).upper()
        with pytest.raises(StateStoreError):
            store.add_inputs(999, [NewInput("/x")])
        assert store.counts_by_state(999)["pending"] == 0  # nothing half-written


# ---------------------------------------------------------------------------------------------
# mount table


MOUNTINFO = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /global/cfs rw,relatime shared:5 - gpfs cfs rw
31 22 0:41 / /pscratch rw,relatime shared:6 - lustre 10.0.0.1@o2ib:/scratch rw,flock
32 31 259:1 / /pscratch/local rw - ext4 /dev/nvme0n1 rw
33 22 0:43 / /home/with\040space rw - nfs4 server:/home rw
34 22 8:16 / /work rw - xfs /dev/sdb rw
35 22 0:45 / /workspace rw - fuse.sshfs me@host:/ rw
36 22 8:32 / /stacked rw - ext4 /dev/sdc rw
37 36 0:48 / /stacked rw - beegfs beegfs_nodev rw
38 22 0:49 / /opt/cvmfs rw - cifs //srv/share rw
39 22 0:50 / /mnt/dvs rw - dvs /global/cfs rw
"""

PROC_MOUNTS = """/dev/sda1 / ext4 rw,relatime 0 0
server:/export /nfshome nfs rw,vers=3 0 0
overlay /containers overlay rw 0 0
"""


@pytest.mark.parametrize("path, mount_point, fstype", [
    ("/home/me/plan/state.db", "/", "ext4"),
    ("/global/cfs/cdirs/m1/plan/state.db", "/global/cfs", "gpfs"),
    ("/pscratch/sd/m/me/state.db", "/pscratch", "lustre"),
    ("/pscratch/local/state.db", "/pscratch/local", "ext4"),       # longest prefix wins
    ("/pscratch", "/pscratch", "lustre"),
    ("/home/with space/state.db", "/home/with space", "nfs4"),     # octal escapes decoded
    ("/work/plan/state.db", "/work", "xfs"),
    ("/workspace/plan/state.db", "/workspace", "fuse.sshfs"),      # /work is not a prefix of /workspace
    ("/workx/state.db", "/", "ext4"),
    ("/stacked/state.db", "/stacked", "beegfs"),                   # the later mount hides the earlier one
    ("/opt/cvmfs/state.db", "/opt/cvmfs", "cifs"),
    ("/mnt/dvs/state.db", "/mnt/dvs", "dvs"),
])
def test_find_mount_in_mountinfo(path, mount_point, fstype):
    mount = find_mount(path, parse_mount_table(MOUNTINFO))
    assert mount is not None and (mount.mount_point, mount.fstype) == (mount_point, fstype)


def test_find_mount_in_proc_mounts():
    mounts = parse_mount_table(PROC_MOUNTS)
    assert find_mount("/nfshome/a/state.db", mounts) == Mount("/nfshome", "nfs", "server:/export")
    assert find_mount("/containers/x", mounts).fstype == "overlay"


@pytest.mark.parametrize("fstype, network", [
    ("nfs", True), ("nfs4", True), ("lustre", True), ("gpfs", True), ("cifs", True), ("smb3", True),
    ("beegfs", True), ("ceph", True), ("fuse.sshfs", True), ("fuse.gcsfuse", True), ("dvs", True),
    ("ext4", False), ("xfs", False), ("tmpfs", False), ("overlay", False), ("btrfs", False),
    ("fuse.fuse-overlayfs", False), ("fuseblk", False), ("zfs", False),
])
def test_network_fs_types(fstype, network):
    assert is_network_fs(fstype) is network


def _lustre_at(path) -> str:
    return f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n31 22 0:41 / {path} rw - lustre mds@o2ib:/scratch rw\n"


def _journal(store) -> str:
    with store.engine.connect() as conn:
        return str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()


def test_sqlite_on_a_network_fs_with_working_locks_opens_without_wal(tmp_path):
    """The default store works where real sites keep plan directories: rollback journal, no flag."""
    with StateStore.open(tmp_path, mount_table=_lustre_at(tmp_path)) as store:
        assert _journal(store) == "delete"
        store.register_campaign("c", "a", "b")
    assert not list(tmp_path.glob(".hpcrun-lock-probe*")) and not (tmp_path / "state.db-wal").exists()
    with StateStore.open(tmp_path, mount_table=LOCAL_ONLY) as store:   # the same file on a local disk: WAL
        assert _journal(store) == "wal"
    with StateStore.open(f"sqlite:///{tmp_path / 'other.db'}", mount_table=_lustre_at(tmp_path)) as store:
        assert _journal(store) == "delete"   # a sqlite URL is placed the same way


def test_sqlite_where_locks_are_broken_is_refused_with_override(tmp_path):
    broken = lambda _d: "flock locks fail here (ENOSYS: Function not implemented)"  # noqa: E731
    with pytest.raises(InputError) as exc:
        check_sqlite_location(tmp_path / "state.db", mount_table=_lustre_at(tmp_path), probe=broken)
    message = str(exc.value)
    assert str(tmp_path / "state.db") in message and "lustre" in message and "ENOSYS" in message
    assert "-o flock" in message and "postgresql" in message and OVERRIDE_FLAG in message
    with pytest.warns(NetworkFilesystemWarning, match="lustre"):
        placement = check_sqlite_location(tmp_path / "state.db", mount_table=_lustre_at(tmp_path), probe=broken,
                                          allow_network_fs=True)
    assert placement.network


def test_lock_probe_sees_a_second_process_refused(tmp_path):
    assert probe_locks(tmp_path) is None
    assert not list(tmp_path.iterdir())   # the probe file is gone


def test_lock_probe_reports_a_lock_another_process_was_granted(tmp_path, monkeypatch):
    """Locks that are local to each client (NFS with local_lock, Lustre -o localflock seen from
    two nodes) look like this: the other process gets the lock too."""
    from hpcrun.store.locking import lockprobe
    monkeypatch.setattr(lockprobe, "_take_here", lambda fd: [])   # this process takes nothing
    said = probe_locks(tmp_path)
    assert said is not None and "was granted the fcntl lock" in said and "flock" in said


def test_real_mount_table(tmp_path):
    if not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("no /proc/self/mountinfo on this system")
    placement = check_sqlite_location(tmp_path / "state.db")
    assert placement.mount is not None and placement.mount.fstype
    print(f"\n{tmp_path} is on {placement.mount.fstype} mounted at {placement.mount.mount_point}")


def test_slurm_state_words():
    assert normalize_state("CANCELLED by 1001") == "CANCELLED"
    assert normalize_state("cancelled+") == "CANCELLED"
    assert normalize_state("") == "UNKNOWN"
    assert parse_exit_code("0:15") == (0, 15) and parse_exit_code("") == (None, None)


# ---------------------------------------------------------------------------------------------
# PostgreSQL on a throwaway cluster


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh database on the run's PostgreSQL server (tests/conftest.py)."""
    from tests.pg import fresh_database
    return fresh_database(pg_server)


@pytest.mark.postgres
def test_postgres_store(pg_url):
    with StateStore.open(pg_url) as store:
        assert store.schema_version() == len(schema.MIGRATIONS)
        c = store.register_campaign("pg-big", SPEC, PROFILE)
        n = 20_000
        t0 = time.perf_counter()
        assert store.add_inputs(c.id, (NewInput(f"/data/{i:06d}") for i in range(n))) == n
        print(f"\nadd_inputs: {n} inputs in {time.perf_counter() - t0:.2f} s on PostgreSQL")
        with pytest.raises(StateStoreError, match="foreign key"):
            store.record_submission(999_999, NewSubmission("1", "jobs/a.sbatch", "d", "t"))
    with StateStore.open(pg_url) as store:  # reopen: nothing to migrate
        assert store.counts_by_state(c.id)["pending"] == n
    _flow(pg_url)
    _concurrent_claims(pg_url, 2000)
    with StateStore.open(pg_url) as store:
        with store.engine.begin() as conn:
            conn.execute(insert(schema.schema_version).values(
                version=99, description="future", applied_at=dt.datetime.now(dt.timezone.utc)))
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        StateStore.open(pg_url)


# ---- plan jobs: claim, settle, retry, park (schema version 2) ---------------------------


def _jobs_store(tmp_path, n=4):
    store = _open(tmp_path)
    c = store.register_campaign("camp", "a" * 64, "b" * 64)
    # job j processes two inputs: the unit of submission is the plan job
    store.add_inputs(c.id, [NewInput(f"/d/f{j}_{k}.raw", size=10, job_index=j) for j in range(n) for k in range(2)])
    return store, c


def test_version_1_store_migrates_to_2_keeping_its_rows(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'state.db'}")
    with engine.begin() as conn:
        assert schema.migrate(conn, schema.MIGRATIONS[:1]) == 1
        conn.execute(insert(schema.campaign).values(name="old", spec_digest="s", profile_digest="p",
                                                    created_at=dt.datetime.now(dt.timezone.utc)))
    engine.dispose()
    with _open(tmp_path) as store:
        assert store.schema_version() == len(schema.MIGRATIONS)
        c = store.get_campaign("old")
        store.add_inputs(c.id, [NewInput("/x", job_index=7, events=12)])
        [rec] = store.inputs(c.id)
        assert (rec.job_index, rec.events) == (7, 12)
    cols = {col["name"] for col in inspect(create_engine(f"sqlite:///{tmp_path / 'state.db'}"))
            .get_columns("hpcrun_state_change")}
    assert {"alloc_cpus", "started_at", "ended_at"} <= cols


def test_claim_jobs_takes_whole_jobs_once(tmp_path):
    store, c = _jobs_store(tmp_path)
    with store:
        assert store.pending_jobs(c.id) == [0, 1, 2, 3]
        first = store.claim_jobs(c.id, [0, 2])
        assert sorted({i.job_index for i in first.inputs}) == [0, 2] and len(first.inputs) == 4
        again = store.claim_jobs(c.id, [0, 1])  # job 0 is taken: only job 1 comes back
        assert sorted({i.job_index for i in again.inputs}) == [1]
        assert store.pending_jobs(c.id) == [3]
        unresolved = {cl.token: sorted({i.job_index for i in cl.inputs}) for cl in store.unresolved_claims(c.id)}
        assert unresolved == {first.token: [0, 2], again.token: [1]}
        by_job: Dict[int, List[int]] = {}
        for i in first.inputs:
            by_job.setdefault(i.job_index, []).append(i.id)
        store.record_submissions(c.id, [NewSubmission("900", "jobs/a.sbatch", "d", "camp.x", ids, j, first.token)
                                        for j, ids in sorted(by_job.items())])
        assert [cl.token for cl in store.unresolved_claims(c.id)] == [again.token]
        assert store.release_claim(again.token, "released: test") == 2
        assert store.pending_jobs(c.id) == [1, 3]
        states = {j.job_index: (j.state, j.slurm_id, j.attempts) for j in store.job_states(c.id)}
        assert states == {0: ("submitted", "900_0", 1), 1: ("pending", None, 0), 2: ("submitted", "900_2", 1),
                          3: ("pending", None, 0)}
        assert [(a.slurm_id, a.job_index) for a in store.active_submissions(c.id)] == [("900_0", 0), ("900_2", 2)]


def _submit_and_end(store, c, jobs, job_id, state, reason=None, cancel_by=None):
    """Submit these plan jobs and end them in ``state``; ``cancel_by``: an operator asked to cancel them
    (hpcrun cancel) before they ended."""
    claim = store.claim_jobs(c.id, jobs)
    by_job: Dict[int, List[int]] = {}
    for i in claim.inputs:
        by_job.setdefault(i.job_index, []).append(i.id)
    sids = store.record_submissions(c.id, [NewSubmission(job_id, "jobs/a.sbatch", "d", "t", ids, j, claim.token)
                                           for j, ids in sorted(by_job.items())])
    if cancel_by:
        assert store.request_cancel(c.id, jobs, cancel_by) == len(jobs)
    store.record_state_changes(c.id, [NewStateChange(s, state, exit_code=7 if state == "FAILED" else 0,
                                                     reason=reason) for s in sids])


def _finalize_flow(store: StateStore, c) -> None:
    """Finalize rounds: a row before sbatch, the job recorded once, observations stored on change."""
    assert store.finalize_rounds(c.id) == []
    first = store.add_finalize_round(c.id, f"{c.name}.finalize", "any")
    assert (first.round, first.job_id, first.after, first.tag) == (1, None, "any", f"{c.name}.finalize")
    with pytest.raises(StateStoreError, match="no recorded job"):
        store.add_finalize_round(c.id, f"{c.name}.finalize", "any")  # round 1 is not settled yet
    store.note_finalize(first.id, "sbatch refused: Invalid qos")
    assert store.finalize_rounds(c.id)[0].reason == "sbatch refused: Invalid qos"
    store.record_finalize_job(first.id, "300", "d" * 64, "afterany:100:101")
    with pytest.raises(StateStoreError, match="already has a job"):
        store.record_finalize_job(first.id, "301", "d" * 64, "")
    [rec] = store.finalize_rounds(c.id)
    assert (rec.job_id, rec.dependency, rec.reason) == ("300", "afterany:100:101", None)
    assert rec.submitted_at is not None and rec.submitted_at.tzinfo is not None
    assert store.record_finalize_state(first.id, "PENDING", reason="Dependency")
    assert not store.record_finalize_state(first.id, "PENDING", reason="Dependency")  # unchanged: no write
    assert store.record_finalize_state(first.id, "COMPLETED", exit_code=0, elapsed_s=5.0)
    second = store.add_finalize_round(c.id, f"{c.name}.finalize", "any")
    assert second.round == 2 and [r.round for r in store.finalize_rounds(c.id)] == [1, 2]
    assert store.finalize_rounds(c.id)[0].last_state == "COMPLETED"


def test_finalize_rounds_sqlite(tmp_path):
    store, c = _jobs_store(tmp_path)
    with store:
        _submit_and_end(store, c, [0, 1], "10", "RUNNING")
        _submit_and_end(store, c, [2], "11", "COMPLETED")
        assert store.in_flight_job_ids(c.id) == ["10"]
        _finalize_flow(store, c)


def test_version_2_store_migrates_to_the_current_version(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'state.db'}")
    with engine.begin() as conn:
        assert schema.migrate(conn, schema.MIGRATIONS[:2]) == 2
        conn.execute(insert(schema.campaign).values(name="old", spec_digest="s", profile_digest="p",
                                                    created_at=dt.datetime.now(dt.timezone.utc)))
    engine.dispose()
    with _open(tmp_path) as store:
        assert store.schema_version() == len(schema.MIGRATIONS) == 11
        c = store.get_campaign("old")
        assert store.add_finalize_round(c.id, "old.finalize", "ok").round == 1
        assert store.take_lease(c.id, "supervisor").epoch == 1 and store.pause(c.id) is None
    found = inspect(create_engine(f"sqlite:///{tmp_path / 'state.db'}"))
    assert {"hpcrun_finalize", "hpcrun_supervisor", "hpcrun_lease", "hpcrun_audit", "hpcrun_pause",
            "hpcrun_cluster", "hpcrun_export", "hpcrun_script_text", "hpcrun_outage"} <= set(found.get_table_names())
    assert "adjust" in {c["name"] for c in found.get_columns("hpcrun_input")}
    assert {"failure_class", "changes", "cluster", "cancel_requested_by"} <= {
        c["name"] for c in found.get_columns("hpcrun_submission")}
    assert {"ix_hpcrun_input_state_job", "ix_hpcrun_input_state_submission"} <= {
        i["name"] for i in found.get_indexes("hpcrun_input")}


def _policy(max_attempts: int, cancelled: bool = False, total: int = 10):
    from hpcrun.model.retry import RetrySpec, effective_rules
    from hpcrun.operate.retries.policy import RetryPolicy

    spec = RetrySpec(max_attempts=max_attempts, cancelled=cancelled)
    return RetryPolicy(effective_rules(spec), total, {}, 3600)


def test_retry_policy_parks_after_the_class_limit_and_leaves_cancels(tmp_path):
    store, c = _jobs_store(tmp_path, n=5)
    with store:
        _submit_and_end(store, c, [0, 1], "10", "FAILED", "chain(s) failed: 0(rc=3)")
        _submit_and_end(store, c, [2], "11", "CANCELLED", cancel_by="op@login1:42")   # hpcrun cancel
        _submit_and_end(store, c, [3], "12", "COMPLETED")
        _submit_and_end(store, c, [4], "14", "CANCELLED", "cancelled by uid 0 (root)")  # the site's scancel
        assert _policy(2).apply(store, c.id, dry_run=True) == ([0, 1, 4], [])
        assert store.pending_jobs(c.id) == []  # the dry run changed nothing
        assert _policy(2).apply(store, c.id) == ([0, 1, 4], [])
        assert store.operator_cancelled(c.id) == 2      # job 2's two inputs: left failed for the operator
        _submit_and_end(store, c, [0, 1], "13", "FAILED", "chain(s) failed: 1(rc=3)")
        assert _policy(2).apply(store, c.id) == ([], [0, 1])   # a chain class failure twice: parked
        states = {j.job_index: (j.state, j.attempts) for j in store.job_states(c.id)}
        assert states == {0: ("parked", 2), 1: ("parked", 2), 2: ("failed", 1), 3: ("done", 1), 4: ("pending", 1)}
        parked = {j.job_index: j for j in store.job_states(c.id) if j.state == "parked"}
        assert parked[0].last_reason.startswith("parked: chain (chain(s) failed: 1(rc=3)), 2 time(s) in 2 attempt(s)")
        assert store.attempts_by_class(c.id) == {"chain": 4, "site_cancel": 1, "cancelled": 1}
        for attempt in range(4):   # the site cancels job 4 again and again: parked at site_cancel's limit (5)
            _submit_and_end(store, c, [4], f"2{attempt}", "CANCELLED")
            assert _policy(9).apply(store, c.id, [4]) == (([4], []) if attempt < 3 else ([], [4]))
        parked = {j.job_index: j for j in store.job_states(c.id) if j.state == "parked"}
        assert "site_cancel" in parked[4].last_reason and "5 time(s)" in parked[4].last_reason, parked[4].last_reason
        assert _policy(2, cancelled=True).apply(store, c.id) == ([2], [])   # retry --cancelled
        assert store.unpark(c.id, [1]) == [1]
        assert sorted(store.pending_jobs(c.id)) == [1, 2]
        assert {j.job_index: j.attempts for j in store.job_states(c.id)}[1] == 0


def test_postgres_jobs_report_and_submit_lock(pg_url):
    from sqlalchemy.engine import make_url

    from hpcrun.report.figures import build
    from hpcrun.store.locking.lock import LockTimeout, submit_lock

    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # a database of its own: other tests leave theirs at odd versions
        conn.execute(text("DROP DATABASE IF EXISTS hpcrun_jobs"))
        conn.execute(text("CREATE DATABASE hpcrun_jobs"))
    admin.dispose()
    pg_url = make_url(pg_url).set(database="hpcrun_jobs").render_as_string(hide_password=False)
    with StateStore.open(pg_url) as store:
        c = store.register_campaign("pg-jobs", SPEC, PROFILE)
        store.add_inputs(c.id, [NewInput(f"/d/g{j}.raw", size=10, job_index=j, events=5) for j in range(3)])
        _submit_and_end(store, c, [0, 1], "20", "FAILED", "chain(s) failed")
        _submit_and_end(store, c, [2], "21", "COMPLETED")
        assert _policy(1, total=1).apply(store, c.id) == ([], [0, 1])   # like `retry --max-attempts 1`
        assert [(j.state, j.exit_code) for j in store.job_states(c.id)] == [("parked", 7), ("parked", 7),
                                                                           ("done", 0)]
        report = build("pg-jobs", store.report_rows(c.id), {})
        assert (report.runs_ended, report.inputs["parked"], report.succeeded) == (3, 2, 1)
        assert [(f.reason, f.count) for f in report.failures] == [("chain failed (exit 7)", 2)]
        with submit_lock(store.engine, store.location, "pg-jobs", timeout=5):
            with StateStore.open(pg_url) as other:
                with pytest.raises(LockTimeout, match="submit lock"):
                    with submit_lock(other.engine, other.location, "pg-jobs", timeout=0.6):
                        pass
                with submit_lock(other.engine, other.location, "another-campaign", timeout=1):
                    pass
        with submit_lock(store.engine, store.location, "pg-jobs", timeout=1):  # released on exit
            pass
        _finalize_flow(store, c)


def _hold_lock(db: str, ready: str, release: str) -> None:
    from hpcrun.store.locking.lock import submit_lock
    with _open(Path(db).parent) as store, submit_lock(store.engine, store.location, "camp"):
        Path(ready).touch()
        while not Path(release).exists():
            time.sleep(0.05)


def test_sqlite_submit_lock_waits_names_the_holder_and_dies_with_it(tmp_path):
    from hpcrun.store.locking.lock import LockTimeout, submit_lock
    _open(tmp_path).close()
    ready, release = tmp_path / "ready", tmp_path / "release"
    proc = multiprocessing.get_context("spawn").Process(
        target=_hold_lock, args=(str(tmp_path / "state.db"), str(ready), str(release)))
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with _open(tmp_path) as store:
            told: List[str] = []
            with pytest.raises(LockTimeout) as exc:
                with submit_lock(store.engine, store.location, "camp", timeout=0.5, on_wait=told.append):
                    pass
            assert f"pid {proc.pid}" in str(exc.value) and told and f"pid {proc.pid}" in told[0]
            proc.kill()  # SIGKILL: the OS drops the flock, no stale lock is left behind
            proc.join()
            with submit_lock(store.engine, store.location, "camp", timeout=5):
                pass
    finally:
        if proc.is_alive():
            proc.kill()


def test_counts_are_read_once_a_round_unless_this_process_changes_inputs(tmp_path):
    """Within ``one_round`` the counts per state are asked of the database once, and again after a write that
    may change inputs (a claim), not after one that cannot (a lease, the campaign's row); outside, every time."""
    from sqlalchemy import event

    with StateStore.open(f"sqlite:///{tmp_path / 'x.db'}", mount_table=LOCAL_ONLY) as store:
        c = store.register_campaign("m", SPEC, PROFILE)
        store.add_inputs(c.id, [NewInput(f"/d/f{i}", job_index=i, job_name=f"j{i}") for i in range(4)])
        asked: List[str] = []
        event.listen(store.engine, "before_cursor_execute",
                     lambda *a: asked.append(a[2]) if "count(" in a[2].lower() and "group by" in a[2].lower()
                     else None)
        with store.one_round():
            assert store.job_counts(c.id)["pending"] == 4 and store.counts_by_state(c.id)["pending"] == 4
            store.take_lease(c.id, "submit")
            store.register_campaign("m", SPEC, PROFILE)
            assert store.job_counts(c.id)["pending"] == 4 and store.counts_by_state(c.id)["pending"] == 4
            assert len(asked) == 2
            store.claim_jobs(c.id, [0, 1])
            assert store.job_counts(c.id)["submitted"] == 2 and len(asked) == 3
        store.job_counts(c.id)
        store.job_counts(c.id)
        assert len(asked) == 5
