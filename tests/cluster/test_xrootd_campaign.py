"""A campaign whose inputs live on a real XRootD server runs end to end on the test cluster:
`hpcrun plan` asks the server for sizes and checksums, the array jobs copy their inputs in with
xrdcp, one input is corrupted and one removed after planning, the server is killed in the middle
of a copy and restarted, and `hpcrun report` shows MB/s per core against the spec's target.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from pathlib import Path

import pytest
import yaml

from tests.xrootd import Servers, crash_when, why_not

from .campaigns import run_files

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(bool(why_not()), reason=why_not() or "ok")]

FILES = 8
SIZE = 3_000_000
EVENTS = 1000


@pytest.fixture
def servers():
    s = Servers().start()
    yield s
    s.stop()


def _copy_started(plan: Path) -> bool:
    """A job has begun copying (its xrdcp log exists), and 0.3 s of the copy has run."""
    if (plan / "run").exists() and next((plan / "run").glob("*/*/xrdcp.log"), None):
        time.sleep(0.3)
        return True
    return False


def test_a_campaign_reads_its_inputs_from_xrootd(slurm_cluster, hpcrun_bin, servers):
    data = {f"run{n:03d}": os.urandom(SIZE) for n in range(FILES)}
    urls = {name: servers.put(f"store/raw/{name}.raw", d) for name, d in data.items()}
    work = slurm_cluster.workdir
    out = slurm_cluster.pfs / "out"
    out.mkdir()
    slurm_cluster.chown(out)
    # sizes and events listed; the checksums are asked of the server
    slurm_cluster.write(work / "inputs.txt", "".join(f"{u} {SIZE} {EVENTS}\n" for u in urls.values()))
    # the origin is killed while a copy runs: 256 KiB in flight at 3 MiB/s (about 1 s a file)
    slow = "env XRD_CPCHUNKSIZE=262144 XRD_CPPARALLELCHUNKS=1 xrdcp --xrate 3m"
    slurm_cluster.write(work / "profiles" / "xrd-cluster.yaml", yaml.safe_dump({
        "name": "xrd-cluster", "extends": "local-test",
        "xrootd": {"xrdcp": slow, "retries": 3, "connection_retry": 3, "connection_window": "2s"}}))
    spec = {"name": "e2e-xrootd", "site": {"profile": "xrd-cluster"}, "walltime": "00:05:00",
            "inputs": {"list_file": "inputs.txt"},
            "jobs": {"files_per_job": 1, "chains_per_node": 1},
            "chain": {"command": ["/bin/cp", "{input}", "{output}"]},
            "outputs": {"location": str(out), "pattern": "{stem}.out"},
            "targets": {"mb_per_s_per_core": 12.5}}
    slurm_cluster.write(work / "campaign.yaml", yaml.safe_dump(spec, sort_keys=False))
    env = {"HPCRUN_PROFILE_PATH": str(work / "profiles"), "COLUMNS": "200"}

    def hp(*args, timeout=300):
        return slurm_cluster.run_as_user([hpcrun_bin, *args], cwd=str(work), env=env, timeout=timeout)

    planned = hp("plan", "campaign.yaml", "--out", "plan")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan = work / "plan"
    manifest = json.loads((plan / "manifest.json").read_text())
    sums = {j["inputs"][0]: j["checksums"][0] for j in manifest["jobs"]}
    assert sums == {u: f"adler32:{zlib.adler32(data[n]) & 0xFFFFFFFF:08x}" for n, u in urls.items()}

    # after planning: run001 corrupted at the source (same size), run002 gone
    servers.put("store/raw/run001.raw", bytes(b ^ 0xFF for b in data["run001"]))
    (servers.data / "store" / "raw" / "run002.raw").unlink()

    events: list = []
    stop = threading.Event()
    killer = threading.Thread(target=crash_when, args=(lambda: _copy_started(plan), servers.origin, events, stop),
                              daemon=True)
    killer.start()
    run = hp("run", "plan", "--interval", "2", timeout=900)
    stop.set()
    killer.join(timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [e for e, _ in events] == ["killed", "restarted"], events

    st = json.loads(hp("status", "plan", "--json", "--all").stdout)
    by_job = {j["name"]: os.path.basename(j["inputs"][0]).split(".")[0] for j in manifest["jobs"]}
    status = {by_job[j["job"]]: j for j in st["jobs"]}
    assert {n: r["status"] for n, r in status.items()} == {
        n: ("parked" if n in ("run001", "run002") else "done") for n in data}, st
    assert "checksum mismatch" in status["run001"]["reason"], status["run001"]
    assert "does not exist on its server" in status["run002"]["reason"], status["run002"]
    for name, d in data.items():
        if name not in ("run001", "run002"):
            assert (out / f"{name}.out").read_bytes() == d

    # the copies: every success is whole; the outage was ridden out (a copy spanned it, or failed and was retried)
    killed, restarted = events[0][1], events[1][1]
    rows = [line.split("\t") for text in run_files(plan, "*/*/transfers.tsv") for line in text.splitlines()]
    ok = [r for r in rows if r[4] == "0"]
    assert all(int(r[1]) == SIZE for r in ok)
    spanned = [r for r in ok if float(r[5]) < killed and float(r[5]) + int(r[2]) / 1000 > restarted]
    retried = [r for r in rows if r[4] not in ("0", "53", "54")]
    assert spanned or retried, (rows, events)

    report = json.loads(hp("report", "plan", "--json", "--no-plots").stdout)
    assert report["targets"] == {"mb_per_s_per_core": 12.5}
    assert report["mb_per_s_per_core"] > 0 and report["succeeded"] == FILES - 2
    assert report["transfers"]["files"] >= FILES - 2 and report["transfers"]["mb_per_s"] > 0
    assert report["attempts_by_class"].get("checksum") == 2 and report["attempts_by_class"].get("setup") == 1
    text = hp("report", "plan", "--no-plots").stdout
    assert "input MB/s per core" in text and "(target 12.5: " in text, text
    print(f"\nxrootd campaign: {FILES} files, report MB/s per core {report['mb_per_s_per_core']:.3g} "
          f"(target 12.5), copies {report['transfers']}, outage {restarted - killed:.1f} s, "
          f"spanned {len(spanned)}, retried {len(retried)}")
