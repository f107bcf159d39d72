#!/usr/bin/env python3
"""How `hpcrun plan` scales with the number of input files, against bare Jinja2 rendering.

Usage::

    python3 benchmarks/plan_scale.py [--sizes 1000,10000,100000] [--shapes array,per-job]
                                     [--json] [--repeat R] [--timeout S] [--workdir DIR]
                                     [--plan-only] [--keep] [--profile DIR]

What is generated (in a temporary directory, not timed)
-------------------------------------------------------
For every size N and shape, a campaign spec for the shipped ``local-test`` site profile
(children get ``HPCRUN_PROFILE_PATH=<checkout>/site-profiles``, so this checkout's profile is
found first and a user profile of the same name cannot shadow it) whose inputs come from
``inputs.list_file``: N lines ``PATH SIZE EVENTS`` (1GB, 2000 events each) naming files under
``/hpcrun-bench-nonexistent/`` that do not exist, which is how production plans are made away
from the data (hpcrun takes the sizes from the list and never stats the files).
``files_per_job: 1``, 2 chains per node and a merge command, so there are N jobs.

* shape ``array``: no burst buffer, so the planner packs the N jobs into job arrays: one
  script per ``max_array_size`` (1001 at local-test) jobs, plus ``tasks.tsv`` (N rows).
* shape ``per-job``: ``burst_buffer: {capacity: auto, stage_inputs: true}``, so every job
  needs its own ``#DW stage_in`` line and gets its own script: N scripts.

What is measured (each measurement in a fresh ``python3`` subprocess)
--------------------------------------------------------------------
Every measurement runs in its own child process so its peak memory is its own: the child
reports ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (peak resident set size of the whole
process, interpreter and imports included, about 40 MB before any work) taken right after
the timed work. Children get ``PYTHONPATH=<this checkout>`` so they measure the working tree,
not an installed copy, and ``HPCRUN_TEMPLATE_PATH=""``. Outputs are deleted and ``os.sync()``
is called between measurements (not timed), so one measurement's dirty pages are not flushed
during the next one. Wall time is ``time.perf_counter()``; ``cpu_s`` is
``time.process_time()`` (user + system CPU) over the same region, which is less disturbed by
other load on the machine.

* ``plan``: the full ``hpcrun plan`` through the Python API, from before
  ``hpcrun.plan.load.load_plan(spec)`` to after ``hpcrun.render.plandir.write_plan(plan, out)``
  returns: YAML load, validation, input expansion (reading the list file), planning,
  rendering every file, the directive check, digests, the manifest and the atomic write of
  the plan directory. Imports (pydantic, Jinja2, ...) happen before the timer starts
  (``import_s`` in JSON). Phases, for information: ``load_s`` = load_plan; ``render_s`` =
  ``plandir.render_plan`` (render + directive check + digests + manifest text) and ``io_s`` =
  the rest of write_plan (directories, file writes, chmod, renames, re-reading the
  manifest). They are timed by wrapping module globals of ``hpcrun.render.plandir`` during the
  measurement; if a refactor renames them, the phase shows ``-`` instead of breaking.
  JSON also has ``load_peak_mb`` (peak RSS after load_plan) and per-function ``phases``.
* ``base`` (baseline "same scripts"): a bare Jinja2 loop in a fresh child that renders the
  job-script template hpcrun used (``slurm.sh.j2`` extending ``base.sh.j2`` for local-test,
  loaded from the same search path through ``hpcrun.render.scripts.environment``, so Environment
  settings and the ``q`` filter are hpcrun's own) once for every job script the plan wrote
  (array: ceil(N/1001); per-job: N), each time ``ctx = dict(common); ctx.update(own)``
  as hpcrun does, and writes each text with a plain ``open().write()`` into ``jobs/``.
  The contexts are precomputed: after its measurement the plan child runs
  ``hpcrun.render.files.render_all`` once more with ``jinja2.Template.render`` replaced by a
  recorder and pickles the exact contexts, so the baseline renders byte-identical scripts
  (check: the ``plan_B/script`` and ``base_B/script`` columns). Template compilation is in
  the timed region of both.
* ``perfile`` (baseline "one script per input", array shape only): the same bare loop over
  the contexts of the same campaign planned with ``jobs.array: never`` (recorded in a
  separate, untimed child): N non-array scripts, what a naive one-script-per-file renderer
  would cost, i.e. what the job arrays avoid.

``ratio`` = plan_s / base_s; ``ratio_pf`` = plan_s / perfile_s (array shape). With
``--repeat R`` every measurement runs R times, each in a fresh process, and the fastest run
is reported.

Targets (issue 28), at N = 100000 (``--target-inputs``): the per-job shape at most 1.5x its floor
(the bare loop writing the same scripts) and under 300 MB; the array shape at most 8x its floor
(``floor``: a bare loop reading the list file and writing one task line per input, as tasks.tsv
has them) and under 200 MB; with N = 1000000 among the sizes, the array plan under 300 MB and at
most 1.3x the peak at the target size (flat memory). ``ratio_pf`` (one script per input, issue 2)
and ``files`` (files in the plan directory) are printed for information.
Every target prints PASS or FAIL. The exit
status is 0 whatever the targets say; it is 1 only when a measurement crashed (a measurement
that exceeds ``--timeout`` is reported as TIMEOUT and counts as FAIL).

Output: a table on stdout; with ``--json`` the table goes to stderr and a JSON document to
stdout. ``--profile DIR`` also runs each plan once more under cProfile (a separate run, not
the timed one), writes ``DIR/plan-SHAPE-N.prof`` and prints the top functions to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
PROFILE_DIR = REPO / "site-profiles"
INPUT_ROOT = "/hpcrun-bench-nonexistent/pfs/raw"
OUTPUT_LOCATION = "/hpcrun-bench-nonexistent/out"
FILE_SIZE = "1GB"
FILE_EVENTS = 2000
SHAPES = ("array", "per-job")
# issue 28, at the target size: peak MB per shape, and the time ratio against the shape's floor
# (per-job: the bare loop writing the same scripts; array: reading the list and writing one task
# line per input); a 1M-input array plan under 300 MB and at most 1.3x the 100k peak
TARGET_MB = {"per-job": 300.0, "array": 200.0}
TARGET_RATIO = {"per-job": 1.5, "array": 8.0}
MILLION_MB, MILLION_GROWTH = 300.0, 1.3
COLUMNS = ["shape", "inputs", "scripts", "files", "plan_s", "cpu_s", "load_s", "peak_MB",
           "base_s", "base_MB", "floor_s", "ratio", "perfile_s", "ratio_pf", "plan_B/script",
           "base_B/script"]

# ---------------------------------------------------------------------------------------
# campaign generation (parent process, not timed)

def input_path(i: int) -> str:
    return f"{INPUT_ROOT}/st_physics_{i:07d}.daq"


def make_campaign(root: Path, shape: str, n: int) -> Path:
    import yaml

    d = root / f"{shape}-{n}"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "files.txt", "w", encoding="utf-8") as f:
        f.write("# PATH SIZE EVENTS (these files do not exist)\n")
        f.writelines(f"{input_path(i)} {FILE_SIZE} {FILE_EVENTS}\n" for i in range(n))
    spec: Dict[str, Any] = {
        "name": "bench",
        "site": {"profile": "local-test"},
        "walltime": "00:30:00",
        "inputs": {"list_file": "files.txt"},
        "jobs": {"files_per_job": 1, "chains_per_node": 2},
        "chain": {"command": ["reco", "--in", "{input}", "--out", "{output}",
                              "--events", "{first_event}:{nevents}"]},
        "merge": {"command": ["merge", "{output}", "{parts}"]},
        "outputs": {"location": OUTPUT_LOCATION, "pattern": "{stem}.reco"},
    }
    if shape == "per-job":
        spec["burst_buffer"] = {"capacity": "auto", "stage_inputs": True}
    path = d / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    # the same campaign with a file per job (or per array): the scripts the floor renders
    files = dict(spec, jobs=dict(spec["jobs"], script_files="always"))
    (d / "campaign-files.yaml").write_text(yaml.safe_dump(files, sort_keys=False), encoding="utf-8")
    if shape == "array":  # the same campaign with one script per input, for the per-file baseline
        spec["jobs"] = dict(spec["jobs"], array="never", script_files="always")
        (d / "campaign-perfile.yaml").write_text(yaml.safe_dump(spec, sort_keys=False),
                                                 encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------
# children

def _maxrss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def _dir_stats(path: Path) -> Dict[str, int]:
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(root, name)).st_size
    return {"files": files, "bytes": size}


def capture_contexts(plan: Any, plan_dir: str, path: Path) -> None:
    """Record the exact Jinja2 contexts hpcrun renders its job scripts with (not timed).

    ``hpcrun.render.files.render_all`` runs once more with ``jinja2.Template.render`` replaced by a
    recorder, so the baselines render the very same contexts without this file knowing how
    hpcrun builds them. The first ``len(plan.scripts)`` renders apart from the shared body are the
    job scripts (render_all renders them first, in order). Values shared by all of them (the common context) are
    stored once, the rest per script.
    """
    import pickle

    import jinja2

    from hpcrun.render.files import render_all

    seen: List[tuple] = []
    original = jinja2.Template.render

    def record(self: jinja2.Template, *args: Any, **kwargs: Any) -> str:
        seen.append((self, dict(*args, **kwargs)))
        return ""

    jinja2.Template.render = record  # type: ignore[method-assign]
    try:
        render_all(plan, plan_dir)
    finally:
        jinja2.Template.render = original  # type: ignore[method-assign]
    # the shared body of per-job scripts (bin/hpcrun-job.sh, rendered once) is not a job script
    jobs = [(tpl, ctx) for tpl, ctx in seen if ctx.get("part") != "body"][:len(plan.scripts)]
    names = {t.name for t, _ctx in jobs}
    if len(jobs) != len(plan.scripts) or len(names) != 1:
        raise RuntimeError(f"cannot tell the job-script renders apart: {len(jobs)} renders of "
                           f"{sorted(map(str, names))} for {len(plan.scripts)} scripts")
    template = jobs[0][0]
    first = jobs[0][1]
    common = {k: v for k, v in first.items() if all(ctx.get(k, first) is v for _t, ctx in jobs)}
    scripts = [(f"{s.name}.sbatch", {k: v for k, v in ctx.items() if k not in common})
               for s, (_t, ctx) in zip(plan.scripts, jobs)]
    data = {"searchpath": list(template.environment.loader.searchpath), "template": template.name,
            "common": common, "scripts": scripts}
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)


def child_plan(a: Dict[str, Any]) -> Dict[str, Any]:
    t0 = time.perf_counter()
    import hpcrun
    import hpcrun.render.plandir as plandir
    from hpcrun.plan.load import load_plan
    import_s = time.perf_counter() - t0
    import_mb = _maxrss_mb()

    phases: Dict[str, float] = {}

    def timed(name: str, func: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    # Phases are informative only: wrap whatever of these write_plan calls by module global;
    # a refactor that renames them shows "-" for the phase instead of breaking the benchmark.
    for name in ("render_plan", "_render", "render_all", "_check_rendered", "manifest_text",
                 "manifest", "manifest_json"):
        if callable(getattr(plandir, name, None)):
            setattr(plandir, name, timed(name, getattr(plandir, name)))

    spec, out = Path(a["spec"]), Path(a["out"])
    profiler = None
    if a.get("profile"):
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    c1, t1 = time.process_time(), time.perf_counter()
    plan = load_plan(spec)
    t2 = time.perf_counter()
    load_mb = _maxrss_mb()
    result = plandir.write_plan(plan, out)
    t3, c3 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(a["profile"])
    peak_mb = _maxrss_mb()

    # ---- not measured: what the parent and the baselines need
    render_s = max((phases[k] for k in ("render_plan", "_render") if k in phases), default=None)
    tables = [result.out_dir / "jobs" / t for t in ("headers.tsv", "arrays.tsv")]
    if a.get("contexts") and not any(t.exists() for t in tables):
        capture_contexts(plan, str(result.out_dir), Path(a["contexts"]))   # else from campaign-files.yaml
    jobs_dir = _dir_stats(result.out_dir / "jobs")
    return {
        "seconds": t3 - t1, "cpu_s": c3 - c1, "load_s": t2 - t1, "write_s": t3 - t2,
        "render_s": render_s, "io_s": None if render_s is None else (t3 - t2) - render_s,
        "phases": {k: round(v, 4) for k, v in phases.items()},
        "import_s": import_s, "import_mb": import_mb, "load_peak_mb": load_mb, "peak_mb": peak_mb,
        "jobs": len(plan.jobs), "scripts": len(plan.scripts), "script_bytes": jobs_dir["bytes"],
        "written": _dir_stats(result.out_dir), "files": _dir_stats(result.out_dir)["files"],
        "hpcrun_version": hpcrun.__version__,
    }


def child_capture(a: Dict[str, Any]) -> Dict[str, Any]:
    """Plan the one-script-per-input variant (jobs.array: never) only to record its contexts."""
    from hpcrun.plan.load import load_plan

    plan = load_plan(Path(a["spec"]))
    capture_contexts(plan, a["out"], Path(a["contexts"]))
    return {"seconds": 0.0, "scripts": len(plan.scripts)}


def child_baseline(a: Dict[str, Any]) -> Dict[str, Any]:
    import pickle

    t0 = time.perf_counter()
    from hpcrun.render.scripts import environment
    import_s = time.perf_counter() - t0
    with open(a["contexts"], "rb") as f:          # precomputed contexts, not timed
        data = pickle.load(f)
    common, work = data["common"], data["scripts"]
    import_mb = _maxrss_mb()
    jobs = Path(a["out"]) / "jobs"
    c1, t1 = time.process_time(), time.perf_counter()
    env = environment([Path(p) for p in data["searchpath"]])   # hpcrun's settings and filters
    template = env.get_template(data["template"])
    jobs.mkdir(parents=True)
    nbytes = 0
    render_s = 0.0
    for name, own in work:
        r0 = time.perf_counter()
        ctx = dict(common)
        ctx.update(own)
        text = template.render(ctx)
        render_s += time.perf_counter() - r0
        with open(jobs / name, "wb") as f:
            nbytes += f.write(text.encode("utf-8"))
    seconds, cpu_s = time.perf_counter() - t1, time.process_time() - c1
    return {"seconds": seconds, "cpu_s": cpu_s, "render_s": render_s, "io_s": seconds - render_s,
            "import_s": import_s, "import_mb": import_mb,
            "peak_mb": _maxrss_mb(), "scripts": len(work), "script_bytes": nbytes}


def child_floor(a: Dict[str, Any]) -> Dict[str, Any]:
    """The array shape's floor: read the list file and write one task line per input, as
    tasks.tsv has them (index, job, chains, path, events, stem, output, checksum)."""
    out = Path(a["out"])
    out.mkdir(parents=True)
    c1, t1 = time.process_time(), time.perf_counter()
    n = 0
    with open(a["list"], encoding="utf-8") as src, open(out / "tasks.tsv", "w", encoding="utf-8") as dst:
        for line in src:
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            stem = parts[0].rpartition("/")[2].partition(".")[0]
            dst.write(f"{n}\tbench.{n + 1:06d}\t2\t{parts[0]}\t{parts[2]}\t{stem}\t{stem}.reco\t-\n")
            n += 1
    seconds, cpu_s = time.perf_counter() - t1, time.process_time() - c1
    return {"seconds": seconds, "cpu_s": cpu_s, "peak_mb": _maxrss_mb(), "lines": n}


# ---------------------------------------------------------------------------------------
# parent

def run_child(kind: str, params: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env["HPCRUN_TEMPLATE_PATH"] = ""   # no site template overrides from the caller's shell
    env["HPCRUN_PROFILE_PATH"] = str(PROFILE_DIR)   # searched first: this checkout's local-test
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(params)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": timeout}
    if proc.returncode != 0:
        return {"status": "error", "returncode": proc.returncode, "stderr": proc.stderr[-3000:]}
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["status"] = "ok"
    return data


def _clean(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    for leftover in path.parent.glob(f".{path.name}.hpcrun-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    os.sync()


def measure(kind: str, params: Dict[str, Any], out: Path, repeat: int, timeout: float) -> Dict[str, Any]:
    best: Optional[Dict[str, Any]] = None
    for _ in range(repeat):
        _clean(out)
        res = run_child(kind, dict(params, out=str(out)), timeout)
        if res["status"] != "ok":
            best = res
            break
        if best is None or res["seconds"] < best["seconds"]:
            best = res
    _clean(out)
    assert best is not None
    best["runs"] = repeat
    return best


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_case(root: Path, shape: str, n: int, args: argparse.Namespace) -> Dict[str, Any]:
    spec = make_campaign(root, shape, n)
    d = spec.parent
    ctx_file = d / "contexts.pickle"
    log(f"[{shape} N={n}] plan ...")
    plan = measure("plan", {"spec": str(spec), "contexts": str(ctx_file)}, d / "plan", args.repeat,
                   args.timeout)
    row: Dict[str, Any] = {"shape": shape, "inputs": n, "plan": plan, "baseline_same_scripts": None,
                           "baseline_per_file": None, "floor": None, "ratio": None, "ratio_per_file": None}
    if plan["status"] != "ok":
        log(f"[{shape} N={n}] plan {plan['status'].upper()}")
        return row
    log(f"[{shape} N={n}] plan {plan['seconds']:.2f} s, {plan['peak_mb']:.0f} MB")
    if not args.plan_only:
        run_baselines(row, d, ctx_file, args)
    if args.profile:
        run_profile(row, spec, ctx_file, args)
    return row


def run_baselines(row: Dict[str, Any], d: Path, ctx_file: Path, args: argparse.Namespace) -> None:
    shape, n, plan = row["shape"], row["inputs"], row["plan"]
    files = d / "campaign-files.yaml"
    at_submission = plan["scripts"] > 1 and plan["files"] < plan["scripts"]
    if at_submission:   # the plan renders headers at submission: the floor writes every job's script
        cap = run_child("capture", {"spec": str(files), "out": str(d / "plan"), "contexts": str(ctx_file)},
                        args.timeout)
        if cap["status"] != "ok":
            row["baseline_same_scripts"] = cap
            return
    log(f"[{shape} N={n}] baseline (same scripts) ...")
    base = measure("baseline", {"contexts": str(ctx_file)}, d / "base", args.repeat, args.timeout)
    row["baseline_same_scripts"] = base
    if base["status"] == "ok":
        if base["scripts"] != plan["scripts"]:
            log(f"warning: the baseline rendered {base['scripts']} scripts, the plan wrote "
                f"{plan['scripts']}")
        if shape == "per-job":
            row["ratio"] = plan["seconds"] / base["seconds"] if base["seconds"] > 0 else None
    if shape == "array":
        log(f"[{shape} N={n}] floor (list read, one task line per input) ...")
        floor = measure("floor", {"list": str(d / "files.txt")}, d / "floor", args.repeat, args.timeout)
        row["floor"] = floor
        if floor["status"] == "ok" and floor["seconds"] > 0:
            row["ratio"] = plan["seconds"] / floor["seconds"]
        log(f"[{shape} N={n}] baseline (one script per input) ...")
        pf_ctx = d / "contexts-perfile.pickle"
        pf = run_child("capture", {"spec": str(d / "campaign-perfile.yaml"), "out": str(d / "perfile"),
                                   "contexts": str(pf_ctx)}, args.timeout)
        if pf["status"] == "ok":
            pf = measure("baseline", {"contexts": str(pf_ctx)}, d / "perfile", args.repeat,
                         args.timeout)
        row["baseline_per_file"] = pf
        if pf["status"] == "ok":
            row["ratio_per_file"] = plan["seconds"] / pf["seconds"] if pf["seconds"] > 0 else None


def run_profile(row: Dict[str, Any], spec: Path, ctx_file: Path, args: argparse.Namespace) -> None:
    import io
    import pstats

    shape, n = row["shape"], row["inputs"]
    prof = Path(args.profile).resolve() / f"plan-{shape}-{n}.prof"
    prof.parent.mkdir(parents=True, exist_ok=True)
    log(f"[{shape} N={n}] profiling (separate run) -> {prof}")
    res = measure("plan", {"spec": str(spec), "profile": str(prof)},
                  spec.parent / "plan", 1, args.timeout * 5)
    row["profile"] = {"file": str(prof), "status": res["status"],
                      "seconds_under_profiler": res.get("seconds")}
    if res["status"] == "ok":
        buf = io.StringIO()
        stats = pstats.Stats(str(prof), stream=buf)
        stats.sort_stats("cumulative").print_stats(25)
        stats.sort_stats("tottime").print_stats(15)
        log(buf.getvalue())


def checks(rows: List[Dict[str, Any]], target_inputs: int) -> List[Dict[str, Any]]:
    out = []

    def add(row: Dict[str, Any], what: str, value: Optional[float], limit: float, unit: str) -> None:
        status = "n/a" if value is None else ("PASS" if value <= limit else "FAIL")
        if row["plan"]["status"] == "timeout":
            status = "FAIL"   # slower than --timeout is slower than any target
        elif row["plan"]["status"] != "ok":
            status = "ERROR"
        out.append({"shape": row["shape"], "inputs": row["inputs"], "target": what,
                    "value": value, "limit": limit, "unit": unit, "result": status})

    for row in rows:
        plan = row["plan"]
        ok = plan["status"] == "ok"
        if row["inputs"] == target_inputs:
            add(row, "plan peak RSS", plan["peak_mb"] if ok else None, TARGET_MB[row["shape"]], "MB")
            floor = "the same scripts" if row["shape"] == "per-job" else "list read + task lines"
            add(row, f"ratio plan/floor ({floor})", row["ratio"], TARGET_RATIO[row["shape"]], "x")
    arrays = {r["inputs"]: r["plan"] for r in rows if r["shape"] == "array" and r["plan"]["status"] == "ok"}
    million = next((r for r in rows if r["shape"] == "array" and r["inputs"] == 1_000_000), None)
    if million is not None:
        ok = million["plan"]["status"] == "ok"
        add(million, "plan peak RSS at 1M", million["plan"]["peak_mb"] if ok else None, MILLION_MB, "MB")
        if target_inputs in arrays and ok:
            add(million, f"peak RSS 1M / {target_inputs}", million["plan"]["peak_mb"]
                / arrays[target_inputs]["peak_mb"], MILLION_GROWTH, "x")
    return out


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(rows: List[Dict[str, Any]], results: List[Dict[str, Any]]) -> str:
    lines = []
    body = []
    for r in rows:
        p, b, pf = r["plan"], r["baseline_same_scripts"] or {}, r["baseline_per_file"] or {}
        fl = r.get("floor") or {}
        if p["status"] != "ok":
            body.append([r["shape"], str(r["inputs"]), "-", p["status"].upper()]
                         + ["-"] * (len(COLUMNS) - 4))
            continue
        body.append([
            r["shape"], str(r["inputs"]), str(p["scripts"]), str(p.get("files", "-")), _fmt(p["seconds"]),
            _fmt(p["cpu_s"]), _fmt(p["load_s"]), _fmt(p["peak_mb"], 0),
            _fmt(b.get("seconds"), 3) if b.get("status") == "ok" else (b.get("status") or "-").upper(),
            _fmt(b.get("peak_mb"), 0),
            _fmt(fl.get("seconds"), 3) if fl.get("status") == "ok" else (fl.get("status") or "-").upper(),
            _fmt(r["ratio"], 1),
            _fmt(pf.get("seconds")) if pf.get("status") == "ok" else (pf.get("status") or "-").upper(),
            _fmt(r["ratio_per_file"], 2),
            str(p["script_bytes"] // max(1, p["scripts"])),
            str(b["script_bytes"] // max(1, b["scripts"])) if b.get("status") == "ok" else "-"])
    widths = [max(len(c), *(len(x[i]) for x in body)) if body else len(c) for i, c in enumerate(COLUMNS)]
    lines.append("  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths)))
    lines.extend("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in body)
    lines.append("")
    lines.append("plan_s: wall seconds of load_plan + write_plan (cpu_s: its user+sys CPU seconds; "
                 "load_s: validate/expand/plan); files: files in the plan directory; peak_MB: the plan "
                 "process's peak RSS")
    lines.append("base_s/base_MB: bare Jinja2 loop rendering+writing one script per job "
                 "(per-job: ratio = plan_s / base_s)")
    lines.append("floor_s: reading the list file and writing one task line per input (array: ratio = "
                 "plan_s / floor_s)")
    lines.append("perfile_s: bare Jinja2 loop rendering+writing one script per input (array shape "
                 "only; ratio_pf = plan_s / perfile_s)")
    lines.append("")
    lines.append("targets (issue 28) at the target size: " + "; ".join(
        f"{shape} <= {TARGET_RATIO[shape]:g}x its floor and < {mb:g} MB" for shape, mb in TARGET_MB.items())
        + f"; a 1M-input array < {MILLION_MB:g} MB and <= {MILLION_GROWTH:g}x the peak at the target size")
    for c in results:
        value = "-" if c["value"] is None else f"{c['value']:.2f} {c['unit']}"
        lines.append(f"  [{c['result']}] {c['shape']:<7} N={c['inputs']:<7} {c['target']}: "
                     f"{value} (limit {c['limit']:g} {c['unit']})")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000",
                    help="comma-separated numbers of input files (default 1000,10000,100000)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="array,per-job (default both)")
    ap.add_argument("--json", action="store_true",
                    help="print a JSON document on stdout (the table goes to stderr)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement; the fastest counts")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds before one measurement is given up as TIMEOUT (default 300)")
    ap.add_argument("--target-inputs", type=int, default=100000,
                    help="size at which the time and memory targets are checked (default 100000)")
    ap.add_argument("--workdir", help="where campaigns and plans are written (default: a new "
                                      "temporary directory); the filesystem matters for io_s")
    ap.add_argument("--keep", action="store_true", help="keep the generated campaigns")
    ap.add_argument("--plan-only", action="store_true",
                    help="skip the baselines (quick A/B runs of package changes)")
    ap.add_argument("--profile", metavar="DIR",
                    help="also run each plan under cProfile and write DIR/plan-SHAPE-N.prof")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PARAMS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        kind, params = args.child[0], json.loads(args.child[1])
        child = {"plan": child_plan, "baseline": child_baseline, "capture": child_capture,
                 "floor": child_floor}[kind]
        result = child(params)
        print(json.dumps(result))
        return 0

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"unknown shape '{s}'; choose from {', '.join(SHAPES)}")
    if any(n < 1 for n in sizes) or args.repeat < 1:
        ap.error("sizes and --repeat must be positive")
    if os.path.exists(INPUT_ROOT):
        ap.error(f"{INPUT_ROOT} exists; the benchmark needs input paths that do not exist")

    if args.workdir:
        root = Path(args.workdir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="hpcrun-bench-", dir=root))
    else:
        root = Path(tempfile.mkdtemp(prefix="hpcrun-bench-"))
    rows = []
    try:
        for shape in shapes:
            for n in sizes:
                rows.append(run_case(root, shape, n, args))
    finally:
        if args.keep:
            log(f"campaigns kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    results = checks(rows, args.target_inputs)
    text = table(rows, results)
    meta = {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "workdir": str(root.parent),
            "hpcrun_version": next((r["plan"].get("hpcrun_version") for r in rows
                                    if r["plan"].get("hpcrun_version")), None)}
    header = (f"hpcrun plan scaling: python {meta['python']}, {meta['cpus']} CPUs, "
              f"workdir {meta['workdir']}, repeat {args.repeat}")
    errors = [r for r in rows for k in ("plan", "baseline_same_scripts", "baseline_per_file")
              if r.get(k) and r[k]["status"] == "error"]
    if args.json:
        print(header + "\n" + text, file=sys.stderr)
        doc = {"benchmark": "benchmarks/plan_scale.py", "meta": meta,
               "targets": {"peak_mb": TARGET_MB, "ratio": TARGET_RATIO, "million_mb": MILLION_MB,
                           "million_growth": MILLION_GROWTH, "at_inputs": args.target_inputs},
               "columns": COLUMNS, "results": rows, "checks": results}
        print(json.dumps(doc, indent=1))
    else:
        print(header)
        print(text)
    for r in errors:
        for k in ("plan", "baseline_same_scripts", "baseline_per_file"):
            if r.get(k) and r[k]["status"] == "error":
                log(f"ERROR in {k} {r['shape']} N={r['inputs']}:\n{r[k]['stderr']}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
