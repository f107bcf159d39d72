"""root:// inputs read straight from the filesystem behind the server (issue 39), on the test cluster
with Debian's real XRootD server on loopback.

The server exports a directory that the (emulated) nodes also see under another path; the site
profile maps the URL prefix to that path (xrootd.local_paths). Redirected inputs are read in place:
the server's own log (it traces every open) shows no read of them. A local copy that is not what the
server reported at plan time (here: a stale replica with other bytes of the same size) falls back to
the server, which the job's checksum then verifies; an unmapped URL goes through the server. The
outputs are byte for byte those of the same campaign run without the mapping.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from hpcrun.operate.outputs import folding
from tests.xrootd import Servers, why_not

from .campaigns import queue_results, run_files

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(bool(why_not()), reason=why_not() or "ok")]

SIZE = 1_500_000


@pytest.fixture
def servers():
    s = Servers().start()
    yield s
    s.stop()


LATE = {"binding": "late", "pilot": {"walltime": "00:10:00", "slots": 2, "nodes": 2}}


def _campaign(cluster, hpcrun_bin, name: str, urls: list, xrootd: dict, jobs: dict | None = None) -> tuple:
    work = cluster.workdir / name
    work.mkdir()
    cluster.chown(work)
    out = cluster.pfs / f"out-{name}"
    out.mkdir()
    cluster.chown(out)
    cluster.write(work / "profiles" / "xrd-local.yaml", yaml.safe_dump({
        "name": "xrd-local", "extends": "local-test", "xrootd": {"retries": 1, **xrootd}}))
    cluster.write(work / "campaign.yaml", yaml.safe_dump({
        "name": f"xrd-{name}", "site": {"profile": "xrd-local"}, "walltime": "00:05:00",
        "inputs": {"files": urls}, "jobs": {"files_per_job": 4, "chains_per_node": 1, **(jobs or {})},
        "chain": {"command": ["/bin/cp", "{input}", "{output}"]},
        "outputs": {"location": str(out), "pattern": "{stem}.out"}}, sort_keys=False))
    env = {"HPCRUN_PROFILE_PATH": str(work / "profiles"), "COLUMNS": "200"}

    def hp(*args, timeout=600):
        return cluster.run_as_user([hpcrun_bin, *args], cwd=str(work), env=env, timeout=timeout)

    planned = hp("plan", "campaign.yaml", "--out", "plan")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    return work / "plan", out, hp, planned


def _logs(plan: Path) -> str:
    """The jobs' own logs: an array task's in logs/ (folded with its run once it succeeded), a pilot's claims' in
    run/pilots/<pilot>/claims/."""
    folded = "".join(data.decode() for _, data in folding.matching(str(plan / "run"), f"*/*/{folding.SCHEDULER_LOG}"))
    return folded + "".join(p.read_text() for p in [*plan.glob("logs/*.out"), *plan.glob("run/pilots/*/claims/*.log")])


@pytest.mark.parametrize("binding", ["array", "late"])
def test_inputs_under_a_mapped_prefix_are_read_where_the_nodes_mount_them(slurm_cluster, hpcrun_bin, servers,
                                                                         binding):
    data = {f"loc/f{n}": os.urandom(SIZE + n) for n in range(6)}
    data["stale/s0"] = os.urandom(SIZE)
    data["other/u0"] = os.urandom(SIZE)
    urls = {k: servers.put(f"store/{k}.raw", d) for k, d in data.items()}
    view = slurm_cluster.pfs / "se-view"            # the nodes' view of the export: another path, same files
    view.symlink_to(servers.data / "store")
    stale = slurm_cluster.pfs / "stale-replica"     # a replica that fell behind: same size, other bytes
    stale.mkdir()
    (stale / "s0.raw").write_bytes(os.urandom(SIZE))
    slurm_cluster.chown(stale)
    origin = servers.origin.url
    mapping = {f"{origin}//store/loc/": f"{view}/loc/", f"{origin}//store/stale/": f"{stale}/"}

    plan, out, hp, planned = _campaign(slurm_cluster, hpcrun_bin, f"mapped-{binding}", list(urls.values()),
                                       {"local_paths": mapping, "parallel_copies": 4},
                                       LATE if binding == "late" else {})
    assert "7 of 8 input(s) are under a local path of the nodes" in planned.stdout, planned.stdout
    before = len(servers.opened())
    run = hp("run", "plan", "--interval", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    opened = sorted(servers.opened()[before:])
    logs = _logs(plan)
    assert opened == ["/store/other/u0.raw", "/store/stale/s0.raw"], (opened, logs[-2000:])   # none of the six
    rows = [line.split("\t") for text in run_files(plan, "*/*/transfers.tsv") for line in text.splitlines()]
    ways = {Path(r[0]).stem: r[6] for r in rows if r[4] == "0"}
    assert ways == {**{f"f{n}": "local" for n in range(6)}, "s0": "server", "u0": "server"}, ways
    assert "stale-replica/s0.raw is adler32:" in logs and "comes from its server" in logs
    if binding == "late":   # the pilots' claims read in place the same way: the same bytes, a pilot per output
        for key, d in data.items():
            assert (out / f"{Path(key).name}.out").read_bytes() == d
        done = queue_results(plan)
        assert sorted(r[8] for r in done) == ["COMPLETED"] * 2, done   # two jobs of 4 inputs, each claimed once
        return

    # the same campaign without the mapping: every input through the server, the same outputs
    plain, plain_out, hp2, _ = _campaign(slurm_cluster, hpcrun_bin, "plain", list(urls.values()), {})
    before = len(servers.opened())
    assert hp2("run", "plan", "--interval", "2").returncode == 0
    assert len(servers.opened()) - before == len(data)
    for key, d in data.items():
        name = Path(key).name
        assert (out / f"{name}.out").read_bytes() == d == (plain_out / f"{name}.out").read_bytes()
    report = json.loads(hp("report", "plan", "--json", "--no-plots").stdout)
    by_path = report["transfers"]["by_path"]
    assert by_path["local"]["inputs"] == 6 and by_path["server"]["inputs"] == 2, by_path
    assert report["transfers"]["mb_per_s_per_core"] > 0
