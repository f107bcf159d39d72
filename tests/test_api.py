"""The Python API (`import hpcrun`): the same work as the CLI, as typed values with to_dict(),
rows(), to_pandas() and an escaped _repr_html_; against the fake Slurm commands (tests/fake_slurm.py).
The notebook in examples/ runs the same calls against the real test cluster (tests/test_notebook.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hpcrun

from .conftest import REPO


def test_import_hpcrun_stays_light():
    """`import hpcrun` must not pull in the planner, SQLAlchemy or matplotlib (the CLI's start-up)."""
    code = ("import sys, hpcrun; heavy = [m for m in ('hpcrun.api', 'sqlalchemy', 'matplotlib', 'pydantic') "
            "if m in sys.modules]; print(heavy); hpcrun.validate; print('hpcrun.api' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True"
    assert "make_plan" in dir(hpcrun) and hpcrun.Error is hpcrun.api.HpcrunError
    with pytest.raises(AttributeError):
        hpcrun.no_such_thing  # noqa: B018


def test_the_commands_that_operate_a_plan_start_without_the_specs_models():
    """`hpcrun run` decides retries from the manifest's frozen rules (hpcrun/model/failures.py): loading pydantic
    and building the spec's retry models cost ~0.1 s before its first sbatch (issue 55)."""
    code = ("import sys, hpcrun.cli, hpcrun.operate.supervision.supervise, hpcrun.operate.retries.retry; "
            "print([m for m in ('pydantic', 'hpcrun.model.retry', 'hpcrun.model.spec') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("attempts,cancelled", [(3, False), (1, True), (7, False)])
def test_the_default_rules_are_the_failure_classes_own(attempts, cancelled):
    """The rules a plan without a ``retry`` section is decided by (hpcrun/model/failures.py), and a spec's
    override on top of them (hpcrun/model/retry.py), against the table's own figures."""
    from hpcrun.model.failures import default_rules
    from hpcrun.model.retry import RetrySpec, effective_rules
    rules = default_rules(attempts, cancelled)
    assert rules["chain"] == {"retry": True, "max_attempts": 2, "more_walltime": None, "more_memory": None,
                              "exclude_node": False, "restage": False}
    assert rules["qa"]["retry"] is False and rules["time_limit"]["more_walltime"] == 1.5
    assert rules["out_of_memory"]["more_memory"] == 1.5 and rules["node_fail"]["exclude_node"] is True
    assert rules["checksum"]["restage"] is True and rules["allocation"]["max_attempts"] == 10
    assert rules["other"]["max_attempts"] == attempts and rules["cancelled"]["retry"] is cancelled
    assert rules["site_cancel"]["retry"] is True and len(rules) == 22
    over = effective_rules(RetrySpec(max_attempts=attempts, on={"chain": {"max_attempts": 9, "retry": False}}))
    assert over["chain"]["max_attempts"] == 9 and over["chain"]["retry"] is False
    assert {k: v for k, v in over.items() if k != "chain"} == {
        k: v for k, v in default_rules(attempts).items() if k != "chain"}


def test_validate_returns_problems_with_file_line_and_key(spec_factory):
    bad = spec_factory({"jobs": {"files_per_jobb": 2}})
    check = hpcrun.validate(bad)
    assert check.ok is False
    [p] = check.problems
    assert p["file"] == str(bad) and p["line"] and p["key"] == "jobs.files_per_jobb" and "files_per_job" in p["message"]
    good = hpcrun.validate(spec_factory())
    assert good.ok and good.jobs == 3 and good.inputs == 3 and good.problems == []


def test_plan_submit_status_retry_report(spec_factory, tmp_path, fake_slurm, store_backend):
    planned = hpcrun.make_plan(spec_factory(), tmp_path / "p")
    assert planned.to_dict()["totals"]["jobs"] == 3 and planned.plan_dir == str(tmp_path / "p")
    assert [r["job"] for r in planned.rows()] == ["test-campaign.00001", "test-campaign.00002", "test-campaign.00003"]
    with pytest.raises(hpcrun.Error) as exc:
        hpcrun.make_plan(spec_factory({"walltime": "99:00:00"}), tmp_path / "q")
    assert exc.value.exit_code == 2 and exc.value.problems[0].key == "walltime"

    sub = planned.submit()
    assert sub.summary()["plan_jobs"] == 3 and json.loads(json.dumps(sub.to_dict()))["submitted"]
    job_id = sub.rows()[0]["job_id"]
    fake_slurm.end(job_id, state="FAILED", exit_code="7:0")
    st = hpcrun.status(planned.plan_dir)
    statuses = sorted(r["status"] for r in st.rows())
    assert statuses == ["failed", "failed", "failed"] or "failed" in statuses, st.rows()
    frame = st.to_pandas()
    assert list(frame["job"]) == [r["job"] for r in st.rows()] and "status" in frame.columns
    again = hpcrun.retry(planned.plan_dir, dry_run=True)
    assert again.to_dict()["dry_run"] is True and again.summary()["requeued"] >= 1
    rep = hpcrun.open_plan(planned.plan_dir).report()
    assert rep.to_dict()["campaign"] == "test-campaign" and "success rate" in " ".join(rep.figures())
    html = rep._repr_html_()
    assert html.startswith("<div class='hpcrun'>") and "success rate" in html


def test_html_escapes_untrusted_text(spec_factory, tmp_path):
    check = hpcrun.validate(spec_factory(name="<script>alert(1).yaml"))   # the spec's own file name
    assert check.ok
    html = check._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;alert(1).yaml" in html


def test_to_pandas_without_pandas_says_what_to_install(spec_factory, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)   # import pandas now raises ImportError
    with pytest.raises(ImportError, match="pip install pandas"):
        hpcrun.validate(spec_factory()).to_pandas()


def test_iotune_results(tmp_path, cli):
    done = cli("iotune", "--local", "--transfer-size", "64k,256k", "--block-size", "1m", "--engine", "fio",
               "--target", str(tmp_path), "--out", str(tmp_path / "sweep"), "--json")
    if done.exit_code != 0 and "fio" in done.output and "not found" in done.output:
        pytest.skip("fio is not installed")
    assert done.exit_code == 0, done.output
    res = hpcrun.iotune_results(tmp_path / "sweep")
    assert len(res.rows()) == res.summary()["points"] >= 2 and res.summary()["recommendation"]
    with pytest.raises(hpcrun.Error, match="iotune collect"):
        hpcrun.iotune_results(tmp_path)
