"""Stage-in integrity at plan time: where each input's checksum comes from, how it is
validated, and how it is recorded (manifest.json, tasks.tsv, the job's checksum step)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from hpcrun.errors import InputError
from hpcrun.plan.job.checksums import compute
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan


def _data(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _files(tmp_path: Path, *entries: dict) -> dict:
    return {"inputs": {"glob": None, "files": list(entries)}}


def _adler(data: bytes) -> str:
    return f"adler32:{zlib.adler32(data) & 0xFFFFFFFF:08x}"


def _md5(data: bytes) -> str:
    return "md5:" + hashlib.md5(data).hexdigest()


# ---- validation: (id, overrides built from the data directory, key, message fragment) -----

def _cases(data: Path):
    run0 = str(data / "run000.raw")
    return [
        ("syntax-digits", _files(data, {"path": run0, "checksum": "adler32:0a1b2c3"}),
         "inputs.files[0].checksum", "'adler32:0a1b2c3' is not an adler32 checksum; write adler32:<8 hex digits>"),
        ("syntax-not-hex", _files(data, {"path": run0, "checksum": "md5:" + "g" * 32}),
         "inputs.files[0].checksum", "is not an md5 checksum; write md5:<32 hex digits>"),
        ("syntax-algo", _files(data, {"path": run0, "checksum": "sha1:0a1b2c3d"}),
         "inputs.files[0].checksum", "is not a checksum; write adler32:<8 hex digits> (e.g. adler32:0a1b2c3d) or md5"),
        ("syntax-bare-hex", _files(data, {"path": run0, "checksum": "0a1b2c3d"}),
         "inputs.files[0].checksum", "is not a checksum"),
        ("algo-mismatch", _files(data, {"path": run0, "checksum": "md5:" + "0" * 32}),
         "inputs.files[0].checksum", "is an md5 checksum but inputs.checksum is 'adler32'; give "
                                    "adler32:<8 hex digits>, or set inputs.checksum: md5"),
        ("algo-mismatch-md5", {"inputs": {"checksum": "md5", "glob": None,
                                          "files": [{"path": run0, "checksum": "adler32:0a1b2c3d"}]}},
         "inputs.files[0].checksum", "inputs.checksum is 'md5'"),
        ("bad-algo", {"inputs": {"checksum": "sha256"}}, "inputs.checksum", "use one of"),
        ("catalog-missing", {"inputs": {"checksum_catalog": "nope.adler32"}}, "inputs.checksum_catalog",
         "cannot read the checksum catalog"),
    ]


CASE_IDS = [c[0] for c in _cases(Path("/x"))]


@pytest.mark.parametrize("index", range(len(CASE_IDS)), ids=CASE_IDS)
def test_checksum_errors(spec_factory, tmp_path, index):
    _case_id, overrides, key, fragment = _cases(_data(tmp_path))[index]
    with pytest.raises(InputError) as exc:
        load_plan(spec_factory(overrides))
    matching = [p for p in exc.value.problems if p.key == key and fragment in p.message]
    assert matching, f"expected {key!r} / {fragment!r} in:\n{exc.value}"
    assert matching[0].file.endswith(".yaml") and matching[0].line and matching[0].line >= 1
    # the other branch of the union (a plain path) does not add "expected text, found {...}"
    assert not any("expected text" in p.message for p in exc.value.problems), exc.value


def test_catalog_errors_name_file_and_line(spec_factory, tmp_path):
    catalog = tmp_path / "inputs.adler32"
    catalog.write_text("# xrdadler32 output\n\n"
                       "0a1b2c3d  data/run000.raw\n"          # 3: fine
                       "zz0a1b2c  data/run001.raw\n"          # 4: not hex
                       "just-one-field\n"                     # 5: no path
                       "d41d8cd98f00b204e9800998ecf8427e  data/run002.raw\n"  # 6: md5, not adler32
                       "0a1b2c3e  data/run000.raw\n")         # 7: listed again, differently
    with pytest.raises(InputError) as exc:
        load_plan(spec_factory({"inputs": {"checksum_catalog": "inputs.adler32"}}))
    found = {p.line: p.message for p in exc.value.problems if p.file == str(catalog)}
    assert sorted(found) == [4, 5, 6, 7], exc.value
    assert "'zz0a1b2c' is not an adler32 checksum (8 hex digits)" in found[4]
    assert "each line is: HEX  PATH" in found[5]
    assert "as inputs.checksum is 'adler32'" in found[6]
    assert "listed again with another checksum (first on line 3)" in found[7]


def test_none_skips_everything(spec_factory, tmp_path):
    run0 = str(_data(tmp_path) / "run000.raw")
    spec = spec_factory({"inputs": {"checksum": "none", "checksum_catalog": "does-not-exist",
                                    "files": [{"path": run0, "checksum": "md5:" + "0" * 32}],
                                    "glob": None}})
    plan = load_plan(spec)
    out = write_plan(plan, tmp_path / "plan").out_dir
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checksum"] == "none"
    assert manifest["jobs"][0]["checksums"] == [None]
    assert (out / "tasks.tsv").read_text().rstrip("\n").split("\t")[7] == "-"   # the checksum column
    script = next((out / "jobs").glob("*.sbatch")).read_text()
    assert "stage-in integrity" not in script and not (out / "bin" / "hpcrun-checksum.py").exists()
    # the outputs' provenance sums: sha256 when the spec names none
    assert 'sha256sum -- "$out"' in (out / "bin" / "hpcrun-job.sh").read_text()
    assert any("inputs.checksum is none" in n and "not verified" in n for n in plan.notes)
    assert not any("have no checksum" in n for n in plan.notes)


# ---- where values come from ------------------------------------------------------------

@pytest.mark.parametrize("algo", ["adler32", "md5"])
def test_computed_at_plan_time(spec_factory, tmp_path, algo):
    spec = spec_factory({"inputs": {"checksum": algo}, "jobs": {"files_per_job": 2}})
    big = _data(tmp_path) / "run003.raw"  # crosses the 8 MiB read size
    big.write_bytes(bytes(range(256)) * (9 * 4096 + 7))
    plan = load_plan(spec)
    expect = _adler if algo == "adler32" else _md5
    for job in plan.jobs:
        assert job.checksums == tuple(expect(Path(i.path).read_bytes()) for i in job.inputs)
    assert compute(str(big), algo) == expect(big.read_bytes())
    assert not any("no checksum" in n for n in plan.notes)


def test_catalog_and_per_file_values(spec_factory, tmp_path):
    data = _data(tmp_path)
    (tmp_path / "sums").mkdir()
    # md5sum -b style ('*' marker), relative to the catalog's directory, upper-case hex
    (tmp_path / "sums" / "inputs.md5").write_text(
        f"{'A' * 32} *../data/run000.raw\n{'b' * 32}  {data}/run001.raw\n{'c' * 32}  /elsewhere/x\n")
    spec = spec_factory({"inputs": {"checksum": "md5", "checksum_catalog": "sums/inputs.md5",
                                    "glob": None, "files": [
                                        str(data / "run000.raw"),
                                        {"path": str(data / "run001.raw"), "checksum": "md5:" + "d" * 32},
                                        str(data / "run002.raw")]}})
    plan = load_plan(spec)
    got = [c for j in plan.jobs for c in j.checksums]
    assert got == ["md5:" + "a" * 32,                                  # from the catalog
                   "md5:" + "d" * 32,                                  # per-file wins
                   _md5((data / "run002.raw").read_bytes())]           # computed


def test_manifest_tasks_and_note_for_unknown(spec_factory, tmp_path):
    data = _data(tmp_path)
    spec = spec_factory({"inputs": {"glob": None, "size": "1MB", "files": [
        str(data / "run000.raw"), "/nonexistent/a.raw", "/nonexistent/b.raw"]},
        "jobs": {"files_per_job": 2}}, inputs=1)
    plan = load_plan(spec)
    out = write_plan(plan, tmp_path / "plan").out_dir
    manifest = json.loads((out / "manifest.json").read_text())
    known = _adler((data / "run000.raw").read_bytes())
    assert manifest["checksum"] == "adler32"
    assert [(j["inputs"], j["checksums"]) for j in manifest["jobs"]] == [
        ([str(data / "run000.raw"), "/nonexistent/a.raw"], [known, None]),
        (["/nonexistent/b.raw"], [None])]
    rows = [r.split("\t") for r in (out / "tasks.tsv").read_text().splitlines()]
    assert [len(r) for r in rows] == [9, 9, 9]
    assert [r[7] for r in rows] == [known, "-", "-"]
    note = ("2 input(s) have no checksum and will not be verified (not readable here, none "
            "given): /nonexistent/a.raw, /nonexistent/b.raw")
    assert note in plan.notes and note in manifest["notes"]
    script = (out / "jobs" / "array001.sbatch").read_text()
    assert 'step python3 "$HPCRUN_PLAN_DIR/bin/hpcrun-checksum.py" adler32 "$path"' in script
    assert "EXIT_CHECKSUM=11" in script


def test_no_block_when_nothing_is_known(spec_factory, tmp_path):
    spec = spec_factory({"inputs": {"glob": None, "size": "1MB", "files": ["/nonexistent/a.raw"]}},
                        inputs=0)
    out = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    script = next((out / "jobs").glob("*.sbatch")).read_text()
    assert "stage-in integrity" not in script
    # the helper is still there: the job sums its outputs with it, for their provenance records
    body = (out / "bin" / "hpcrun-job.sh").read_text()
    assert (out / "bin" / "hpcrun-checksum.py").exists() and 'bin/hpcrun-checksum.py" adler32 "$out"' in body


def test_profile_tools_choose_the_program(spec_factory, tmp_path, monkeypatch):
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "xrd.yaml").write_text("name: xrd\nextends: local-test\ntools:\n  xrdadler32: /opt/xrootd/bin/xrdadler32\n")
    (prof / "py.yaml").write_text("name: py\nextends: local-test\ntools:\n  python: /opt/py 3/bin/python3\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    out = write_plan(load_plan(spec_factory({"site": {"profile": "xrd"}})), tmp_path / "a").out_dir
    script = next((out / "jobs").glob("*.sbatch")).read_text()
    assert "step /opt/xrootd/bin/xrdadler32 \"$path\"" in script
    assert not (out / "bin" / "hpcrun-checksum.py").exists()
    out = write_plan(load_plan(spec_factory({"site": {"profile": "py"}}, name="b.yaml")), tmp_path / "b").out_dir
    script = next((out / "jobs").glob("*.sbatch")).read_text()
    assert "checksum_tool='/opt/py 3/bin/python3'" in script
    assert "step '/opt/py 3/bin/python3' \"$HPCRUN_PLAN_DIR/bin/hpcrun-checksum.py\" adler32" in script
    out = write_plan(load_plan(spec_factory({"inputs": {"checksum": "md5"}}, name="c.yaml")), tmp_path / "c").out_dir
    script = next((out / "jobs").glob("*.sbatch")).read_text()
    assert 'step md5sum -- "$path"' in script


@pytest.mark.parametrize("algo", ["adler32", "md5"])
def test_rendered_helper_agrees_with_the_planner(spec_factory, tmp_path, algo):
    out = write_plan(load_plan(spec_factory()), tmp_path / "plan").out_dir
    helper = out / "bin" / "hpcrun-checksum.py"
    sample = tmp_path / "sample"
    sample.write_bytes(b"\x00\xff" * 5_000_000)
    proc = subprocess.run([sys.executable, str(helper), algo, str(sample)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"{algo}:{proc.stdout.split()[0]}" == compute(str(sample), algo)
    assert proc.stdout == f"{proc.stdout.split()[0]}  {sample}\n"   # as md5sum prints it: value, two spaces, path
    missing = subprocess.run([sys.executable, str(helper), algo, str(tmp_path / "nope"), str(sample)],
                             capture_output=True, text=True)
    # several files at once (the job's stage-in sums what it reads in place so): the readable ones summed
    assert missing.returncode == 1 and "No such file or directory" in missing.stderr and str(sample) in missing.stdout
