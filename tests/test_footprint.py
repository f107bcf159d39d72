"""The campaign's footprint on the site's filesystems (issue 56): the forecast of files and bytes at the peak
and at the end per filesystem and part, `plan --json`'s key, and the profile quotas it is held against."""

import json
import shutil
from pathlib import Path

import pytest

from hpcrun.model.profiles import load_profile
from hpcrun.operate.manifest import Manifest, read_manifest
from hpcrun.plan import footprint as F
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.units import UnitError, format_count, parse_count

from .conftest import REPO

LATE = {"jobs": {"files_per_job": 1, "chains_per_node": 1, "binding": "late",
                 "pilot": {"walltime": "01:00:00", "slots": 2, "idle_release": "2s", "input_time": "5s"}},
        "inputs": {"checksum": "none"}, "container": {"runtime": "none"}, "merge": None}


WIDE = {"COLUMNS": "1000"}   # the table's rows unwrapped


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """The CLI's console takes its width when imported (COLUMNS then, 80 without it): the rows unwrapped."""
    from hpcrun import cli
    monkeypatch.setattr(cli.out, "width", 1000)


def _profile(tmp_path: Path, monkeypatch, quota: str = "", name: str = "quota", extra: str = "") -> Path:
    """A profile extending local-test whose filesystem 'work' holds tmp_path (the plan and the outputs)."""
    prof = tmp_path / "profiles"
    prof.mkdir(exist_ok=True)
    path = prof / f"{name}.yaml"
    path.write_text(f"name: {name}\nextends: local-test\nfilesystems:\n  work:\n    path: {tmp_path}\n"
                    f"    type: lustre\n{quota}{extra}")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    return path


def _parts(use) -> dict:
    return {p.part: p for p in use.parts}


def _entries(directory: Path) -> int:
    return sum(1 for _ in directory.rglob("*"))


def test_array_forecast(spec_factory, tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch)
    spec = spec_factory({"site": {"profile": "quota"}, "jobs": {"throttle": 2}}, inputs=5)
    plan = load_plan(spec)
    out = tmp_path / "p"
    written = write_plan(plan, out)
    fp = F.forecast(plan, str(out))
    assert fp.running == 2                      # the array's %2, not its 5 jobs
    [use] = fp.filesystems                      # the plan directory and the outputs: one filesystem
    assert (use.name, use.path, use.type) == ("work", str(tmp_path), "lustre")
    parts = _parts(use)
    assert list(parts) == ["outputs", "logs", "run records", "plan directory"]
    outputs = parts["outputs"]
    assert outputs.end_files == 5 + F.OUTPUT_DIRS and outputs.end_bytes == plan.output_bytes == 5010
    assert outputs.peak_files == outputs.end_files + 2 * F.WORK_DIR_ENTRIES
    assert (parts["logs"].peak_files, parts["logs"].end_files) == (2 * F.ARRAY_LOG_ENTRIES, 0)
    assert parts["logs"].end_bytes == 5 * F.LOG_BYTES_PER_INPUT
    records = parts["run records"]
    assert (records.peak_files, records.end_files) == (2 * F.RUN_DIR_ENTRIES + F.FOLDED_FILES, F.FOLDED_FILES)
    # what plan writes, counted from the plan, is what it wrote; the state store comes with the first submit
    assert parts["plan directory"].end_files == _entries(out) + F.STORE_FILES
    assert use.peak == (sum(p.peak_files for p in use.parts), sum(p.peak_bytes for p in use.parts))
    assert use.peak[0] > use.end[0] and use.peak[1] == use.end[1]
    # the manifest's head holds it, and operate reads it back typed
    m = read_manifest(out, jobs=False)
    assert m.footprint is not None and m.footprint["running"] == 2
    [entry] = m.footprint["filesystems"]
    assert entry["name"] == "work" and entry["end"] == {"files": use.end[0], "bytes": use.end[1]}
    assert [p["part"] for p in entry["parts"]] == list(parts) and entry["quota"] is None
    assert written.manifest["footprint"] == json.loads((out / "manifest.json").read_text())["footprint"]


def test_late_forecast(spec_factory, tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch)
    spec = spec_factory({"site": {"profile": "quota"}, **LATE}, inputs=5)
    plan = load_plan(spec)
    out = tmp_path / "p"
    write_plan(plan, out)
    assert plan.pilots is not None and plan.pilot_count == 1 and plan.pilots.slots == 2
    fp = F.forecast(plan, str(out))
    assert fp.running == 2                      # one pilot's two slots
    [use] = fp.filesystems
    parts = _parts(use)
    assert list(parts) == ["outputs", "logs", "run records", "queue", "plan directory"]
    assert parts["queue"].end_files == parts["queue"].peak_files == F.PER_PILOT_QUEUE_ENTRIES + F.QUEUE_DIRS
    assert parts["logs"].end_files == F.PILOT_LOG_ENTRIES + 2 * F.PER_SLOT_ENTRIES
    records = parts["run records"]
    assert records.end_files == F.PER_PILOT_ENTRIES - F.PILOT_LOG_ENTRIES + F.FOLDED_FILES
    assert records.peak_files == records.end_files + 2 * F.RUN_DIR_ENTRIES
    outputs = parts["outputs"]
    assert outputs.end_files == 5 + F.OUTPUT_DIRS + F.LATE_OUTPUT_DIRS
    assert outputs.peak_files == outputs.end_files + 2 * (F.CLAIM_WORK_ENTRIES + F.CLAIM_OUT_ENTRIES)
    assert parts["plan directory"].end_files == _entries(out) + F.STORE_FILES


@pytest.mark.parametrize("example", ["star-cori", "star-generic-apptainer", "star-generic-apptainer-late",
                                     "detector-reco-local", "two-clusters-local"])
def test_plan_directory_files_counted_from_the_plan(example, tmp_path, monkeypatch):
    """Per-job scripts and their shared body, arrays, pilots' helpers, finalize, several clusters."""
    monkeypatch.chdir(REPO)
    plan = load_plan(Path("examples") / example / "campaign.yaml")
    out = tmp_path / "p"
    write_plan(plan, out)
    [planned] = [p for u in F.forecast(plan, str(out)).filesystems for p in u.parts if p.part == "plan directory"]
    assert planned.end_files == _entries(out) + F.STORE_FILES


def test_plan_directory_of_scripts_rendered_at_submission(spec_factory, tmp_path):
    """Above SCRIPTS_AS_FILES_MAX jobs the scripts are a template and its table (render/headers.py agrees)."""
    from hpcrun.render import headers
    assert headers.SCRIPT_FILES_MAX == F.SCRIPTS_AS_FILES_MAX
    spec = spec_factory({"jobs": {"array": "never", "script_files": "never"}}, inputs=3)
    plan = load_plan(spec)
    write_plan(plan, tmp_path / "p")
    [planned] = [p for u in F.forecast(plan, str(tmp_path / "p")).filesystems for p in u.parts
                 if p.part == "plan directory"]
    assert planned.end_files == _entries(tmp_path / "p") + F.STORE_FILES


def test_plan_json_has_the_footprint_and_the_table_a_row(cli, spec_factory, tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch, "    quota: {files: 10M, bytes: 20TB}\n")
    spec = spec_factory({"site": {"profile": "quota"}})
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"), "--json")
    assert result.exit_code == 0, result.output
    [fs] = json.loads(result.output)["footprint"]["filesystems"]
    assert fs["name"] == "work" and fs["path"] == str(tmp_path) and fs["type"] == "lustre"
    assert fs["quota"] == {"files": 10_000_000, "bytes": 20 * 10**12}
    assert fs["peak"]["files"] >= fs["end"]["files"] > 3 and fs["end"]["bytes"] >= 3003
    assert {p["part"] for p in fs["parts"]} == {"outputs", "logs", "run records", "plan directory"}
    table = cli("plan", str(spec), "--out", str(tmp_path / "p"), env=WIDE).output
    row = next(line for line in table.splitlines() if "footprint" in line)
    assert f"footprint {tmp_path} (work)" in row
    assert "; quota 10 M files, 20 TB" in row and row.count("peak ") == 1 and "; end " in row


def test_a_manifest_without_a_footprint_still_loads():
    m = Manifest.from_dict({"campaign": "old", "digests": {}, "submit": {}, "jobs": []})
    assert m.footprint is None


def _peak_files(cli, spec, out: Path) -> int:
    result = cli("plan", str(spec), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    [fs] = json.loads(result.output)["footprint"]["filesystems"]
    shutil.rmtree(out)
    return int(fs["peak"]["files"])


def test_a_quota_more_than_half_used_gets_a_note(cli, spec_factory, tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch)
    spec = spec_factory({"site": {"profile": "quota"}}, inputs=6)
    peak = _peak_files(cli, spec, tmp_path / "p")
    _profile(tmp_path, monkeypatch, f"    quota: {{files: {peak + 1}, bytes: 1PB}}\n")
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"), "--json")
    assert result.exit_code == 0, result.output
    [note] = [n for n in json.loads(result.output)["notes"] if "quota" in n]
    assert "filesystems.work.quota.files" in note and f"{peak} files at its peak" in note and str(tmp_path) in note
    assert "more than half" in note
    table = cli("plan", str(spec), "--out", str(tmp_path / "p2"), env=WIDE).output
    assert any("note" in line and "filesystems.work.quota.files" in line for line in table.splitlines())


def test_a_quota_exceeded_refuses_the_plan_naming_the_key(cli, spec_factory, tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch)
    spec = spec_factory({"site": {"profile": "quota"}}, inputs=6)
    peak = _peak_files(cli, spec, tmp_path / "p")
    prof = _profile(tmp_path, monkeypatch, f"    quota:\n      bytes: 1PB\n      files: {peak - 1}\n")
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"))
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"{prof}, line 9, key 'filesystems.work.quota.files'" in text
    assert f"forecast is {peak} files there at its peak (outputs " in text and f"quota of {peak - 1} files" in text
    assert "fewer inputs" in text and "Traceback" not in text
    assert not (tmp_path / "p").exists() and not list(tmp_path.glob(".p.hpcrun-*"))   # nothing written
    # the bytes too, and --json lists the problem with its key
    _profile(tmp_path, monkeypatch, "    quota: {files: 10M, bytes: 2KB}\n")
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"), "--json")
    assert result.exit_code == 2
    [problem] = json.loads(result.output)["problems"]
    assert problem["key"] == "filesystems.work.quota.bytes" and problem["line"] == 7
    assert not (tmp_path / "p").exists()


def test_a_bad_quota_names_file_line_and_key(cli, spec_factory, tmp_path, monkeypatch):
    prof = _profile(tmp_path, monkeypatch, "    quota:\n      files: lots\n")
    result = cli("plan", str(spec_factory({"site": {"profile": "quota"}})), "--out", str(tmp_path / "p"))
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"{prof}, line 8, key 'filesystems.work.quota.files'" in text and "'lots' is not a count" in text
    assert "10M" in text and "Traceback" not in text and not (tmp_path / "p").exists()
    _profile(tmp_path, monkeypatch, "    quota: {files: 0}\n")
    result = cli("profiles", "validate", "quota")
    assert result.exit_code == 2 and "filesystems.work.quota.files" in result.output
    assert "allows nothing" in result.output


def test_counts_are_decimal_as_sites_give_quotas():
    assert parse_count("10M") == 10_000_000 and parse_count("500K") == 500_000 and parse_count(7) == 7
    assert parse_count("1.5G") == 1_500_000_000 and parse_count(" 20m ") == 20_000_000
    for bad in ("lots", "10MB", "1.5", -1, 2.0, True, "10Mi"):
        with pytest.raises(UnitError):
            parse_count(bad)
    assert [format_count(n) for n in (812, 51_234, 2_100_000, 10_000_000, 999_999)] == \
        ["812", "51.2 K", "2.1 M", "10 M", "1 M"]


def test_a_path_under_no_declared_filesystem_has_its_path_and_no_quota(spec_factory, tmp_path):
    plan = load_plan(spec_factory())      # local-test declares only /tmp/hpcrun-test-cluster/pfs
    fp = F.forecast(plan, str(tmp_path / "p"))
    assert [(u.name, u.path, u.quota_files, u.quota_bytes) for u in fp.filesystems] == [
        (None, str(tmp_path / "out"), None, None), (None, str(tmp_path / "p"), None, None)]
    outputs = fp.filesystems[0]
    assert _parts(outputs)["outputs"].peak_files > _parts(outputs)["outputs"].end_files   # its work dirs joined it
    assert F.line(outputs).endswith("no quota known") and "under no filesystem" in F.where_text(outputs)


def test_the_longest_mount_point_holds_a_path(tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch, extra=f"  inner:\n    path: {tmp_path}/p\n")
    profile = load_profile("quota").profile
    assert F.filesystem_of(profile, str(tmp_path / "p" / "logs")) == "inner"
    assert F.filesystem_of(profile, str(tmp_path / "p")) == "inner"
    assert F.filesystem_of(profile, str(tmp_path / "pp")) == "work"     # a name that merely starts alike
    assert F.filesystem_of(profile, "/elsewhere") is None


def test_shipped_nersc_scratch_quotas():
    for name in ("nersc-perlmutter", "nersc-cori-haswell", "nersc-cori-knl"):
        quota = load_profile(name).profile.filesystems["scratch"].quota
        assert quota is not None and (quota.files, quota.bytes) == (10_000_000, 20 * 10**12)


def test_each_cluster_of_a_campaign_is_held_to_its_own_profile_quota(cli, spec_factory, tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch, name="alpha", extra="scheduler: {cluster: alpha}\n")
    beta = _profile(tmp_path, monkeypatch, "    quota: {files: 10}\n", name="beta",
                    extra="scheduler: {cluster: beta}\n")
    spec = spec_factory({"site": {"profile": ["alpha", "beta"]}, "jobs": {"throttle": 2}}, inputs=4)
    plan = load_plan(spec)
    assert F.running_at_once(plan) == 4          # two arrays of %2 at once, one per cluster
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"))
    assert result.exit_code == 2, result.output
    assert f"{beta}, line 7, key 'filesystems.work.quota.files'" in " ".join(result.output.split())
    assert "alpha.yaml" not in result.output and not (tmp_path / "p").exists()


def test_a_path_through_a_link_is_on_the_filesystem_it_leads_to(tmp_path, monkeypatch):
    """A home directory's link into scratch: the outputs written through it count against scratch's quota."""
    from hpcrun.model.profiles import load_profile
    scratch = tmp_path / "scratch"
    (scratch / "me").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "out").symlink_to(scratch / "me")
    prof = tmp_path / "profiles"
    prof.mkdir()
    home = tmp_path / "home"
    (prof / "linked.yaml").write_text(f"name: linked\nextends: local-test\nfilesystems:\n  scratch:\n"
                                      f"    path: {scratch}\n    type: lustre\n  home:\n    path: {home}\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    profile = load_profile("linked").profile
    assert F.filesystem_of(profile, str(tmp_path / "home" / "out" / "run1")) == "scratch"
    assert F.filesystem_of(profile, str(tmp_path / "home" / "elsewhere")) == "home"

