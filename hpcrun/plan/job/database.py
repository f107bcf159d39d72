"""The per-node database: its payload's size, where each node keeps its copy, and the
server, client and timings the job uses."""

from __future__ import annotations

import os
from typing import Optional, Tuple

from hpcrun.backends.container import Runtime, runtime_for
from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign, DatabaseSpec
from hpcrun.plan.checks import Checks
from hpcrun.plan.job.requests import task_env
from hpcrun.plan.values import DatabasePlan
from hpcrun.shell import quote
from hpcrun.units import format_size

SOCKET_MAX = 107
DB_CACHE_HEADROOM = 1.25  # payload copy + logs + temp tables
JOB_ID, NODE = "${HPCRUN_JOB_ID}", "${HPCRUN_NODE}"  # exported by the scheduler backend's identity lines
# the campaign's key (render: a hash of campaign and plan directory) names its node-local
# directories, so that a job reclaims what earlier jobs of the same campaign left, and nothing else
NODE_KEY = "${HPCRUN_NODE_KEY}"
NODE_DIR_PREFIX = "hpcrun."
JOB_ACCOUNT = "hpcrun"
PASSWORD = "@PASSWORD@"  # the job puts its random password here, in a file only its user can read
# options that would let another user of a shared node into a tcp server
OPEN_DOOR_OPTIONS = ("--skip-grant-tables", "--skip_grant_tables", "--init-file", "--init_file")


def database_and_runtime(campaign: Campaign, profile: SiteProfile,
                         checks: Checks) -> Tuple[Optional[DatabasePlan], Runtime]:
    """The database plan (None without a database) and the container runtime sized for its cache."""
    db = campaign.database
    if db is None:
        return None, runtime_for(campaign.container, profile, **task_env(profile))
    size = _payload_size(db, checks)
    cache_bytes = int(size * DB_CACHE_HEADROOM) + 2**30
    runtime = runtime_for(campaign.container, profile, node_cache_size=cache_bytes, **task_env(profile))
    cache_dir = runtime.node_cache_dir()
    if cache_dir is None:
        cache_dir = _node_local_dir(db, profile, size, cache_bytes, checks)
    else:
        _check_runtime_cache(db, profile, size, cache_bytes, checks)
    if cache_dir is not None:
        _check_socket_length(cache_dir, checks)
    _check_open_doors(db, checks)
    return _database_plan(db, profile, size, cache_dir or "", runtime.node_cache_dir() is None), runtime


def _payload_size(db: DatabaseSpec, checks: Checks) -> int:
    if db.size is not None:
        return db.size
    size = dir_size(db.payload)
    if size is None:
        checks.spec_error(("database", "payload"), (
            f"'{db.payload}' does not exist here, so its size is unknown; give database.size."))
        return 0
    return size


def _node_local_dir(db: DatabaseSpec, profile: SiteProfile, size: int, cache_bytes: int,
                    checks: Checks) -> Optional[str]:
    if profile.node_local is None:
        checks.profile_error(("node_local",), (
            f"the campaign starts a database server, which needs node-local storage, but "
            f"site profile '{profile.name}' has no node_local section."))
        return None
    if cache_bytes > profile.node_local.size:
        checks.spec_error(("database", "size" if db.size else "payload"), (
            f"the payload ({format_size(size)}) plus headroom needs "
            f"{format_size(cache_bytes)} of node-local storage but "
            f"{profile.node_local.path} at '{profile.name}' holds "
            f"{format_size(profile.node_local.size)}."))
    return node_dir(profile.node_local.path, f"{JOB_ID}.{NODE}")


def node_dir(root: str, name: str) -> str:
    """Shell text of one of this campaign's node-local directories under ``root``."""
    return quote(root.rstrip("/") or "/") + f"/{NODE_DIR_PREFIX}{NODE_KEY}.{name}"


def _check_runtime_cache(db: DatabaseSpec, profile: SiteProfile, size: int, cache_bytes: int,
                         checks: Checks) -> None:
    shifter = profile.containers.shifter
    if shifter and shifter.per_node_cache_max and cache_bytes > shifter.per_node_cache_max:
        checks.spec_error(("database", "size" if db.size else "payload"), (
            f"the payload ({format_size(size)}) plus headroom needs a perNodeCache of "
            f"{format_size(cache_bytes)} but '{profile.name}' allows at most "
            f"{format_size(shifter.per_node_cache_max)}."))


def _check_socket_length(cache_dir: str, checks: Checks) -> None:
    worst = cache_dir.replace(JOB_ID, "9" * 10).replace(NODE, "n" * 16).replace(NODE_KEY, "k" * 10)
    worst = worst.replace("'", "")
    if len(worst) + len("/mysqld.sock") > SOCKET_MAX:
        checks.profile_error(("node_local", "path"), (
            f"the DB socket path could reach {len(worst) + 12} characters; servers refuse "
            f"more than {SOCKET_MAX}. Use a shorter node-local path."))


def _check_open_doors(db: DatabaseSpec, checks: Checks) -> None:
    """In tcp mode the server listens on 127.0.0.1, which every user of a shared node reaches:
    the job gives it accounts of its own, and refuses what would bypass or replace them."""
    if db.networking != "tcp":
        return
    for i, option in enumerate(db.options):
        name = option.split("=", 1)[0]
        if name in OPEN_DOOR_OPTIONS:
            checks.spec_error(("database", "options", i), (
                f"'{option}' with networking: tcp would let every user of a shared node into the job's "
                f"database over 127.0.0.1; in tcp mode the job locks the copy's accounts and gives its "
                f"chains a per-job account ({{db_defaults}}: an option file only the job's user can read). "
                f"Remove '{name}', or use networking: socket (a private socket, where "
                f"--skip-grant-tables is safe)."))


def account_sql(engine: str) -> Tuple[str, ...]:
    """SQL the tcp server runs at start (--init-file): lock every account of the node-local
    copy, then create the job's own, with the password the job drew (never in an argv)."""
    users = [f"'{JOB_ACCOUNT}'@'localhost'", f"'{JOB_ACCOUNT}'@'127.0.0.1'"]
    if engine == "mariadb":
        lock = (f"UPDATE mysql.global_priv SET priv = JSON_SET(priv, '$.account_locked', true) "
                f"WHERE User <> '{JOB_ACCOUNT}';")
        create = [f"CREATE OR REPLACE USER {u} IDENTIFIED BY '{PASSWORD}';" for u in users]
    else:
        lock = f"UPDATE mysql.user SET account_locked = 'Y' WHERE User <> '{JOB_ACCOUNT}';"
        create = [f"DROP USER IF EXISTS {', '.join(users)};"] + [
            f"CREATE USER {u} IDENTIFIED BY '{PASSWORD}';" for u in users]
    grants = [f"GRANT ALL PRIVILEGES ON *.* TO {u};" for u in users]
    return (lock, "FLUSH PRIVILEGES;", *create, *grants)


def _database_plan(db: DatabaseSpec, profile: SiteProfile, size: int, cache_dir: str,
                   remove_cache: bool) -> DatabasePlan:
    mariadb = db.engine == "mariadb"
    options = list(db.options)
    if options and options[0].startswith(("--defaults-file", "--defaults-extra-file", "--no-defaults")):
        leading = str(quote(options.pop(0)))
    else:
        leading = "--no-defaults"
    return DatabasePlan(
        server=db.server or ("mariadbd" if mariadb else "mysqld"), client="mariadb" if mariadb else "mysql",
        admin="mariadb-admin" if mariadb else "mysqladmin", payload=db.payload, payload_bytes=size,
        cache_dir=cache_dir, socket=cache_dir + "/mysqld.sock", networking=db.networking,
        options=tuple(options), leading_option=leading, ready_timeout=db.ready_timeout,
        max_restarts=db.restart.max_restarts, backoff=db.restart.backoff, check_query=db.check_query,
        port_base=profile.db_port_base, host="127.0.0.1" if db.networking == "tcp" else "localhost",
        remove_cache=remove_cache, account=JOB_ACCOUNT if db.networking == "tcp" else "",
        account_sql=account_sql(db.engine) if db.networking == "tcp" else (),
        # copying the payload takes time too: allow 1 GB/s at worst 30 MB/s plus the timeout
        wait_seconds=db.ready_timeout + 60 + size // (30 * 10**6))


def dir_size(path: str) -> Optional[int]:
    if os.path.isfile(path):
        return os.path.getsize(path)
    if not os.path.isdir(path):
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total
