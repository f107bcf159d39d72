"""A job spanning several nodes on the test cluster: one database server per node, N chains per node,
each chain on its own slice of the events (issue 14). Needs a cluster of 2 or more emulated nodes
(tests/run-all.sh starts 3)."""

from __future__ import annotations

import collections
import json
import re

import pytest

from .campaigns import Campaign
from .test_campaign_state import make_raw

pytestmark = pytest.mark.cluster

SLICE = re.compile(r"chain (\d+): (\d+) events (\d+)\.\.(-?\d+) of (\d+)")


def test_a_two_node_job_runs_one_db_per_node_and_its_chains_on_their_own_slices(slurm_cluster, hpcrun_bin,
                                                                                  example_root):
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the test cluster has one node; start it with `harness.py start --nodes 3`")
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", 1, events=400)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "nodes2", burst_buffer=None, inputs__glob=glob,
                 jobs={"files_per_job": 1, "chains_per_node": 3, "nodes": 2})
    [batch] = c.plan_and_submit()
    [row] = c.status(timeout=240)
    assert row["status"] == "done", row
    run = c.rundir(row)
    nodes = slurm_cluster.sacct(row["slurm_id"], fields="NodeList")[0]["NodeList"]
    assert nodes.startswith("nid") and "[" in nodes, nodes          # e.g. nid[00001-00002]: two nodes

    # one database server per node: each node's helper wrote its own files and stopped cleanly
    db_nodes = sorted(p.name.split(".")[0] for p in (run / "db").glob("*.stopped"))
    assert len(db_nodes) == 2 and len(set(db_nodes)) == 2, sorted(p.name for p in (run / "db").iterdir())
    assert all((run / "db" / f"{n}.stopped").read_text().strip() == "0" for n in db_nodes)

    # 6 chains, 3 on each node, each on its own slice; together every event exactly once
    per_node = collections.Counter()
    slices = []
    for rank in range(6):
        start = (run / "chains" / f"{rank}.timeline").read_text().splitlines()[0].split()
        assert start[0] == "start"
        per_node[start[2]] += 1
        m = SLICE.search((run / "chains" / f"{rank}.log").read_text())
        assert m and int(m.group(1)) == rank, (run / "chains" / f"{rank}.log").read_text()
        slices.append((int(m.group(3)), int(m.group(2)), int(m.group(5))))
    assert sorted(per_node) == db_nodes and set(per_node.values()) == {3}, per_node
    slices.sort()
    total = slices[0][2]
    covered = [e for first, n, _t in slices for e in range(first, first + n)]
    assert covered == list(range(total)) and total == 400
    qa = (run / "qa.tsv").read_text().split("\t")
    assert qa[1] == qa[2] == "400" and qa[3] == "pass", qa
    manifest = json.loads((c.plan / "manifest.json").read_text())
    assert manifest["nodes_per_job"] == 2 and batch["job_id"]
