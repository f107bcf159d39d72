"""The manifest written in a stream is the manifest: the same text as the whole dict encoded at
once, each job line what json.dumps gives, on examples and on hostile values."""

import json
from pathlib import Path

import pytest

from hpcrun.plan.intake.inputs import InputItem
from hpcrun.plan.load import load_plan
from hpcrun.plan.values import Job
from hpcrun.render import manifest as mf
from hpcrun.render.plandir import write_plan

from .conftest import REPO

HOSTILE = ["/d/plain.daq", '/d/quote"back\\slash.daq', "/d/tab\tnew\nline.daq", "/d/ünïcødé-€-😀.daq",
           "/d/}, {\"index\": 9}.daq", "/d/\x00\x1f\x7f.daq"]


def test_job_lines_are_json_dumps_of_the_entries():
    for k, path in enumerate(HOSTILE):
        items = (InputItem(path, 10**15 + k, None if k % 2 else 2000, f"s{k}"),
                 InputItem(path + ".2", 0, 7, "t"))
        for checksums, capacity in (((), None), (("adler32:0a1b2c3d", None), 2**40)):
            job = Job(k, f"camp.{k:05d}\u2028", items, (path + ".out", "o2"), 3, None, capacity, checksums)
            line = mf.job_line(job)
            assert line == json.dumps(mf.job_entry(job))
            assert json.loads(line)["inputs"][0] == path
            one = Job(k, f"c.{k}", items[k % 2:k % 2 + 1], (path + ".out",), 1, 5, capacity, checksums[:1])
            assert mf.job_line(one) == json.dumps(mf.job_entry(one))


@pytest.mark.parametrize("example", ["star-cori", "star-generic-apptainer", "two-clusters-local"])
def test_streamed_manifest_is_the_whole_one(example, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(mf, "JOBS_PER_WRITE", 2)   # several chunks even for a small example
    plan = load_plan(Path("examples") / example / "campaign.yaml")
    written = write_plan(plan, tmp_path / "plan")
    text = (tmp_path / "plan" / "manifest.json").read_text()
    data = json.loads(text)
    assert len(data["jobs"]) == len(plan.jobs) >= 1
    digests = {s["path"]: s["sha256"] for s in data["scripts"]}
    if data.get("finalize"):
        digests[data["finalize"]["path"]] = data["finalize"]["sha256"]
    for cluster in data.get("clusters") or []:
        digests.update({s["path"]: s["sha256"] for s in cluster["scripts"]})
    assert text == mf.manifest_json(mf.manifest(plan, str(tmp_path / "plan"), digests))
    assert json.loads(json.dumps(written.manifest)) == {k: v for k, v in data.items() if k != "jobs"}


def test_task_rows_one_format_for_one_and_several_inputs():
    """tasks.tsv: the one-input fast path writes what the general loop writes."""
    from types import SimpleNamespace

    from hpcrun.render.scripts import tasks_chunks

    def reference(job):
        sums = job.checksums or (None,) * len(job.inputs)
        return "".join(f"{job.index}\t{job.name}\t{job.chains_per_node}\t{i.path}\t"
                       f"{'-' if i.events is None else i.events}\t{i.stem}\t{o}\t{c or '-'}\t{i.size}\n"
                       for i, o, c in zip(job.inputs, job.outputs, sums))

    jobs = []
    for k, path in enumerate(HOSTILE[:4]):
        item = InputItem(path, k, None if k % 2 else 7, f"s{k}")
        jobs.append(Job(k, f"c.{k}", (item,), (f"o{k}",), 2, None, None, ("adler32:00000001",) if k % 2 else ()))
    jobs.append(Job(4, "c.4", (InputItem("/a", 1, 3, "a"), InputItem("/b", 2, None, "b")), ("oa", "ob"), 1))
    text = "".join(tasks_chunks(SimpleNamespace(jobs=jobs), per_chunk=2))
    assert text == "".join(reference(j) for j in jobs)


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_the_head_is_read_without_the_jobs(tmp_path, monkeypatch, block):
    """A poll reads the manifest only up to its job list, whatever block boundary the list's key
    straddles, and gets every other key exactly."""
    from hpcrun.operate import manifest as plandir

    monkeypatch.chdir(REPO)
    write_plan(load_plan(Path("examples") / "star-cori" / "campaign.yaml"), tmp_path / "plan")
    whole = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    monkeypatch.setattr(plandir, "_HEAD_BLOCK", block)
    reads = []
    real_fdopen = plandir.os.fdopen
    monkeypatch.setattr(plandir.os, "fdopen", lambda *a, **k: reads.append(a[0]) or real_fdopen(*a, **k))
    head = plandir.read_json(tmp_path / "plan")
    monkeypatch.undo()
    assert head == {k: v for k, v in whole.items() if k != "jobs"} and "jobs" in whole
    assert reads   # read through the block reader, not whole


def test_the_job_list_is_read_line_by_line_and_checked(tmp_path, monkeypatch):
    """Submit, retry and the supervisor go through the job list as it is read, a line at a time; a
    manifest in another layout (an older hpcrun's: a job over several lines) is parsed whole; a job line
    edited into nonsense, or a list cut short, is an error naming the file."""
    from hpcrun.errors import InputError
    from hpcrun.operate import manifest as plandir

    monkeypatch.chdir(REPO)
    write_plan(load_plan(Path("examples") / "star-cori" / "campaign.yaml"), tmp_path / "plan")
    path = tmp_path / "plan" / "manifest.json"
    whole = json.loads(path.read_text())
    jobs = plandir.read_json(tmp_path / "plan", jobs=True)["jobs"]
    assert isinstance(jobs, plandir.ManifestJobs)
    assert list(jobs) == whole["jobs"] and len(jobs) == len(whole["jobs"]) == 40
    assert jobs[0] == whole["jobs"][0] and jobs[-1] == whole["jobs"][-1] and jobs[2:4] == whole["jobs"][2:4]
    path.write_text(json.dumps(whole, indent=1))   # every job over several lines
    old = plandir.read_json(tmp_path / "plan", jobs=True)
    assert isinstance(old["jobs"], list) and old == whole
    write_plan(load_plan(Path("examples") / "star-cori" / "campaign.yaml"), tmp_path / "plan")
    lines = path.read_text().split("\n")
    at = lines.index(' "jobs": [') + 5
    for broken in (lines[:at] + ['  {"index": 4, "name": '] + lines[at + 1:], lines[:at] + lines[at + 1:]):
        path.write_text("\n".join(broken))
        with pytest.raises(InputError, match="manifest.json.*plan the campaign again"):
            list(plandir.read_json(tmp_path / "plan", jobs=True)["jobs"])
