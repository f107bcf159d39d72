"""Node caches and locality on the test cluster (3 nodes, each with its own cache directory): the
same URL inputs read by two campaigns in a row. The second pass lists them in another order (a
later train does not read its datasets in the first one's order); with ``jobs.locality: prefer``
its jobs ask for the node whose cache holds their input and read it from there. A drained node's
jobs wait ``jobs.locality_wait`` for it, then go to any node.

benchmarks/locality.py runs the first two tests at 200 inputs (HPCRUN_LOCALITY_FILES) and prints
their figures.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from tests.xrootd import Servers, why_not

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(bool(why_not()), reason=why_not() or "ok")]

FILES = int(os.environ.get("HPCRUN_LOCALITY_FILES", "24"))
SIZE = int(os.environ.get("HPCRUN_LOCALITY_SIZE", "500000"))




class Passes:
    """Campaigns over the same inputs with one profile whose nodes keep a cache each."""

    def __init__(self, cluster, hpcrun_bin, origin: Servers, tag: str):
        self.cluster, self.bin, self.tag = cluster, hpcrun_bin, tag
        self.work = cluster.workdir
        self.data = {f"{tag}{n:04d}": os.urandom(SIZE) for n in range(FILES)}
        self.urls = [origin.put(f"store/{tag}/{name}.raw", d) for name, d in self.data.items()]
        caches = self.work / "caches"
        caches.mkdir(mode=0o1777)
        caches.chmod(0o1777)
        self.index = self.work / "index"
        cluster.write(self.work / "profiles" / "cached.yaml", yaml.safe_dump({
            "name": "cached", "extends": "local-test",
            "xrootd": {"node_cache": {"path": str(caches / "{node}"), "max_size": "10GB", "index": str(self.index)}}}))
        self.env = {"HPCRUN_PROFILE_PATH": str(self.work / "profiles"), "COLUMNS": "200"}

    def hp(self, *args, timeout=900):
        return self.cluster.run_as_user([self.bin, *args], cwd=str(self.work), env=self.env, timeout=timeout)

    def campaign(self, name: str, locality: str, order, wait: str = "10m", binding: str = "array"):
        out = self.cluster.pfs / f"out-{name}"
        out.mkdir()
        self.cluster.chown(out)
        self.cluster.write(self.work / f"{name}.txt", "".join(f"{u} {SIZE} 10\n" for u in order))
        spec = {"name": f"{self.tag}-{name}", "site": {"profile": "cached"}, "walltime": "00:05:00",
                "inputs": {"list_file": f"{name}.txt"},
                "jobs": {"files_per_job": 1, "chains_per_node": 1, "locality": locality, "locality_wait": wait,
                         **({"binding": "late", "pilot": {"walltime": "00:15:00"}} if binding == "late" else {})},
                # a second per job: the jobs of a pass run side by side on every node (fast jobs
                # would all go to the first node Slurm frees, and nothing would tell the passes apart)
                "chain": {"command": ["/bin/sh", "-c", 'sleep 1; exec cp "$1" "$2"', "chain", "{input}", "{output}"]},
                "outputs": {"location": str(out), "pattern": "{stem}.out"}}
        self.cluster.write(self.work / f"{name}.yaml", yaml.safe_dump(spec, sort_keys=False))
        planned = self.hp("plan", f"{name}.yaml", "--out", f"plan-{name}")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        started = time.monotonic()
        run = self.hp("run", f"plan-{name}", "--interval", "2")
        wall = time.monotonic() - started
        assert run.returncode == 0, run.stdout + run.stderr
        report = json.loads(self.hp("report", f"plan-{name}", "--json", "--no-plots").stdout)
        assert report["succeeded"] == FILES, report
        for stem, d in self.data.items():
            assert (out / f"{stem}.out").read_bytes() == d
        return report, wall, planned.stdout


def _two_passes(slurm_cluster, hpcrun_bin, origin, locality: str, tag: str, binding: str = "array"):
    p = Passes(slurm_cluster, hpcrun_bin, origin, tag)
    first, wall1, _ = p.campaign("first", "any", p.urls)
    second, wall2, plan_out = p.campaign("second", locality, list(reversed(p.urls)), binding=binding)
    c1, c2 = first["node_cache"], second["node_cache"]
    print(f"\nlocality {locality} ({binding} binding), {FILES} inputs of {SIZE} bytes on 3 nodes: first pass hit ratio "
          f"{c1['hit_ratio']:.2f}, {c1['bytes_from_origin']} bytes from the origin, wall {wall1:.0f} s; second "
          f"pass hit ratio {c2['hit_ratio']:.2f}, {c2['bytes_from_origin']} bytes from the origin "
          f"({c2['bytes_from_origin'] / max(1, c1['bytes_from_origin']):.0%} of the first), wall {wall2:.0f} s")
    assert c1["hits"] == 0 and c1["bytes_from_origin"] == FILES * SIZE
    held = {}
    for f in p.index.iterdir():
        for line in f.read_text().splitlines():
            held[line.split("\t")[0]] = f.stem
    assert sorted(held) == sorted(p.urls) and len(set(held.values())) >= 2, set(held.values())
    return c1, c2, plan_out


def test_the_second_pass_reads_from_the_node_caches_with_locality_prefer(slurm_cluster, hpcrun_bin, xrootd_origin):
    c1, c2, plan_out = _two_passes(slurm_cluster, hpcrun_bin, xrootd_origin, "prefer", "lp")
    assert f"locality: {FILES} of {FILES} inputs are in the caches of" in plan_out, plan_out
    assert c2["hit_ratio"] >= 0.8 and c2["bytes_from_origin"] <= 0.2 * c1["bytes_from_origin"], c2


def test_late_bound_pilots_claim_the_second_pass_from_their_node_caches_first(slurm_cluster, hpcrun_bin, xrootd_origin):
    """The late-binding twin: no placement at submission; each pilot (a whole node) claims the waiting inputs
    its node's cache holds first, and leaves those of another node's cache to that node's pilot."""
    c1, c2, plan_out = _two_passes(slurm_cluster, hpcrun_bin, xrootd_origin, "prefer", "ll", binding="late")
    assert f"locality: {FILES} of {FILES} inputs are in the caches of" in plan_out, plan_out
    assert c2["hit_ratio"] >= 0.9 and c2["bytes_from_origin"] <= 0.1 * c1["bytes_from_origin"], c2


def test_without_locality_the_second_pass_hits_by_chance(slurm_cluster, hpcrun_bin, xrootd_origin):
    _c1, c2, _ = _two_passes(slurm_cluster, hpcrun_bin, xrootd_origin, "any", "la")
    assert c2["hits"] + c2["misses"] == FILES and c2["hit_ratio"] < 0.8, c2


def test_a_job_whose_node_is_drained_goes_to_any_node_after_locality_wait(slurm_cluster, hpcrun_bin, xrootd_origin):
    p = Passes(slurm_cluster, hpcrun_bin, xrootd_origin, "ld")
    first, _, _ = p.campaign("first", "any", p.urls)
    holders = {}
    for f in p.index.iterdir():
        for line in f.read_text().splitlines():
            holders.setdefault(f.stem, []).append(line.split("\t")[0])
    drained = max(holders, key=lambda n: len(holders[n]))
    slurm_cluster.run(["scontrol", "update", f"nodename={drained}", "state=drain", "reason=hpcrun-locality-test"])
    try:
        second, wall, _ = p.campaign("second", "prefer", p.urls, wait="15s")
    finally:
        slurm_cluster.run(["scontrol", "update", f"nodename={drained}", "state=resume"])
    moved = second["attempts_by_class"].get("moved", 0)
    assert moved == len(holders[drained]), (second["attempts_by_class"], len(holders[drained]))
    c = second["node_cache"]
    assert c["misses"] >= len(holders[drained]) and c["hits"] >= FILES - len(holders[drained]) - 2, c
    log = p.hp("log", "plan-second").stdout
    assert "released from its node after" in log, log
