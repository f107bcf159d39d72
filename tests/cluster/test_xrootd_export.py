"""Outputs sent back to the origin (``outputs.export``) on the test cluster: a campaign reads its
inputs from a real XRootD origin on loopback and the supervisor sends every output back to it,
verified by the server's size and adler32. The origin is SIGKILLed while an export is in flight
and started again; an input corrupted after planning fails its checksum and its output is never
sent. The test checks the origin's files itself, byte for byte, not hpcrun's records.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.xrootd import crash_when, why_not

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(bool(why_not()), reason=why_not() or "ok")]

FILES = 8
SIZE = 2_000_000




def _export_in_flight(sent: Path) -> bool:
    return sent.exists() and any(p.name.endswith(".hpcrun-part") for p in sent.iterdir())


@pytest.mark.parametrize("binding", ["array", "late"])
def test_outputs_go_back_to_the_origin_verified_across_an_origin_crash(slurm_cluster, hpcrun_bin, xrootd_origin,
                                                                      binding):
    """The late-binding twin claims the same inputs in 2 pilots of 2 slots: what is exported, and its
    records, do not depend on who ran the job."""
    sfx = "" if binding == "array" else "-late"
    late = {"binding": "late", "pilot": {"walltime": "00:10:00", "slots": 2, "nodes": 2}} if sfx else {}
    data = {f"run{n:03d}": os.urandom(SIZE) for n in range(FILES)}
    urls = {name: xrootd_origin.put(f"store/raw{sfx}/{name}.raw", d) for name, d in data.items()}
    work = slurm_cluster.workdir
    out = slurm_cluster.pfs / f"out-export{sfx}"
    out.mkdir()
    slurm_cluster.chown(out)
    slurm_cluster.write(work / "inputs-export.txt", "".join(f"{u} {SIZE} 100\n" for u in urls.values()))
    # copies at 2 MiB/s (1 s a file), so that the kill lands in the middle of an export
    slow = "env XRD_CPCHUNKSIZE=262144 XRD_CPPARALLELCHUNKS=1 xrdcp --xrate 2m"
    slurm_cluster.write(work / "profiles" / "xrd-export.yaml", yaml.safe_dump({
        "name": "xrd-export", "extends": "local-test",
        "xrootd": {"xrdcp": slow, "retries": 3, "connection_retry": 2, "connection_window": "1s",
                   "request_timeout": "20s"},
        "exports": {"streams": 2, "backoff": "2s", "max_backoff": "8s"}}))
    export = f"{xrootd_origin.origin.url}//store/reco{sfx}"
    spec = {"name": f"e2e-export{sfx}", "site": {"profile": "xrd-export"}, "walltime": "00:05:00",
            "inputs": {"list_file": "inputs-export.txt"},
            "jobs": {"files_per_job": 1, "chains_per_node": 1, **late},
            "chain": {"command": ["/bin/cp", "{input}", "{output}"]},
            "outputs": {"location": str(out), "pattern": "{stem}.out", "export": export}}
    slurm_cluster.write(work / "export.yaml", yaml.safe_dump(spec, sort_keys=False))
    env = {"HPCRUN_PROFILE_PATH": str(work / "profiles"), "COLUMNS": "200"}

    def hp(*args, timeout=300):
        return slurm_cluster.run_as_user([hpcrun_bin, *args], cwd=str(work), env=env, timeout=timeout)

    planned = hp("plan", "export.yaml", "--out", f"plan-export{sfx}")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan = work / f"plan-export{sfx}"
    corrupt = bytes(b ^ 0xFF for b in data["run001"])
    xrootd_origin.put(f"store/raw{sfx}/run001.raw", corrupt)   # corrupted after planning

    events: list = []
    stop = threading.Event()
    sent = xrootd_origin.data / "store" / f"reco{sfx}"
    killer = threading.Thread(target=crash_when, args=(lambda: _export_in_flight(sent), xrootd_origin.origin, events,
                                                       stop, 0.02), daemon=True)
    killer.start()
    started = time.monotonic()
    run = hp("run", f"plan-export{sfx}", "--interval", "2", timeout=900)
    wall = time.monotonic() - started
    stop.set()
    killer.join(timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [e for e, _ in events] == ["killed", "restarted"], events

    # the origin's own files: every good input's output, byte-identical; nothing of the corrupted one
    good = sorted(n for n in data if n != "run001")
    assert sorted(p.name for p in sent.iterdir()) == [f"{n}.out" for n in good]
    for n in good:
        assert (sent / f"{n}.out").read_bytes() == data[n], n

    status = json.loads(hp("status", f"plan-export{sfx}", "--json").stdout)
    assert status["inputs"]["done"] == len(good) and status["inputs"]["exporting"] == 0, status["inputs"]
    assert status["inputs"]["parked"] == 1
    report = json.loads(hp("report", f"plan-export{sfx}", "--json", "--no-plots").stdout)
    e = report["exports"]
    assert e["files"] == {"pending": 0, "verified": len(good), "failed": 0} and e["bytes"] == len(good) * SIZE
    assert e["mb_per_s"] > 0 and e["backlog"] == 0
    print(f"\nexports: {e['files']['verified']} verified, {e['bytes']} bytes, {e['mb_per_s']:.2f} MB/s, "
          f"failed attempts {e['failed_attempts']} (origin SIGKILLed and restarted during an export), "
          f"campaign wall {wall:.0f} s; attempts by class {report['attempts_by_class']}")
    metrics = (plan / "metrics.prom").read_text()
    assert f'hpcrun_export_files{{campaign="e2e-export{sfx}",state="verified"}} {len(good)}' in metrics
