"""The nodes' caches of staged inputs (``xrootd.node_cache``): a job keeps what it copied in, a later
job on the same node reads it from there once its checksum matches the plan's, a corrupted copy is
dropped and fetched again, the cache is trimmed least recently used first, and each job writes what
its node holds to the shared index. Real XRootD origin on loopback; the jobs run outside Slurm as in
tests/test_xrootd.py (tests/cluster/test_locality.py and benchmarks/locality.py run it on the cluster).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from .conftest import shellcheck_cmd
from .test_xrootd import adler, plan_job, run_job, write_case
from .xrootd import USER, Servers, why_not

pytestmark = pytest.mark.skipif(bool(why_not()), reason=why_not() or "ok")


@pytest.fixture(scope="module")
def servers():
    s = Servers()
    s.origin.start()
    yield s
    s.origin.kill()
    shutil.rmtree(s.root, ignore_errors=True)




def run_on(plan: Path, job_id: str, node: str) -> subprocess.CompletedProcess:
    return run_job(plan, job_id, node=node)


def events(plan: Path, job_id: str):
    log = next((plan / "run").glob(f"*/{job_id}")) / "cache.tsv"
    return [line.split("\t")[:3] for line in log.read_text().splitlines()] if log.exists() else []


def _setup(servers, case, max_size="100MB", n=3):
    data = {f"f{k}": os.urandom(400_000 + k) for k in range(n)}
    urls = [servers.put(f"store/{case.name}/{name}.raw", d) for name, d in data.items()]   # new names per test
    caches = case / "caches"
    caches.mkdir()
    caches.chmod(0o1777)
    profile = {"node_cache": {"path": str(caches / "{node}"), "max_size": max_size, "index": str(case / "index")}}
    plan = plan_job(case, write_case(case, {"files": urls}, xrootd=profile))
    return data, urls, plan, caches


def test_a_second_job_on_the_node_reads_its_inputs_from_the_cache(servers, case):
    data, urls, plan, caches = _setup(servers, case)
    script = next((plan / "jobs").glob("*.sbatch"))
    lint = subprocess.run(shellcheck_cmd() + ["-s", "bash", "-S", "style", str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    first = run_on(plan, "301", "n1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert [e[0] for e in events(plan, "301")] == ["miss"] * 3
    mine = caches / "n1" / f"hpcrun.cache.{USER}"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and mine.stat().st_uid == _uid(USER)
    index = (case / "index" / "n1.tsv").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in index) == sorted(urls)
    assert all(line.split("\t")[2] == adler(data[Path(line.split("\t")[0]).stem]) for line in index)

    second = run_on(plan, "302", "n1")
    assert second.returncode == 0, second.stdout + second.stderr
    assert [e[0] for e in events(plan, "302")] == ["hit"] * 3
    assert not (next((plan / "run").glob("*/302")) / "transfers.tsv").exists()   # nothing read from the origin
    for name, d in data.items():
        assert (case / "out" / f"{name}.out").read_bytes() == d

    other = run_on(plan, "303", "n2")           # another node: its own cache, empty
    assert other.returncode == 0 and [e[0] for e in events(plan, "303")] == ["miss"] * 3


def test_a_corrupted_cached_copy_is_dropped_and_fetched_again(servers, case):
    data, urls, plan, caches = _setup(servers, case)
    assert run_on(plan, "311", "n1").returncode == 0
    mine = caches / "n1" / f"hpcrun.cache.{USER}"
    victim = next(p for p in mine.iterdir()
                  if len(p.name) == 32 and urls[1] in (p.parent / f"{p.name}.meta").read_text())
    victim.write_bytes(b"\0" * victim.stat().st_size)     # same size, other bytes (a bad disk, a stray write)
    done = run_on(plan, "312", "n1")
    assert done.returncode == 0, done.stdout + done.stderr
    got = events(plan, "312")
    # copied several at a time: the rows in the order the copies ended
    assert ["corrupt", urls[1]] in [e[:2] for e in got] and [e[0] for e in got].count("hit") == 2, got
    assert ["miss", urls[1]] in [e[:2] for e in got], got
    assert (case / "out" / "f1.out").read_bytes() == data["f1"]
    assert victim.read_bytes() == data["f1"]             # the cache holds the good copy again


def test_the_cache_is_trimmed_least_recently_used_first(servers, case):
    data, urls, plan, caches = _setup(servers, case, max_size="1MB", n=3)   # 3 x 400 kB > 1 MB
    assert run_on(plan, "321", "n1").returncode == 0
    mine = caches / "n1" / f"hpcrun.cache.{USER}"
    # the job's own three inputs are in use: none is dropped though the cache is over its size
    assert len([p for p in mine.iterdir() if len(p.name) == 32]) == 3 and events(plan, "321")[-1][0] == "miss"
    # a job with other inputs: the least recently used of the old ones go until the cache fits
    more = [servers.put(f"store/{case.name}/g{k}.raw", os.urandom(300_000)) for k in range(2)]
    (case / "plan").rename(case / "plan-1")
    plan2 = plan_job(case, write_case(case, {"files": more}, xrootd={"node_cache": {
        "path": str(caches / "{node}"), "max_size": "1MB", "index": str(case / "index")}}))
    done = run_on(plan2, "322", "n1")
    assert done.returncode == 0, done.stdout + done.stderr
    evicted = [e for e in events(plan2, "322") if e[0] == "evict"]
    assert evicted and {e[1] for e in evicted} <= set(urls), evicted
    kept = [p for p in mine.iterdir() if len(p.name) == 32]
    assert sum(p.stat().st_size for p in kept) <= 1_000_000
    assert {line.split("\t")[0] for line in (case / "index" / "n1.tsv").read_text().splitlines()} >= set(more)


def test_a_cache_directory_another_user_made_is_refused(servers, case):
    data, urls, plan, caches = _setup(servers, case)
    squat = caches / "n1" / f"hpcrun.cache.{USER}"
    squat.mkdir(parents=True)                            # made by root first
    done = run_on(plan, "331", "n1")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "another user owns it" in (done.stdout + done.stderr)


def _uid(user):
    import pwd
    return pwd.getpwnam(user).pw_uid
