"""ALICE-style inputs on the test cluster (issue 29): every AOD is called AliAOD.root in its own
run/chunk directory. A list and a glob of them plan with ``inputs.stem: path`` and run, one input per
job and several per job, with outputs named by the part of the path that differs; URL inputs with
the same file name share a job too (the job stages each under its stem). A collision that remains is
refused with the setting that would solve it.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

pytestmark = pytest.mark.cluster

CHUNKS = [("000296414", "001"), ("000296414", "002"), ("000296415", "001"), ("000296415", "002"),
          ("000296416", "001"), ("000296416", "002")]


def _aods(root, tag):
    data = {}
    for run, chunk in CHUNKS:
        d = root / "alice" / "2018" / "LHC18q" / run / "pass1" / "AOD" / chunk
        d.mkdir(parents=True)
        content = os.urandom(50_000)
        (d / "AliAOD.root").write_bytes(content)
        data[f"{run}_pass1_AOD_{chunk}_AliAOD"] = content
    return data


def _campaign(cluster, hp, work, name, inputs, files_per_job, stem="path"):
    out = cluster.pfs / f"out-{name}"
    out.mkdir()
    cluster.chown(out)
    spec = {"name": name, "site": {"profile": "local-test"}, "walltime": "00:05:00",
            "inputs": {**inputs, "stem": stem}, "jobs": {"files_per_job": files_per_job, "chains_per_node": 1},
            "chain": {"command": ["/bin/cp", "{input}", "{output}"]},
            "outputs": {"location": str(out), "pattern": "{stem}.out"}}
    cluster.write(work / f"{name}.yaml", yaml.safe_dump(spec, sort_keys=False))
    return hp("plan", f"{name}.yaml", "--out", f"plan-{name}"), out


@pytest.mark.parametrize("files_per_job", [1, 3])
def test_aods_of_one_name_plan_and_run_with_stems_from_the_path(slurm_cluster, hpcrun_bin, files_per_job):
    work = slurm_cluster.workdir
    pfs = slurm_cluster.pfs
    data = _aods(pfs, "a")
    slurm_cluster.chown(pfs / "alice")
    files = sorted(str(p) for p in (pfs / "alice").rglob("AliAOD.root"))
    slurm_cluster.write(work / "aods.txt", "".join(f"{f}\n" for f in files))

    def hp(*args, timeout=600):
        return slurm_cluster.run_as_user([hpcrun_bin, *args], cwd=str(work), env={"COLUMNS": "200"},
                                         timeout=timeout)

    refused, _ = _campaign(slurm_cluster, hp, work, "named", {"list_file": "aods.txt"}, files_per_job, stem="name")
    assert refused.returncode == 2 and "set inputs.stem: path" in refused.stderr, refused.stderr
    assert "'000296414_pass1_AOD_001_AliAOD', '000296414_pass1_AOD_002_AliAOD'" in refused.stderr
    for name, inputs in (("listed", {"list_file": "aods.txt"}),
                         ("globbed", {"glob": str(pfs / "alice/2018/LHC18q/*/pass1/AOD/*/AliAOD.root")})):
        planned, out = _campaign(slurm_cluster, hp, work, f"{name}{files_per_job}", inputs, files_per_job)
        assert planned.returncode == 0, planned.stdout + planned.stderr
        run = hp("run", f"plan-{name}{files_per_job}", "--interval", "2")
        assert run.returncode == 0, run.stdout + run.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == \
            {f"{stem}.out": d for stem, d in data.items()}
        st = json.loads(hp("status", f"plan-{name}{files_per_job}", "--json").stdout)
        assert st["inputs"]["done"] == len(CHUNKS), st["inputs"]


def test_url_aods_of_one_name_share_a_job(slurm_cluster, hpcrun_bin, xrootd_origin):
    """Staged by the job under their stems, three AliAOD.root of one job do not overwrite each other."""
    work = slurm_cluster.workdir
    data = {}
    urls = []
    for run, chunk in CHUNKS:
        content = os.urandom(40_000)
        urls.append(xrootd_origin.put(f"alice/2018/LHC18q/{run}/pass1/AOD/{chunk}/AliAOD.root", content))
        data[f"{run}_pass1_AOD_{chunk}_AliAOD"] = content
    slurm_cluster.write(work / "aod-urls.txt", "".join(f"{u}\n" for u in urls))

    def hp(*args, timeout=600):
        return slurm_cluster.run_as_user([hpcrun_bin, *args], cwd=str(work), env={"COLUMNS": "200"},
                                         timeout=timeout)

    planned, out = _campaign(slurm_cluster, hp, work, "urls", {"list_file": "aod-urls.txt"}, 3)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    run = hp("run", "plan-urls", "--interval", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == \
        {f"{stem}.out": d for stem, d in data.items()}
