"""DataWarp emulation (contrib/slurm-dw-emulator) on the real test cluster.

The first tests run the emulator's parser offline with lua5.1 (no Slurm
needed); the ones marked ``cluster`` submit real jobs as the test user.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EMULATOR = REPO / "contrib" / "slurm-dw-emulator" / "burst_buffer.lua"
JOB_SUBMIT = REPO / "contrib" / "slurm-dw-emulator" / "job_submit.lua"
LUA = shutil.which("lua5.1")

JOBDW = "#DW jobdw capacity=10GB access_mode=striped type=scratch"


# --------------------------------------------------------------------------
# offline: the directive parser under plain Lua 5.1
# --------------------------------------------------------------------------

LUA_DRIVER = r"""
dofile(arg[1])
local f = io.open(arg[2]); local text = f:read("*a"); f:close()
local spec, err = dw_emulator.parse_script(text)
if not spec then print("ERR " .. err) return end
local out = {"OK"}
if spec.jobdw then
  out[#out+1] = string.format("jobdw=%d:%s:%s", spec.jobdw.bytes, spec.jobdw.access_mode,
                              spec.jobdw.type)
end
out[#out+1] = "in=" .. #spec.stage_in
out[#out+1] = "out=" .. #spec.stage_out
out[#out+1] = "persistent=" .. table.concat(spec.persistent, ",")
out[#out+1] = "creates=" .. #spec.creates
out[#out+1] = "destroys=" .. #spec.destroys
print(table.concat(out, " "))
"""


@pytest.fixture(scope="module")
def lua_parse(tmp_path_factory):
    if LUA is None:
        pytest.skip("lua5.1 is not installed (python3 tests/cluster/harness.py install)")
    d = tmp_path_factory.mktemp("lua")
    driver = d / "driver.lua"
    driver.write_text(LUA_DRIVER)

    def parse(script: str) -> str:
        s = d / "job.sh"
        s.write_text(script)
        p = subprocess.run([LUA, str(driver), str(EMULATOR), str(s)], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()
    return parse


def job(*lines: str, body: str = "true") -> str:
    return "#!/bin/bash\n#SBATCH -N 1\n" + "\n".join(lines) + "\n" + body + "\n"


@pytest.mark.parametrize("script,expected", [
    (job(JOBDW), "OK jobdw=10000000000:striped:scratch in=0 out=0"),
    (job("#DW jobdw capacity=2TiB access_mode=striped,private type=cache pfs=/p"),
     f"OK jobdw={2 * 1024**4}:striped,private:cache"),
    (job(JOBDW, "#DW stage_in source=/pfs/a destination=$DW_JOB_STRIPED/a type=file",
         "#DW stage_out source=${DW_JOB_STRIPED}/o destination=/pfs/o type=directory"),
     "in=1 out=1"),
    # directives after the first command are not directives (Slurm stops there)
    (job(JOBDW, body="echo hi\n#DW frobnicate"), "OK"),
    # continuation lines
    (job("#DW jobdw capacity=1GiB \\", "#DW access_mode=striped type=scratch"),
     f"jobdw={1024**3}:striped:scratch"),
    (job("#BB create_persistent name=pb1 capacity=100GB access_mode=striped type=scratch",
         "#DW persistentdw name=pb1",
         "#DW stage_in source=/x destination=$DW_PERSISTENT_STRIPED_pb1/x type=file"),
     "persistent=pb1 creates=1"),
    (job("#DW persistentdw name=pb1", "#BB destroy_persistent name=pb1"), "destroys=1"),
])
def test_parser_accepts(lua_parse, script, expected):
    out = lua_parse(script)
    assert out.startswith("OK"), out
    for part in expected.split():
        assert part in out, out


@pytest.mark.parametrize("script,message", [
    (job("#DW jobdw capacity=3.5TB access_mode=striped type=scratch"),
     "capacity=3.5TB is not an integer"),
    (job("#DW jobdw capacity=3.5TB access_mode=striped type=scratch"), "capacity=3500GB"),
    (job("#DW jobdw capacity=10XB access_mode=striped type=scratch"), "unknown unit"),
    (job("#DW jobdw access_mode=striped type=scratch"), "needs capacity="),
    (job("#DW jobdw capacity=1GB access_mode=striped"), "needs type=scratch or type=cache"),
    (job("#DW jobdw capacity=1GB type=scratch"), "needs access_mode="),
    (job("#DW jobdw capacity=1GB access_mode=shared type=scratch"), "access_mode=shared"),
    (job("#DW jobdw capacity=1GB access_mode=striped type=fast"), "type=fast"),
    (job(JOBDW, JOBDW), "only one '#DW jobdw'"),
    (job(JOBDW, "#DW frobnicate x=1"), "unrecognized directive '#DW frobnicate x=1'"),
    (job(JOBDW, "#DW stage_in destination=$DW_JOB_STRIPED/a type=file"), "needs source="),
    (job(JOBDW, "#DW stage_in source=/a type=file"), "needs destination="),
    (job(JOBDW, "#DW stage_in source=/a destination=$DW_JOB_STRIPED/a"), "needs type="),
    (job(JOBDW, "#DW stage_in source=/a destination=$DW_JOB_STRIPED/a type=tarball"),
     "type=tarball"),
    (job(JOBDW, "#DW stage_in source=data/a destination=$DW_JOB_STRIPED/a type=file"),
     "must be an absolute path"),
    (job(JOBDW, "#DW stage_in source=$HOME/a destination=$DW_JOB_STRIPED/a type=file"),
     "must be an absolute path"),
    (job(JOBDW, "#DW stage_in source=/a destination=/scratch/a type=file"),
     "must be inside the burst buffer"),
    (job(JOBDW, "#DW stage_out source=/a destination=/b type=file"),
     "must be inside the burst buffer"),
    (job("#DW stage_in source=/a destination=$DW_JOB_STRIPED/a type=file"),
     "needs a '#DW jobdw' or '#DW persistentdw' line"),
    (job("#DW persistentdw name=p1",
         "#DW stage_in source=/a destination=$DW_JOB_STRIPED/a type=file"),
     "has no '#DW jobdw ... access_mode=striped'"),
    (job(JOBDW, "#DW stage_in source=/a destination=$DW_PERSISTENT_STRIPED_zz/a type=file"),
     "has no '#DW persistentdw name=zz'"),
    (job("#DW persistentdw name=9lives"), "needs name="),
    (job(JOBDW, "#DW jobdw_typo capacity=1GB"), "unrecognized directive"),
    (job("#BB create_persistent name=p capacity=1.5TB"), "is not an integer"),
    (job(JOBDW, "#BB frobnicate name=x"), "unrecognized directive '#BB frobnicate"),
])
def test_parser_rejects(lua_parse, script, message):
    out = lua_parse(script)
    assert out.startswith("ERR"), out
    assert message in out, out


def test_pools_json_uses_granule_counts(tmp_path):
    if LUA is None:
        pytest.skip("lua5.1 is not installed")
    (tmp_path / "burst_buffer.lua").write_text(EMULATOR.read_text())
    (tmp_path / "burst_buffer_emulator.conf").write_text(
        "base_dir = /tmp/x\npool = wlm_pool 100GiB 1GiB\npool = sm_pool 20GB 256MiB\n")
    p = subprocess.run([LUA, "-e", f"dofile('{tmp_path}/burst_buffer.lua'); "
                        "local rc, js = slurm_bb_pools(); print(rc); print(js)"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    rc, js = p.stdout.splitlines()
    assert rc == "0"
    pools = json.loads(js)["pools"]
    assert pools[0] == {"id": "wlm_pool", "granularity": 1024**3, "quantity": 100}
    assert pools[1] == {"id": "sm_pool", "granularity": 256 * 1024**2,
                        "quantity": 20 * 1000**3 // (256 * 1024**2)}


def test_job_submit_adds_default_pool(tmp_path):
    if LUA is None:
        pytest.skip("lua5.1 is not installed")
    (tmp_path / "job_submit.lua").write_text(JOB_SUBMIT.read_text())
    (tmp_path / "burst_buffer_emulator.conf").write_text("pool = mypool 10GiB\n")
    script = ("#!/bin/bash\n#DW jobdw capacity=10GB access_mode=striped type=scratch\n"
              "#DW jobdw capacity=1GB pool=other \\\n#DW type=scratch\n"
              "#DW stage_in source=/a destination=$DW_JOB_STRIPED/a type=file\n"
              "echo\n#DW jobdw capacity=5GB\n")
    (tmp_path / "job.sh").write_text(script)
    lua = (f"slurm = {{SUCCESS = 0, log_info = function() end}}\n"
           f"dofile('{tmp_path}/job_submit.lua')\n"
           f"local f = io.open('{tmp_path}/job.sh'); local s = f:read('*a'); f:close()\n"
           f"local jd = {{script = s}}\n"
           f"assert(slurm_job_submit(jd, {{}}, 0) == 0)\n"
           f"io.write(jd.script)\n")
    p = subprocess.run([LUA, "-e", lua], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[1] == "#DW jobdw capacity=10GB access_mode=striped type=scratch pool=mypool"
    assert lines[2] == "#DW jobdw capacity=1GB pool=other \\"  # already has a pool
    assert lines[3] == "#DW type=scratch"
    assert "pool=" not in lines[4]  # no capacity
    assert lines[6] == "#DW jobdw capacity=5GB"  # after the first command: not a directive


# --------------------------------------------------------------------------
# on the cluster
# --------------------------------------------------------------------------

def _ordered(events: list[dict], *functions: str) -> bool:
    seq = [e["function"] for e in events]
    try:
        idx = [seq.index(f) for f in functions]
    except ValueError:
        return False
    return idx == sorted(idx)


@pytest.mark.cluster
def test_stage_in_all_types_and_stage_out(slurm_cluster):
    c = slurm_cluster
    pfs = c.pfs
    (pfs / "in_dir" / "sub").mkdir(parents=True)
    (pfs / "in_dir" / "a.txt").write_text("dir-a\n")
    (pfs / "in_dir" / "sub" / "b.txt").write_text("dir-b\n")
    (pfs / "single.txt").write_text("single\n")
    (pfs / "l1.txt").write_text("list-1\n")
    (pfs / "ldir").mkdir()
    (pfs / "ldir" / "l2.txt").write_text("list-2\n")
    (pfs / "stage.list").write_text(
        "# source destination\n"
        f"{pfs}/l1.txt $DW_JOB_STRIPED/list/one.txt\n"
        f"{pfs}/ldir   fromlist/dir\n")
    c.chown(pfs)
    out = c.workdir / "job.out"
    script = c.write("job.sh", f"""#!/bin/bash
#SBATCH -o {out}
{JOBDW}
#DW stage_in source={pfs}/in_dir destination=$DW_JOB_STRIPED/in type=directory
#DW stage_in source={pfs}/single.txt destination=$DW_JOB_STRIPED/s/single.txt type=file
#DW stage_in source={pfs}/stage.list destination=$DW_JOB_STRIPED/base type=list
#DW stage_out source=$DW_JOB_STRIPED/out destination={pfs}/out type=directory
#DW stage_out source=$DW_JOB_STRIPED/out/result.txt destination={pfs}/result.txt type=file
#DW stage_out source=$DW_JOB_STRIPED/out.list destination={pfs}/listout type=list
set -e
echo "STRIPED=$DW_JOB_STRIPED"
cd "$DW_JOB_STRIPED"
cat in/a.txt in/sub/b.txt s/single.txt list/one.txt base/fromlist/dir/l2.txt
mkdir -p out
echo "result from $SLURM_JOB_ID" > out/result.txt
printf '%s\n' '$DW_JOB_STRIPED/out/result.txt copied.txt' \
    '$DW_JOB_STRIPED/in {pfs}/listout/in_again' > out.list
srun bash -c 'echo "STEP_STRIPED=$DW_JOB_STRIPED"; test -f "$DW_JOB_STRIPED/in/a.txt"'
""")
    jobid = c.sbatch(script)
    res = c.wait_job(jobid, timeout=60)
    assert (res.state, res.exit_code) == ("COMPLETED", "0:0"), out.read_text()
    text = out.read_text()
    bb = f"{c.bb_job_dir}/{jobid}/striped/"
    assert f"STRIPED={bb}\n" in text
    assert f"STEP_STRIPED={bb}\n" in text
    for s in ("dir-a", "dir-b", "single", "list-1", "list-2"):
        assert s in text
    assert (pfs / "out" / "result.txt").read_text() == f"result from {jobid}\n"
    assert (pfs / "result.txt").read_text() == f"result from {jobid}\n"
    assert (pfs / "listout" / "copied.txt").read_text() == f"result from {jobid}\n"
    assert (pfs / "listout" / "in_again" / "sub" / "b.txt").read_text() == "dir-b\n"
    assert (pfs / "out").stat().st_uid == c.uid  # copies ran as the job user
    events = c.bb_events(jobid)
    assert all(e["status"] == "OK" for e in events), events
    assert _ordered(events, "setup", "data_in", "paths", "pre_run", "post_run",
                    "data_out", "teardown"), events
    assert not (c.bb_job_dir / jobid).exists()
    assert not any(c.bb_job_dir.iterdir()) or all(
        p.name != jobid for p in c.bb_job_dir.iterdir())


@pytest.mark.cluster
def test_private_access_mode_exports_both_paths(slurm_cluster):
    c = slurm_cluster
    out = c.workdir / "job.out"
    script = c.write("job.sh", f"""#!/bin/bash
#SBATCH -o {out}
#DW jobdw capacity=1GiB access_mode=striped,private type=scratch
echo "S=$DW_JOB_STRIPED"
echo "P=$DW_JOB_PRIVATE"
touch "$DW_JOB_PRIVATE/x" && echo private-writable
stat -c %U:%a "$DW_JOB_STRIPED"
""")
    jobid = c.sbatch(script)
    assert c.wait_job(jobid).state == "COMPLETED"
    text = out.read_text()
    assert f"S={c.bb_job_dir}/{jobid}/striped/" in text
    assert f"P={c.bb_job_dir}/{jobid}/private/" in text
    assert "private-writable" in text
    assert f"{c.user}:700" in text


@pytest.mark.cluster
def test_capacity_is_accounted(slurm_cluster):
    """Two jobs that each need 60 of the 100 GiB pool run one after the other."""
    c = slurm_cluster
    assert c.pool_bytes == 100 * 1024**3
    c.wait_pool_idle()  # UsedSpace below counts every job's space, not only these two
    marks = c.workdir / "marks"
    script = c.write("big.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
#DW jobdw capacity=60GiB access_mode=striped type=scratch
echo "start $SLURM_JOB_ID $(date +%s.%N)" >> {marks}
sleep 2
echo "end $SLURM_JOB_ID $(date +%s.%N)" >> {marks}
""")
    j1 = c.sbatch(script)
    j2 = c.sbatch(script)
    # both pend with BurstBufferResources until the first one's setup; then
    # the first holds 60 GiB and the second keeps waiting for space
    c.wait_until(lambda: c.scontrol_job(j1).get("JobState") == "RUNNING", timeout=20,
                 what=f"job {j1} running")
    assert c.pool_status().get("UsedSpace") == "60GiB", c.pool_status()
    assert "BurstBufferResources" in c.squeue_reason(j2)
    assert c.scontrol_job(j2).get("JobState") == "PENDING"
    assert c.wait_job(j1).state == "COMPLETED"
    assert c.wait_job(j2).state == "COMPLETED"
    t = {}
    for line in marks.read_text().splitlines():
        kind, jid, ts = line.split()
        t[(kind, jid)] = float(ts)
    assert t[("start", j2)] >= t[("end", j1)], t


@pytest.mark.cluster
def test_missing_stage_in_source_holds_job(slurm_cluster):
    c = slurm_cluster
    missing = c.pfs / "does-not-exist.dat"
    script = c.write("job.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
{JOBDW}
#DW stage_in source={missing} destination=$DW_JOB_STRIPED/x type=file
echo should-not-run
""")
    jobid = c.sbatch(script)
    try:
        reason = c.wait_until(
            lambda: (lambda r: r if "slurm_bb_data_in" in r else None)(c.squeue_reason(jobid)),
            timeout=30, what="stage-in failure reason")
        assert str(missing) in reason
        assert "does not exist" in reason
        info = c.scontrol_job(jobid)
        assert info["JobState"] == "PENDING"
        assert info["Priority"] == "0"  # held
        events = c.bb_events(jobid)
        assert any(e["function"] == "data_in" and e["status"] == "FAIL" for e in events)
        # Flags=TeardownFailure: the buffer is torn down at once
        c.wait_until(lambda: any(e["function"] == "teardown" for e in c.bb_events(jobid)),
                     timeout=15, what="teardown after failed stage-in")
        assert not (c.bb_job_dir / jobid).exists()
    finally:
        c.scancel(jobid)
    assert c.wait_job(jobid).state.startswith("CANCELLED")


@pytest.mark.cluster
def test_stage_in_larger_than_capacity_fails(slurm_cluster):
    """The emulator compares `du -sb` of the buffer with the requested size."""
    c = slurm_cluster
    big = c.pfs / "big.dat"
    subprocess.run(["truncate", "-s", "2G", str(big)], check=True)  # sparse
    c.chown(big)
    script = c.write("job.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
#DW jobdw capacity=1GiB access_mode=striped type=scratch
#DW stage_in source={big} destination=$DW_JOB_STRIPED/big.dat type=file
true
""")
    jobid = c.sbatch(script)
    try:
        reason = c.wait_until(
            lambda: (lambda r: r if "slurm_bb_data_in" in r else None)(c.squeue_reason(jobid)),
            timeout=60, what="capacity failure")
        assert "exceeds the burst buffer capacity" in reason
    finally:
        c.scancel(jobid)
    c.wait_job(jobid)


@pytest.mark.cluster
@pytest.mark.parametrize("directives,message", [
    (["#DW jobdw capacity=3.5TB access_mode=striped type=scratch"],
     "capacity=3.5TB is not an integer"),
    ([JOBDW, "#DW frobnicate x=1"], "unrecognized directive '#DW frobnicate x=1'"),
    (["#DW stage_in source=/a destination=$DW_JOB_STRIPED/a type=file"],
     "needs a '#DW jobdw' or '#DW persistentdw' line"),
    ([JOBDW, "#DW stage_in source=rel/a destination=$DW_JOB_STRIPED/a type=file"],
     "must be an absolute path"),
    (["#DW jobdw capacity=10GB access_mode=striped"], "needs type=scratch or type=cache"),
])
def test_invalid_directive_rejected_at_submit(slurm_cluster, directives, message):
    c = slurm_cluster
    script = c.write("bad.sh", "#!/bin/bash\n" + "\n".join(directives) + "\ntrue\n")
    proc = c.sbatch_raw(script)
    assert proc.returncode == 1
    assert f"sbatch: error: burst_buffer/lua: {message}" in proc.stderr or \
        message in proc.stderr, proc.stderr
    assert "Burst Buffer request invalid" in proc.stderr


@pytest.mark.cluster
def test_persistent_buffer_create_use_destroy(slurm_cluster):
    c = slurm_cluster
    name = f"pb{int(time.time() * 1000) % 10**9}"
    pdir = c.bb_persistent_dir / name
    try:
        _persistent_cycle(c, name, pdir)
    finally:
        shutil.rmtree(pdir, ignore_errors=True)


def _persistent_cycle(c, name: str, pdir: Path) -> None:
    out = c.workdir / "out"
    create = c.write("create.sh", f"""#!/bin/bash
#SBATCH -o {out}.1
#BB create_persistent name={name} capacity=20GB access_mode=striped type=scratch
#DW persistentdw name={name}
#DW stage_out source=$DW_PERSISTENT_STRIPED_{name}/data.txt destination={c.pfs}/copy_%j type=file
echo "P=$DW_PERSISTENT_STRIPED_{name}"
echo kept > "$DW_PERSISTENT_STRIPED_{name}/data.txt"
""")
    j1 = c.sbatch(create)
    assert c.wait_job(j1).state == "COMPLETED", out.with_suffix(".1").read_text()
    assert f"P={pdir}/" in Path(f"{out}.1").read_text()
    assert (pdir / "data.txt").read_text() == "kept\n"
    # '%j' makes Slurm hand setup a copy with only the #DW lines: the emulator
    # then reads the #BB lines from the original script in StateSaveLocation
    assert (c.pfs / f"copy_{j1}").read_text() == "kept\n"

    use = c.write("use.sh", f"""#!/bin/bash
#SBATCH -o {out}.2
#DW persistentdw name={name}
#BB destroy_persistent name={name}
cat "$DW_PERSISTENT_STRIPED_{name}/data.txt"
""")
    j2 = c.sbatch(use)
    assert c.wait_job(j2).state == "COMPLETED"
    assert Path(f"{out}.2").read_text() == "kept\n"
    c.wait_until(lambda: not pdir.exists(), timeout=10, what="persistent buffer removal")
    assert any(e["function"] == "destroy_persistent" for e in c.bb_events(j2))

    again = c.write("again.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
#DW persistentdw name={name}
true
""")
    j3 = c.sbatch(again)
    try:
        reason = c.wait_until(
            lambda: (lambda r: r if "slurm_bb_setup" in r else None)(c.squeue_reason(j3)),
            timeout=30, what="setup failure for a destroyed persistent buffer")
        assert f"persistent burst buffer '{name}' does not exist" in reason
    finally:
        c.scancel(j3)
    c.wait_job(j3)


@pytest.mark.cluster
def test_array_throttle_and_symbol_substitution(slurm_cluster):
    c = slurm_cluster
    pfs = c.pfs
    marks = c.workdir / "marks"
    script = c.write("array.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
#SBATCH --array=0-3%2
{JOBDW}
#DW stage_out source=$DW_JOB_STRIPED/out destination={pfs}/out_%A_%a type=directory
echo "start $SLURM_ARRAY_TASK_ID $(date +%s.%N)" >> {marks}
mkdir -p "$DW_JOB_STRIPED/out"
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID" > "$DW_JOB_STRIPED/out/t.txt"
sleep 1
echo "end $SLURM_ARRAY_TASK_ID $(date +%s.%N)" >> {marks}
""")
    array_id = c.sbatch(script)
    res = c.wait_job(array_id, timeout=90)
    assert res.state == "COMPLETED", res.records
    if c.accounting == "slurmdbd":  # jobcomp/filetxt lists one task per array id
        assert sorted(r["JobID"] for r in res.records) == [f"{array_id}_{i}" for i in range(4)]
    for i in range(4):
        assert (pfs / f"out_{array_id}_{i}" / "t.txt").read_text() == \
            f"task {i} of {array_id}\n"
    spans = {}
    for line in marks.read_text().splitlines():
        kind, task, ts = line.split()
        spans.setdefault(task, {})[kind] = float(ts)
    assert len(spans) == 4
    for s in spans.values():
        running = sum(1 for o in spans.values() if o["start"] <= s["start"] < o["end"])
        assert running <= 2, spans


@pytest.mark.cluster
def test_stage_out_runs_after_nonzero_exit(slurm_cluster):
    c = slurm_cluster
    pfs = c.pfs
    script = c.write("fail.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
{JOBDW}
#DW stage_out source=$DW_JOB_STRIPED/partial.txt destination={pfs}/partial.txt type=file
echo "written before failing" > "$DW_JOB_STRIPED/partial.txt"
exit 3
""")
    jobid = c.sbatch(script)
    res = c.wait_job(jobid)
    assert (res.state, res.exit_code) == ("FAILED", "3:0")
    c.wait_until(lambda: any(e["function"] == "teardown" for e in c.bb_events(jobid)),
                 timeout=15, what="teardown")
    assert (pfs / "partial.txt").read_text() == "written before failing\n"
    assert _ordered(c.bb_events(jobid), "post_run", "data_out", "teardown")


@pytest.mark.cluster
def test_bbstat_lists_emulator_status(slurm_cluster):
    p = slurm_cluster.run(["scontrol", "show", "bbstat"])
    assert p.returncode == 0, p.stderr
    assert "DataWarp emulator" in p.stdout
    assert "wlm_pool size=100GiB granularity=1GiB" in p.stdout


@pytest.mark.cluster
def test_stage_out_runs_after_scancel_of_running_job(slurm_cluster):
    c = slurm_cluster
    pfs = c.pfs
    ready = c.workdir / "ready"
    script = c.write("long.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
{JOBDW}
#DW stage_out source=$DW_JOB_STRIPED/o.txt destination={pfs}/o.txt type=file
echo before-cancel > "$DW_JOB_STRIPED/o.txt"
touch {ready}
sleep 120
""")
    jobid = c.sbatch(script)
    c.wait_until(ready.exists, timeout=30, what="job running")
    c.scancel(jobid)
    assert c.wait_job(jobid).state.startswith("CANCELLED")
    c.wait_until(lambda: any(e["function"] == "teardown" for e in c.bb_events(jobid)),
                 timeout=15, what="teardown")
    assert (pfs / "o.txt").read_text() == "before-cancel\n"


@pytest.mark.cluster
def test_release_retries_failed_stage_in(slurm_cluster):
    c = slurm_cluster
    pfs = c.pfs
    late = pfs / "late.txt"
    out = c.workdir / "late.out"
    script = c.write("late.sh", f"""#!/bin/bash
#SBATCH -o {out}
{JOBDW}
#DW stage_in source={late} destination=$DW_JOB_STRIPED/late.txt type=file
cat "$DW_JOB_STRIPED/late.txt"
""")
    jobid = c.sbatch(script)
    c.wait_until(lambda: "slurm_bb_data_in" in c.squeue_reason(jobid), timeout=30,
                 what="stage-in failure")
    late.write_text("arrived late\n")
    c.chown(late)
    assert c.run(["scontrol", "release", jobid]).returncode == 0
    res = c.wait_job(jobid, timeout=60)
    assert res.state == "COMPLETED"
    assert out.read_text() == "arrived late\n"
    funcs = [e["function"] for e in c.bb_events(jobid)]
    assert funcs.count("setup") == 2 and funcs.count("data_in") == 2
