"""Per-job scripts rendered at submission (jobs.script_files): the same bytes as the files a small
plan writes, handed to sbatch on standard input, recorded in the store, printed by `plan show`."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcrun.api import job_script
from hpcrun.operate.manifest import read_json
from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.submission.headers import digest
from hpcrun.operate.submission.submit import submit
from hpcrun.plan.load import load_plan
from hpcrun.render import headers
from hpcrun.render.plandir import write_plan

from .conftest import REPO

STAR = REPO / "examples" / "star-cori"


def _star(tmp_path: Path, script_files: str, extra_lines=()) -> Path:
    """The STAR example (40 per-job scripts with #DW stage_in lines) with ``jobs.script_files``."""
    case = tmp_path / "star"
    if not case.exists():
        shutil.copytree(STAR, case)
    if extra_lines:
        with open(case / "raw-files.txt", "a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in extra_lines)
    data = yaml.safe_load((STAR / "campaign.yaml").read_text())
    data["jobs"]["script_files"] = script_files
    (case / "campaign.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return case / "campaign.yaml"


def _files(plan_dir: Path) -> dict:
    return {p.name: p.read_text() for p in sorted((plan_dir / "jobs").iterdir())}


def test_rendered_at_submission_is_byte_identical_to_the_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a name with a space, quotes and non-ASCII goes into each job's comment lines
    spec = _star(tmp_path, "always")
    plan_dir = tmp_path / "plan"
    write_plan(load_plan(spec), plan_dir)
    files = _files(plan_dir)
    assert len(files) == 40
    write_plan(load_plan(_star(tmp_path, "never")), plan_dir)
    assert sorted(_files(plan_dir)) == [headers.TABLE_NAME, headers.TEMPLATE_NAME]
    manifest = read_json(plan_dir)
    [entry] = manifest["scripts"]
    assert entry["jobs"] == [0, 39] and entry["headers"] == "jobs/headers.tsv" and entry["array"] is None
    for n in range(1, 41):
        assert job_script(plan_dir, str(n)) == files[f"job{n:05d}.sbatch"], n
    assert job_script(plan_dir, "star-reco-2019.00007") == job_script(plan_dir, "job00007") == files["job00007.sbatch"]
    # auto: files up to SCRIPT_FILES_MAX jobs
    write_plan(load_plan(_star(tmp_path, "auto")), plan_dir)
    assert _files(plan_dir) == files
    monkeypatch.setattr(headers, "SCRIPT_FILES_MAX", 39)
    write_plan(load_plan(_star(tmp_path, "auto")), plan_dir)
    assert len(_files(plan_dir)) == 2


def test_comment_lines_carry_hostile_paths_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    odd = ["/global/cscratch1/sd/starprod/raw/2019/ünïcødé_€_run.daq 3GB 1000",
           "/global/cscratch1/sd/starprod/raw/2019/HPCRUN_FILL_NAME.daq 3GB 1000"]
    plan_dir = tmp_path / "plan"
    write_plan(load_plan(_star(tmp_path, "always", odd)), plan_dir)
    files = _files(plan_dir)
    write_plan(load_plan(_star(tmp_path, "never")), plan_dir)
    total = read_json(plan_dir)["totals"]["jobs"]
    assert total == len(files) == 42
    texts = [job_script(plan_dir, str(n)) for n in range(1, total + 1)]
    assert texts == [files[f"job{n:05d}.sbatch"] for n in range(1, total + 1)]
    assert any("HPCRUN_FILL_NAME.daq" in t for t in texts)   # a marker inside a value is not filled


def test_submit_hands_the_text_on_stdin_and_records_it(tmp_path, monkeypatch, fake_slurm):
    monkeypatch.chdir(tmp_path)
    plan_dir = tmp_path / "plan"
    write_plan(load_plan(_star(tmp_path, "never")), plan_dir)
    report = submit(plan_dir, limit=5)
    assert [b.job_id for b in report.batches] == ["100", "101", "102", "103", "104"]
    assert all(not a.endswith((".header", ".sbatch", ".tsv")) for a in fake_slurm.args())   # no script argument
    with sqlite3.connect(plan_dir / "state.db") as db:
        recorded = {job_id: (path, sha) for job_id, path, sha in
                    db.execute("SELECT job_id, script_path, script_digest FROM hpcrun_submission")}
    with open_plan_store(plan_dir) as store:
        for k, job_id in enumerate(["100", "101", "102", "103", "104"]):
            sent = (fake_slurm.bin / f"stdin-{job_id}").read_text()
            assert sent == job_script(plan_dir, str(k + 1))
            assert recorded[job_id] == (f"jobs/headers.tsv#{k}", digest(sent))
            assert store.script_text(digest(sent)) == sent


def test_cli_plan_show(tmp_path):
    spec = _star(tmp_path, "never")
    run = [sys.executable, "-m", "hpcrun.cli", "plan"]
    plan = subprocess.run(run + [str(spec), "--out", str(tmp_path / "plan")], capture_output=True, text=True,
                          cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    shown = subprocess.run(run + ["show", str(tmp_path / "plan"), "3"], capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout == job_script(tmp_path / "plan", "3")
    assert "#DW stage_in" in shown.stdout and "--job-name=star-reco-2019.00003" in shown.stdout
    bad = subprocess.run(run + ["show", str(tmp_path / "plan"), "41"], capture_output=True, text=True)
    assert bad.returncode == 2 and "1 to 40" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("lines", [
    ["#!/bin/bash", "x HPCRUN_FILL_COMMENTS y", "a HPCRUN_FILL_NAME b HPCRUN_FILL_INDEX c HPCRUN_FILL_NUMBER",
     "HPCRUN_FILL_BB", "end"],
    ["HPCRUN_FILL_BB", "HPCRUN_FILL_COMMENTS"],
])
def test_template_fill(lines):
    template = headers.HeaderTemplate.parse("\n".join(lines) + "\n")
    text = template.fill(4, "c.00005", ["one", "two"], [])
    assert "HPCRUN_FILL" not in text
    if len(lines) > 2:
        assert text == "#!/bin/bash\nx one y\nx two y\na c.00005 b 4 c 5\nend\n"
    else:
        assert text == "one\ntwo\n"


def test_a_template_the_markers_cannot_carry_gets_a_file_per_job(tmp_path, monkeypatch):
    """When filling the template does not give what rendering gives (a site template laying a job out
    otherwise), every job gets its file: the plan never submits a script it did not check."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(headers.HeaderTemplate, "fill", lambda self, *a: "#!/bin/bash\n# not the job\n")
    plan_dir = tmp_path / "plan"
    write_plan(load_plan(_star(tmp_path, "never")), plan_dir)
    files = _files(plan_dir)
    assert len(files) == 40 and headers.TABLE_NAME not in files
    assert all(s.get("headers") is None for s in read_json(plan_dir)["scripts"])


def _arrays(tmp_path: Path, n: int, script_files: str) -> Path:
    """A campaign of ``n`` one-input jobs in arrays of at most 1001 (the local-test profile)."""
    lst = tmp_path / "inputs.list"
    lst.write_text("".join(f"/data/raw/f{i:05d}.raw 1GB 20\n" for i in range(n)))
    spec = tmp_path / "arrays.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "arrays", "site": {"profile": "local-test"}, "walltime": "10m",
        "inputs": {"list_file": str(lst), "checksum": "none"},
        "jobs": {"files_per_job": 1, "chains_per_node": 1, "array": "always", "throttle": 7,
                 "script_files": script_files},
        "chain": {"command": ["/bin/true", "{input}"]},
        "outputs": {"location": str(tmp_path / "out"), "pattern": "{stem}.out"}}))
    return spec


def test_array_scripts_rendered_at_submission_are_byte_identical(tmp_path, monkeypatch):
    """An array plan above 1000 jobs writes one template and a line per array; each array's script,
    asked for by any of its jobs, is the file a small plan writes."""
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(REPO / "site-profiles"))
    plan_dir = tmp_path / "plan"
    write_plan(load_plan(_arrays(tmp_path, 2500, "always")), plan_dir)
    files = _files(plan_dir)
    assert sorted(files) == ["array001.sbatch", "array002.sbatch", "array003.sbatch"]
    write_plan(load_plan(_arrays(tmp_path, 2500, "auto")), plan_dir)
    assert sorted(_files(plan_dir)) == sorted([headers.ARRAY_TABLE_NAME, headers.ARRAY_TEMPLATE_NAME])
    entries = read_json(plan_dir)["scripts"]
    assert [(e["name"], e["jobs"], e["array"], e["path"], e["headers"]) for e in entries] == [
        ("array001", [0, 1000], "0-1000%7", "jobs/array.header", "jobs/arrays.tsv"),
        ("array002", [1001, 2001], "0-1000%7", "jobs/array.header", "jobs/arrays.tsv"),
        ("array003", [2002, 2499], "0-497%7", "jobs/array.header", "jobs/arrays.tsv")]
    for entry in entries:
        lo, hi = entry["jobs"]
        for job in (lo, (lo + hi) // 2, hi):
            assert job_script(plan_dir, str(job + 1)) == files[entry["name"] + ".sbatch"], job
    # at or below 1000 jobs, files as before; `never`: the template whatever the size
    write_plan(load_plan(_arrays(tmp_path, 1000, "auto")), plan_dir)
    assert sorted(_files(plan_dir)) == ["array001.sbatch"]
    write_plan(load_plan(_arrays(tmp_path, 3, "never")), plan_dir)
    assert sorted(_files(plan_dir)) == sorted([headers.ARRAY_TABLE_NAME, headers.ARRAY_TEMPLATE_NAME])


def test_a_submission_fills_a_template_without_the_renderer(tmp_path, monkeypatch):
    """Filling a plan's script template at submission needs neither jinja2 nor the plan's models (pydantic): their
    import took 0.2-0.3 s of the first round of every campaign above 1000 jobs, before its jobs were queued."""
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(REPO / "site-profiles"))
    plan_dir = tmp_path / "plan"
    write_plan(load_plan(_arrays(tmp_path, 3, "never")), plan_dir)
    code = ("import sys; from pathlib import Path; from hpcrun.operate.submission.headers import HeaderBook; "
            f"text = HeaderBook(Path({str(plan_dir)!r}), 'jobs/array.header', 'jobs/arrays.tsv').text(0); "
            "print(text.startswith('#!/bin/bash'), [m for m in ('jinja2', 'pydantic') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "True []", out.stdout + out.stderr


def test_array_template_fill_leaves_values_alone():
    template = headers.HeaderTemplate.parse(
        "#A --array=HPCRUN_FILL_ARRAY\n# HPCRUN_FILL_NAME: jobs HPCRUN_FILL_NUMBER..HPCRUN_FILL_LAST\n"
        "x=$(( HPCRUN_FILL_INDEX + 1 ))\n#DW HPCRUN_FILL_BB\n")
    text = template.fill_array(1001, 2001, "HPCRUN_FILL_INDEX", "0-1000%7", ["jobdw a", "jobdw b"])
    assert text == ("#A --array=0-1000%7\n# HPCRUN_FILL_INDEX: jobs 1002..2002\nx=$(( 1001 + 1 ))\n"
                    "#DW jobdw a\n#DW jobdw b\n")


def test_submit_hands_an_array_its_text_and_records_it(tmp_path, monkeypatch, fake_slurm):
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(REPO / "site-profiles"))
    plan_dir = tmp_path / "plan"
    write_plan(load_plan(_arrays(tmp_path, 1500, "auto")), plan_dir)
    report = submit(plan_dir)
    assert [(b.job_id, b.array_spec) for b in report.batches] == [("100", "0-1000%7"), ("101", "0-498%7")]
    assert all(not a.endswith((".header", ".sbatch", ".tsv")) for a in fake_slurm.args())   # no script argument
    with sqlite3.connect(plan_dir / "state.db") as db:
        recorded = set(db.execute("SELECT job_id, script_path, script_digest FROM hpcrun_submission"))
        kept = db.execute("SELECT count(*) FROM hpcrun_script_text").fetchone()[0]
    sent = {job_id: (fake_slurm.bin / f"stdin-{job_id}").read_text() for job_id in ("100", "101")}
    assert sent["100"] == job_script(plan_dir, "1") and sent["101"] == job_script(plan_dir, "1500")
    assert "#SBATCH --array=0-498%7" in sent["101"] and "$(( 1001 + HPCRUN_ARRAY_INDEX ))" in sent["101"]
    assert recorded == {("100", "jobs/arrays.tsv#0", digest(sent["100"])),
                        ("101", "jobs/arrays.tsv#1001", digest(sent["101"]))}
    assert kept == 2
    with open_plan_store(plan_dir) as store:
        assert all(store.script_text(digest(t)) == t for t in sent.values())
