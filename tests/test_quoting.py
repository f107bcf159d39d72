"""Hostile values from YAML must reach programs byte for byte and never run as shell code.

The generated scripts are executed for real with bash (srun replaced by tests/fakes/srun),
so this checks the text bash reads, not just the text we write.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.shell import quote

from .conftest import REPO

HOSTILE = [
    "plain", "with space", "$(touch PWNED)", "`touch PWNED`", "it's", 'say "hi"', "a;touch PWNED",
    "x && touch PWNED", "x | touch PWNED", "> PWNED", "$HOME", "${IFS}", "*", "~", "!event",
    "# not a comment", "back\\slash", "tab\there", "é✓ unicode", "--opt=1", "-", "", "%j %x",
    "{", "}", "'$(touch PWNED)'", "\"$(touch PWNED)\"",
]
MULTILINE = ["two\nlines", "a\n$(touch PWNED)\n", "trailing\n", "x;\n"]


@pytest.mark.parametrize("value", HOSTILE + MULTILINE)
def test_quote_roundtrip_through_bash(value, tmp_path):
    out = subprocess.run(["bash", "-c", f"printf %s {quote(value)}"], capture_output=True,
                         cwd=tmp_path, check=True).stdout.decode()
    assert out == value
    assert not (tmp_path / "PWNED").exists()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=40))
def test_quote_roundtrip_property(value):
    out = subprocess.run(["bash", "-c", f"printf %s {quote(value)}"], capture_output=True,
                         check=True).stdout.decode()
    assert out == value


PRINT_ARGS = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))"]


def _hostile_spec(spec_factory, tmp_path):
    oneline = [v for v in HOSTILE if "\t" not in v]
    env = {f"HOSTILE_{i}": v for i, v in enumerate(oneline)}
    literal_args = [v.replace("{", "{{").replace("}", "}}") for v in HOSTILE + MULTILINE]
    out_dir = tmp_path / "out dir $(touch PWNED) it's"
    return spec_factory({
        "software": {"release": "rel $(touch PWNED) 'x'", "env": env},
        "jobs": {"chains_per_node": 2},
        "chain": {"command": PRINT_ARGS + literal_args + ["{input}", "pre{stem}post", "{nevents}"]},
        "merge": {"command": PRINT_ARGS + ["{output}", "{parts}", "it's $(touch PWNED)"]},
        "outputs": {"location": str(out_dir), "workdir": str(tmp_path / "work `touch PWNED`")},
    }, inputs=1), env, out_dir


def _run_job(plan_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{REPO / 'tests' / 'fakes'}:{os.environ['PATH']}",
               SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="1")
    script = next((plan_dir / "jobs").glob("*.sbatch"))
    return subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_hostile_values_survive_a_real_run(spec_factory, tmp_path):
    spec, env, out_dir = _hostile_spec(spec_factory, tmp_path)
    plan = load_plan(spec)
    plan_dir = write_plan(plan, tmp_path / "plan $(touch PWNED)").out_dir
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _run_job(plan_dir, cwd)
    assert proc.returncode == 0, proc.stderr
    for where in (cwd, tmp_path, plan_dir, REPO):
        assert not (where / "PWNED").exists(), f"injection ran in {where}"
    run = next((plan_dir / "run").glob("*/4242"))
    # each chain got every literal argument back exactly, plus its own input and slice
    input_path = plan.jobs[0].inputs[0].path
    stem = plan.jobs[0].inputs[0].stem
    for chain in (0, 1):
        argv = json.loads((run / "chains" / f"{chain}.log").read_text().splitlines()[-1])
        assert argv[:len(HOSTILE) + len(MULTILINE)] == HOSTILE + MULTILINE
        assert argv[-3:] == [input_path, f"pre{stem}post", "50"]
    merge_argv = json.loads((run / "merge.log").read_text().splitlines()[-1])
    assert merge_argv[0] == str(out_dir / f"{stem}.reco")
    assert merge_argv[-1] == "it's $(touch PWNED)"
    assert merge_argv[1:-1] == [f"{tmp_path}/work `touch PWNED`/test-campaign.00001/{stem}.part{k}"
                                for k in (0, 1)]
    assert (run / "exit_code").read_text().strip() == "0"


def test_hostile_environment_values_exported_exactly(spec_factory, tmp_path):
    spec, env, _ = _hostile_spec(spec_factory, tmp_path)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    text = (plan_dir / "bin" / "hpcrun-job.sh").read_text()   # the steps every job script runs
    exports = "\n".join(line for line in text.splitlines() if line.startswith("export HOSTILE_")
                        or line.startswith("export HPCRUN_RELEASE="))
    probe = exports + "\nenv -0\n"
    out = subprocess.run(["bash", "-c", probe], capture_output=True, cwd=tmp_path, check=True).stdout
    got = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    for key, value in env.items():
        assert got[key] == value
    assert got["HPCRUN_RELEASE"] == "rel $(touch PWNED) 'x'"
    assert not (tmp_path / "PWNED").exists()


def test_sbatch_values_cannot_break_the_directive_block(spec_factory, tmp_path):
    spec = spec_factory({"site": {"extra_sbatch": ["--mail-type=a b $(x)", "--mail-user=me@x.org"]}})
    text = next((write_plan(load_plan(spec), tmp_path / "p").out_dir / "jobs").glob("*")).read_text()
    assert '#SBATCH --mail-type="a b $(x)"' in text
    assert "#SBATCH --mail-user=me@x.org" in text


# ---- regressions: values that reached the job unquoted before quoting became the default ----

def _marker_free(*dirs: Path) -> None:
    for where in dirs:
        hits = [p for p in where.rglob("PWNED*")]
        assert not hits, f"injection ran: {hits}"


@pytest.mark.parametrize("quote_char", ["", '"'])
def test_database_payload_and_server_never_run_as_commands(spec_factory, tmp_path, quote_char):
    """Both values were written unquoted into a double-quoted log line of every job: the
    commands ran on the batch node, and a double quote killed every job with a syntax error."""
    payload = tmp_path / f"payload`touch PWNED-payload`$(touch PWNED-payload2){quote_char}x"
    payload.mkdir()
    (payload / "table.frm").write_bytes(b"x")
    server = f"/usr/sbin/mariadbd$(touch PWNED-server)`touch PWNED-server2`{quote_char}"
    spec = spec_factory({"database": {"payload": str(payload), "server": server, "ready_timeout": "5s"}}, inputs=1)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _run_job(plan_dir, cwd)
    _marker_free(tmp_path)
    # the server does not exist, so the job fails as it should: with exit 5 and a reason that
    # names the server exactly as written (before: a syntax error and no reason file)
    assert proc.returncode == 5, proc.stderr
    run = next((plan_dir / "run").glob("*/4242"))
    assert server in (run / "reason").read_text()
    assert f"payload {payload})" in proc.stderr


def test_spec_file_name_with_a_newline_stays_a_comment(spec_factory, tmp_path):
    """The spec's file name is printed in a header comment; a newline ended the comment."""
    spec = spec_factory(name="camp\ntouch PWNED-name\n$(touch PWNED-name2).yaml", inputs=1)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    script = next((plan_dir / "jobs").glob("*.sbatch"))
    header = [line for line in script.read_text().splitlines() if "Generated from" in line]
    assert header == [f"# Generated from {tmp_path}/camp\\ntouch PWNED-name\\n$(touch PWNED-name2).yaml "
                      "with site profile local-test; re-run `hpcrun plan`"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _run_job(plan_dir, cwd)
    _marker_free(tmp_path)
    assert "touch PWNED" not in proc.stderr or proc.returncode == 0


@pytest.mark.parametrize("value", ["a\nb", "tab\there", "\x01ctl", "x\r\n", "é\n✓"])
def test_quoted_values_are_always_one_line(value):
    assert "\n" not in quote(value) and "\r" not in quote(value)
    out = subprocess.run(["bash", "-c", f"printf %s {quote(value)}"], capture_output=True, check=True).stdout
    assert out.decode() == value


def test_quote_is_the_standard_library_for_printable_text():
    import shlex
    for value in HOSTILE:
        if "\t" not in value:
            assert quote(value) == shlex.quote(value)
