"""A second Slurm cluster beside the harness's first, reporting to the same slurmdbd.

Slurm's multi-cluster operation on one host (../shared/reference/teams-and-clusters.md): own
ClusterName, controller port, node names (bet00001...) and state, the first cluster's slurmdbd,
munge and SPANK stub. From the first cluster's SLURM_CONF a user reaches both with ``-M``.
``first_job_id`` lets its job ids overlap the first cluster's on purpose.

    python3 tests/cluster/harness.py twin start [--first-job-id N]
    python3 tests/cluster/harness.py twin stop-controller | start-controller | stop
"""

from __future__ import annotations

import shutil

try:
    from tests.cluster import harness as h
except ImportError:
    import harness as h  # type: ignore[no-redef]

NAME = "beta"
NODES = 2
CTLD_PORT = 16900
SLURMD_PORT = 16901


def layout(first: h.Layout, first_job_id: int | None = None) -> h.Layout:
    """The second cluster's layout, in DIR/beta of the first one."""
    lay = h.Layout(first.dir / NAME, NODES, "slurmdbd")
    lay.cluster = NAME
    lay.ctld_port = CTLD_PORT
    lay.slurmd_port = SLURMD_PORT
    lay.node_prefix = "bet"
    lay.first_job_id = first_job_id
    lay.dbd_layout = first
    lay.work, lay.pfs = first.work, first.pfs       # one shared filesystem, as at a site
    return lay


def _configs(lay: h.Layout, private_munge: bool) -> dict[str, tuple[str, int]]:
    files = h.render_configs(lay, private_munge)
    files.pop("slurmdbd.conf", None)
    files.pop("my.cnf", None)
    return files


def _register(first: h.Layout) -> None:
    """The cluster, its account and users in the shared slurmdbd (for this cluster)."""
    env = h.daemon_env(first)
    for argv in (["sacctmgr", "-i", "add", "cluster", NAME],
                 ["sacctmgr", "-i", "add", "account", h.ACCOUNT, f"Cluster={NAME}",
                  "Description=hpcrun tests", "Organization=hpcrun"],
                 ["sacctmgr", "-i", "add", "user", f"root,{h.TEST_USER}", f"Account={h.ACCOUNT}",
                  f"DefaultAccount={h.ACCOUNT}", f"Cluster={NAME}"]):
        proc = h.run(argv, check=False, env=env)
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 and "Nothing new added" not in text and "already exists" not in text:
            raise h.HarnessError(f"{' '.join(argv)} failed:\n{text}")


def start_controller(lay: h.Layout) -> None:
    h.spawn(lay, "slurmctld", ["/usr/sbin/slurmctld", "-D", "-i"], "slurmctld")
    h.wait_for(lambda: h.slurm_ok(lay, ["scontrol", "ping"]).stdout.count("UP") > 0, 60,
               f"slurmctld of {NAME}", hint=h.tail(lay.logdir / "slurmctld.log"))


def stop_controller(lay: h.Layout) -> None:
    h.kill_wave(lay, ["slurmctld"])


def start(first_dir: str, first_job_id: int | None) -> h.Layout:
    first = h.Layout(first_dir)
    state = h.load_state(first)
    if not h.read_pidfile(first, "slurmdbd"):
        raise h.HarnessError(f"the first cluster in {first_dir} is not running with slurmdbd: start it first")
    lay = layout(first, first_job_id)
    if h.recorded_daemons(lay):
        h.do_stop(lay)
    shutil.rmtree(lay.state, ignore_errors=True)   # a fresh job-id counter (FirstJobId)
    for d in (lay.dir, lay.etc, lay.run, lay.logdir, lay.state, lay.spool, lay.bb, lay.bb / "job",
              lay.bb / "persistent", lay.bb / "meta"):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    (lay.bb / "events.log").touch()
    (lay.logdir / "jobcomp.txt").touch()
    (lay.logdir / "jobcomp.txt").chmod(0o666)
    private_munge = bool(state.get("private_munge"))
    if private_munge:                       # the first cluster's munged
        lay.munge = first.munge
    for name, (content, mode) in _configs(lay, private_munge).items():
        h.write_if_changed(lay.etc / name, content, mode)
    _register(first)
    start_controller(lay)
    for node in lay.node_names:
        (lay.spool / node).mkdir(exist_ok=True)
        h.spawn(lay, f"slurmd-{node}", ["/usr/sbin/slurmd", "-D", "-N", node], "slurmd")
    h.wait_for(lambda: h.nodes_idle(lay), 60, f"nodes of {NAME} to become idle",
               hint=h.tail(lay.logdir / "slurmctld.log"))
    h.wait_for(lambda: h.pool_ready(lay), 60, f"burst buffer pool of {NAME}",
               hint=h.tail(lay.logdir / "slurmctld.log"))
    # the first cluster's users reach this one through slurmdbd (sacctmgr list cluster)
    h.wait_for(lambda: h.slurm_ok(first, ["sinfo", "-M", NAME, "-h", "-o", "%P"]).returncode == 0, 60,
               f"{NAME} reachable with -M from the first cluster's configuration")
    (lay.dir / "nodes").write_text(",".join(lay.node_names) + "\n")
    h.log(f"second cluster {NAME} up (nodes {', '.join(lay.node_names)}, FirstJobId {first_job_id})")
    return lay


def twin_layout(first_dir: str) -> h.Layout:
    lay = layout(h.Layout(first_dir))
    state = h.load_state(h.Layout(first_dir))
    if state.get("private_munge"):
        lay.munge = h.Layout(first_dir).munge
    return lay


def main(args) -> int:
    if args.action == "start":
        start(args.dir, args.first_job_id)
    elif args.action == "stop":
        h.do_stop(twin_layout(args.dir))
    elif args.action == "stop-controller":
        stop_controller(twin_layout(args.dir))
    elif args.action == "start-controller":
        start_controller(twin_layout(args.dir))
    return 0
