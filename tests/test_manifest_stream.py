"""The manifest written in a stream is the manifest: the same text as the whole dict encoded at
once, each job line what json.dumps gives, on examples and on hostile values."""

import json
from pathlib import Path

import pytest

from hpcrun.plan.inputs import InputItem
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
