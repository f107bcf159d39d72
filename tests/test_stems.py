"""Inputs as experiments name them (issue 29): stems from the path when every file is called
AliAOD.root, one paragraph per cause of many problems (every one in --json), the list file's own line,
and the plan's note on whole nodes held for few chains."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from hpcrun.errors import InputError
from hpcrun.plan.intake.inputs import stems_of
from hpcrun.plan.load import load_plan

AOD = "/alice/data/2018/LHC18q/AOD/{n:04d}/AliAOD.root"


def _spec(tmp_path: Path, inputs: dict, **extra) -> Path:
    spec = {"name": "train", "site": {"profile": "local-test"}, "walltime": "00:30:00",
            "inputs": {"checksum": "none", **inputs}, "jobs": {"files_per_job": 1, "chains_per_node": 1},
            "chain": {"command": ["/bin/cp", "{input}", "{output}"]},
            "outputs": {"location": str(tmp_path / "out"), "pattern": "{stem}.out"}, **extra}
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _aod_list(tmp_path: Path, n: int = 50, url: bool = False) -> str:
    prefix = "root://alice-se.gsi.de:1094/" if url else ""
    (tmp_path / "aods.txt").write_text("".join(f"{prefix}{AOD.format(n=k)} 2GB 1000\n" for k in range(1, n + 1)))
    return "aods.txt"


def test_file_names_that_repeat_are_refused_with_the_setting_that_names_them_apart(tmp_path, cli):
    spec = _spec(tmp_path, {"list_file": _aod_list(tmp_path)})
    res = cli("plan", str(spec), "--out", str(tmp_path / "plan"))
    assert res.exit_code == 2 and not (tmp_path / "plan").exists()
    text = res.output
    assert "49 problems found" in text and text.count("share their stem with an earlier input") == 1, text
    assert "(stem 'AliAOD')" in text, text
    assert "aods.txt lines 2-50" in text and "set inputs.stem: path" in text, text
    assert "'0001_AliAOD', '0002_AliAOD'" in text, text
    js = cli("plan", str(spec), "--out", str(tmp_path / "plan"), "--json")
    problems = json.loads(js.output)["problems"]
    assert js.exit_code == 2 and len(problems) == 49 and {p["line"] for p in problems} == set(range(2, 51))
    assert all(p["file"].endswith("aods.txt") for p in problems)


@pytest.mark.parametrize("url", [False, True], ids=["paths", "urls"])
def test_stem_path_names_each_input_by_the_part_of_its_path_that_differs(tmp_path, url):
    spec = _spec(tmp_path, {"list_file": _aod_list(tmp_path, url=url), "stem": "path"})
    plan = load_plan(spec)
    assert [i.stem for j in plan.jobs for i in j.inputs][:3] == ["0001_AliAOD", "0002_AliAOD", "0003_AliAOD"]
    assert [j.outputs[0] for j in plan.jobs][:2] == ["0001_AliAOD.out", "0002_AliAOD.out"]


def test_stem_path_of_a_glob_over_runs_and_chunks(tmp_path):
    for run in ("000296414", "000296415"):
        for chunk in ("001", "002"):
            d = tmp_path / "alice" / "LHC18q" / run / "pass1" / "AOD" / chunk
            d.mkdir(parents=True)
            (d / "AliAOD.root").write_bytes(b"x" * 10)
    spec = _spec(tmp_path, {"glob": str(tmp_path / "alice/LHC18q/*/pass1/AOD/*/AliAOD.root"), "stem": "path"})
    stems = [i.stem for j in load_plan(spec).jobs for i in j.inputs]
    assert stems == ["000296414_pass1_AOD_001_AliAOD", "000296414_pass1_AOD_002_AliAOD",
                     "000296415_pass1_AOD_001_AliAOD", "000296415_pass1_AOD_002_AliAOD"]


def test_a_regular_expression_with_a_stem_group(tmp_path):
    spec = _spec(tmp_path, {"list_file": _aod_list(tmp_path, 3), "stem": r"/AOD/(?P<stem>\d+)/AliAOD"})
    assert [i.stem for j in load_plan(spec).jobs for i in j.inputs] == ["0001", "0002", "0003"]
    bad = _spec(tmp_path, {"list_file": _aod_list(tmp_path, 3), "stem": r"/ESD/(?P<stem>\d+)/"})
    with pytest.raises(InputError) as exc:
        load_plan(bad)
    assert "3 inputs get no stem from inputs.stem" in str(exc.value), str(exc.value)
    nogroup = _spec(tmp_path, {"list_file": _aod_list(tmp_path, 3), "stem": r"/AOD/(\d+)/"})
    with pytest.raises(InputError) as exc:
        load_plan(nogroup)
    assert "has no group (?P<stem>...)" in str(exc.value) and "inputs.stem" in str(exc.value)


def test_collisions_of_different_stems_are_still_one_paragraph(tmp_path):
    (tmp_path / "l.txt").write_text("".join(f"/d/{k}/run{k % 5}.raw 1GB\n" for k in range(10)))
    with pytest.raises(InputError) as exc:
        load_plan(_spec(tmp_path, {"list_file": "l.txt"}))
    text = str(exc.value)
    assert "5 problems found" in text and text.count("\n\n") == 1, text
    assert "l.txt lines 6-10: 5 inputs share their stem with an earlier input" in text, text


def test_stems_made_safe_and_a_collision_that_path_cannot_solve(tmp_path):
    assert stems_of(["/d/a b/x.raw", "/d/a;b/x.raw"], "path") == ["a_b_x", "a_b_x"]
    files = [{"path": "/d/a b/x.raw", "size": "1GB"}, {"path": "/d/a;b/x.raw", "size": "1GB"}]
    with pytest.raises(InputError) as exc:
        load_plan(_spec(tmp_path, {"files": files, "stem": "path"}))
    assert "same stem 'a_b_x'" in str(exc.value) and "(?P<stem>" in str(exc.value)


def test_a_thousand_missing_inputs_are_one_paragraph_and_every_one_in_json(tmp_path, cli):
    (tmp_path / "missing.txt").write_text("".join(f"/nonexistent/raw/f{k}.daq\n" for k in range(1, 1001)))
    spec = _spec(tmp_path, {"list_file": "missing.txt"})
    res = cli("plan", str(spec), "--out", str(tmp_path / "plan"))
    assert res.exit_code == 2
    paragraphs = [p for p in res.output.split("\n\n") if p.strip()]
    assert len(paragraphs) == 2, res.output[:2000]          # the head line and one paragraph
    assert "missing.txt lines 1-1000: 1000 inputs do not exist here and have no size" in paragraphs[1]
    assert "/nonexistent/raw/f1.daq" in paragraphs[1] and "give inputs.size" in paragraphs[1]
    assert len(res.output) < 1000
    js = cli("plan", str(spec), "--out", str(tmp_path / "plan"), "--json")
    problems = json.loads(js.output)["problems"]
    assert len(problems) == 1000 and problems[999]["line"] == 1000 and problems[999]["subject"] == \
        "/nonexistent/raw/f1000.daq"


def test_a_bad_line_in_a_100k_line_list_is_reported_at_its_line_within_a_second(tmp_path):
    lines = [f"/data/raw/run{k:06d}.daq 1GB 100\n" for k in range(100_000)]
    lines[77_776] = "/data/raw/run077777.daq 1GX 100\n"
    (tmp_path / "big.txt").write_text("".join(lines))
    spec = _spec(tmp_path, {"list_file": "big.txt"})
    started = time.process_time()   # this process's CPU: a CI machine's load stretches the wall time (5.5 s seen)
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    took = time.process_time() - started
    problems = exc.value.problems
    assert len(problems) == 1 and problems[0].file.endswith("big.txt") and problems[0].line == 77_777
    assert "bad size" in problems[0].message
    assert took < 1.0, took


def test_whole_nodes_held_for_few_chains_are_noted_with_the_core_hours(tmp_path, monkeypatch):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "fat.yaml").write_text(yaml.safe_dump({
        "name": "fat", "extends": "local-test",
        "partitions": {"debug": {"slurm_partition": "debug", "nodes": 3, "cores_per_node": 48,
                                 "memory_per_node": "100GiB", "max_walltime": "01:00:00", "exclusive": True}}}))
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(profiles))
    (tmp_path / "l.txt").write_text("".join(f"/data/r{k}.daq 1GB\n" for k in range(10)))
    merge = {"command": ["/bin/cat", "{parts}"]}
    spec = _spec(tmp_path, {"list_file": "l.txt"}, site={"profile": "fat"},
                 jobs={"files_per_job": 1, "chains_per_node": 8}, merge=merge)
    notes = " ".join(load_plan(spec).notes)
    # 10 jobs x 1 node x 0.5 h: 240 core-hours charged (48 cores), 40 used (8 chains)
    assert "whole 48-core nodes" in notes and "240 core-hours charged for 40 used (17%)" in notes, notes
    assert "jobs.chains_per_node" in notes and "shared partition" in notes
    shared = _spec(tmp_path, {"list_file": "l.txt"}, jobs={"files_per_job": 1, "chains_per_node": 8}, merge=merge)
    assert "core-hours charged" not in " ".join(load_plan(shared).notes)   # local-test is not exclusive


def test_parent_dir_is_os_path_dirname():
    """The planner's inline dirname (called per input) says what os.path.dirname says."""
    import posixpath

    from hpcrun.plan.intake.inputs import parent_dir
    for path in ["/a/b", "/a", "/", "//", "//a", "a//b", "/a//b", "a", "", "/a/b/", "///a/b", "a/", "x//",
                 "/d/ünï/€.daq", "/a\nb/c"]:
        assert parent_dir(path) == posixpath.dirname(path), path


@pytest.mark.parametrize("text", [
    "# PATH SIZE EVENTS\n/d/a.daq 1GB 10\n\n   # indented comment\n/d/b.daq 2GB 20\n/e/c.raw 1.5GB 7\n",
    "/d/a.daq 1GB\n/d/b.daq 5MB\n",                                                   # sizes only
    "root://xrd.example.org//store/a.daq 1GB 5\nroot://xrd.example.org//store/b.daq 1GB 6\n",   # URLs
    "/d/a.daq 1GB 10\n/d/b.daq 2GB\n",                                                # widths mixed
    "/d/ünï.daq 1GB 10\n/d/.hidden 1GB 10\n",
])
def test_the_quick_list_reading_gives_what_the_line_by_line_reading_gives(tmp_path, monkeypatch, text):
    """The list read at C speed (the usual list) and line by line (any list) give the same inputs."""
    import hpcrun.plan.intake.inputs as inputs

    (tmp_path / "l.txt").write_text(text)
    spec = _spec(tmp_path, {"list_file": "l.txt", "events": 99})
    quick = [(i.path, i.size, i.events, i.stem) for j in load_plan(spec).jobs for i in j.inputs]
    monkeypatch.setattr(inputs, "_quick_list", lambda lines, spec: None)
    slow = [(i.path, i.size, i.events, i.stem) for j in load_plan(spec).jobs for i in j.inputs]
    assert quick == slow and len(quick) == text.count(".daq") + text.count(".raw") + text.count(".hidden")


@pytest.mark.parametrize("text", ["/d/a.daq 1GB 10\nrelative/b.daq 1GB 10\n", "/d/a.daq 1GB 10\n/d/a.daq 1GB 10\n",
                                  "/d/a.daq 1XB 10\n", "/d/a.daq 1GB ten\n", "/d/a.daq 1GB 1 2\n",
                                  "root://bad host//a 1GB 1\n", "/d/a.daq 1GB \u00b2\n"])
def test_a_list_the_quick_reading_cannot_take_goes_line_by_line(tmp_path, text):
    """Anything unusual (a relative path, a path twice, a bad size or count, a bad URL) is left to the
    reading line by line, which says which line is wrong (a superscript digit is a digit to isdigit,
    not to int: refused, not a traceback)."""
    from hpcrun.plan.intake.inputs import _quick_list

    (tmp_path / "l.txt").write_text(text)
    assert _quick_list(text.splitlines(), _inputs_spec()) is None
    with pytest.raises(InputError):
        load_plan(_spec(tmp_path, {"list_file": "l.txt"}))


def _inputs_spec():
    from hpcrun.model.spec import InputsSpec
    return InputsSpec(list_file="l.txt")


@pytest.mark.parametrize("pattern, per_job, stage", [("{stem}.out", 1, False), ("{name}.out", 1, False),
                                                       ("x_{stem}_{name}", 3, True), ("{stem}.out", 3, True)])
def test_output_names_at_c_speed_are_the_loops_and_clashes_still_go_to_the_loop(pattern, per_job, stage):
    """The bulk output names equal the loop's; a clash (same output, same file name staged in one job)
    is left to the loop, which names the inputs."""
    from hpcrun.plan import checks
    from hpcrun.plan.intake.inputs import InputItem

    items = [InputItem(f"/d/r{k}/f{k % 4 if '{name}' == pattern[:6] else k}.daq", 1, None, f"r{k}_f")
             for k in range(12)]
    loop_said: list = []
    bulk = checks._unique_outputs(pattern, items, stage and per_job > 1)
    if "{stem}" in pattern:
        assert bulk == [checks.ph.output_namer(pattern)(i.stem, i.path.rpartition("/")[2]) for i in items]
    else:   # names repeat (f0.daq ... f3.daq): a clash, found and told by the loop
        assert bulk is None
        assert checks.check_output_names(pattern, items, per_job, stage, lambda k, m: loop_said.append(m)) is None
        assert "would share the output name" in loop_said[0]
    same_name = [InputItem(f"/d/r{k}/f.daq", 1, None, f"r{k}") for k in range(6)]
    assert (checks._unique_outputs("{stem}.out", same_name, True) is None) and checks._unique_outputs(
        "{stem}.out", same_name, False) is not None
    assert checks.check_output_names("{stem}.out", same_name, 3, True, lambda k, m: loop_said.append(m)) is None
    assert "chain parts" in loop_said[-1]
