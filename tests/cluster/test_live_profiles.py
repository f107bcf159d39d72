"""`hpcrun profiles init` drafts a profile from the live test cluster that validates and plans the
example; `hpcrun profiles check --live` finds a partition's MaxTime lowered with scontrol (exit 1)
and nothing on the unchanged cluster (exit 0)."""

from __future__ import annotations

import pytest
import yaml

from .campaigns import EXAMPLE

pytestmark = pytest.mark.cluster


def test_a_drafted_profile_validates_plans_and_tracks_the_live_cluster(slurm_cluster, hpcrun_bin, example_root):
    work = slurm_cluster.workdir
    draft = work / "drafted.yaml"

    def hp(*args: str):
        return slurm_cluster.run_as_user([hpcrun_bin, *args], cwd=str(work), env={"COLUMNS": "200"})

    made = hp("profiles", "init", "--cluster", "hpcrun", "--name", "drafted", "--out", str(draft))
    assert made.returncode == 0, made.stdout + made.stderr
    text = draft.read_text()
    assert "cluster: hpcrun" in text and "slurm_partition: debug" in text and "nodes: 3" in text, text
    assert "cores_per_node: 8" in text and "memory_per_node: 16000MiB" in text and "name: wlm_pool" in text, text
    assert "TODO" in text and "max_array_size: 1001" in text
    again = hp("profiles", "init", "--cluster", "hpcrun", "--out", str(draft))
    assert again.returncode == 2 and "exists" in again.stderr + again.stdout     # never overwrites
    ok = hp("profiles", "validate", str(draft))
    assert ok.returncode == 0, ok.stdout + ok.stderr

    spec = yaml.safe_load((EXAMPLE / "campaign.yaml").read_text())
    spec["site"]["profile"] = str(draft)
    slurm_cluster.write(work / "campaign.yaml", yaml.safe_dump(spec, sort_keys=False))
    plan = hp("plan", str(work / "campaign.yaml"), "--out", str(work / "plan"))
    assert plan.returncode == 0, plan.stdout + plan.stderr

    same = hp("profiles", "check", str(draft), "--live")
    assert same.returncode == 0 and "matches cluster hpcrun" in same.stdout, same.stdout + same.stderr
    slurm_cluster.run(["scontrol", "update", "partitionname=debug", "maxtime=00:30:00"])
    try:
        changed = hp("profiles", "check", str(draft), "--live")
        shipped = hp("profiles", "check", "local-test", "--live")
    finally:
        slurm_cluster.run(["scontrol", "update", "partitionname=debug", "maxtime=UNLIMITED"])
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "partitions.debug.max_walltime" in changed.stdout and "MaxTime is 00:30:00" in changed.stdout
    assert shipped.returncode == 1 and "allows 01:00:00, the partition's MaxTime is 00:30:00" in shipped.stdout
    back = hp("profiles", "check", str(draft), "--live")
    assert back.returncode == 0, back.stdout
