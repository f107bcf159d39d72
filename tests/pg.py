"""A private PostgreSQL server for the tests: initdb + pg_ctl on 127.0.0.1, trust authentication,
run as an unprivileged user (the server refuses root).

`tests/run-all.sh` starts one for the whole run as the test user and exports its URL in
``HPCRUN_TEST_PG_URL``; without it the ``pg_server`` fixture (tests/conftest.py) starts a
throwaway one. Each test that wants a store gets a database of its own on it
(:func:`fresh_database`), so tests never see each other's campaigns.

    python3 tests/pg.py start DIR [--user USER]    prints the URL; DIR holds data, socket and log
    python3 tests/pg.py stop DIR [--user USER]
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Dict, Optional, Tuple

ROLE = "hpcrun"


def bindir() -> Optional[Path]:
    """Where initdb and pg_ctl are: PATH, else the newest /usr/lib/postgresql/*/bin."""
    candidates = [Path(p).resolve().parent for p in (shutil.which("initdb"), shutil.which("pg_ctl")) if p]
    candidates += sorted((Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
                         key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True)
    for d in candidates:
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    return None


def why_not(user: Optional[str]) -> str:
    """Why no server can be started here ("" when one can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]', part of the [test] extra)"
    if bindir() is None:
        return ("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin; "
                "install them (Debian: apt-get install postgresql; tests/cluster/harness.py install does)")
    if os.geteuid() == 0 and user is None:
        return "running as root with no unprivileged user to run the server as"
    return ""


def user_or_skip() -> Optional[str]:
    """Who runs a test's server; where none can run, the test skips with the reason (fails under
    HPCRUN_REQUIRE_POSTGRES=1, set by tests/run-all.sh)."""
    import pytest
    user = default_user()
    reason = why_not(user)
    if reason:
        if os.environ.get("HPCRUN_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here (HPCRUN_REQUIRE_POSTGRES=1): {reason}")
        pytest.skip(reason)
    return user


def _as(user: Optional[str], base: Path) -> Dict[str, str]:
    """Run as ``user`` (as root), in ``base``: the checkout may be a directory that user cannot enter."""
    return {"cwd": str(base), **({"user": user} if user and os.geteuid() == 0 else {})}


def start(base: Path, user: Optional[str], port: Optional[int] = None) -> str:
    """Start a server with its files in ``base`` (``port``: the one it had, when started again); returns its
    SQLAlchemy URL."""
    bins = bindir()
    assert bins is not None
    base.mkdir(parents=True, exist_ok=True)
    if user and os.geteuid() == 0:
        shutil.chown(base, user)
    data = base / "data"
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    run = dict(check=True, capture_output=True, text=True, timeout=120, **_as(user, base))
    if not (data / "PG_VERSION").exists():
        subprocess.run([str(bins / "initdb"), "-D", str(data), "-U", ROLE, "-A", "trust", "-E", "UTF8",
                        "--no-sync", "--locale=C"], **run)
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={base} -c fsync=off "
            "-c max_connections=200")
    subprocess.run([str(bins / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-w", "-t", "60",
                    "-o", opts, "start"], **run)
    url = f"postgresql+psycopg://{ROLE}@127.0.0.1:{port}/postgres"
    (base / "url").write_text(url + "\n")
    _STARTED[port] = (base, user)
    return url


_STARTED: Dict[int, Tuple[Path, Optional[str]]] = {}   # port -> (directory, user) of servers started here


def restart(url: str) -> None:
    """Restart the server at ``url`` (fast shutdown: every session is dropped), as an outage does."""
    from sqlalchemy.engine import make_url

    port = make_url(url).port or 5432
    base, user = _STARTED.get(port) or (Path(os.environ["HPCRUN_TEST_PG_DIR"]), default_user())
    bins = bindir()
    assert bins is not None
    subprocess.run([str(bins / "pg_ctl"), "-D", str(base / "data"), "-l", str(base / "log"), "-m", "fast", "-w",
                    "-t", "60", "restart"],
                   check=True, capture_output=True, text=True, timeout=120, **_as(user, base))


def halt(url: str) -> None:
    """Stop the server at ``url`` (fast shutdown: every session dropped, nothing lost), as a maintenance does."""
    from sqlalchemy.engine import make_url

    base, user = _STARTED[make_url(url).port or 5432]
    bins = bindir()
    assert bins is not None
    subprocess.run([str(bins / "pg_ctl"), "-D", str(base / "data"), "-m", "fast", "-w", "-t", "60", "stop"],
                   check=True, capture_output=True, text=True, timeout=120, **_as(user, base))


def resume(url: str) -> None:
    """Start the server :func:`halt` stopped again, on the same port."""
    from sqlalchemy.engine import make_url

    port = make_url(url).port or 5432
    base, user = _STARTED[port]
    start(base, user, port)


def standby(primary: str, base: Path, user: Optional[str]) -> str:
    """A streaming-replication standby of the server at ``primary`` (pg_basebackup -R), started in ``base``;
    returns its URL (read-only until :func:`promote`)."""
    from sqlalchemy.engine import make_url

    bins = bindir()
    assert bins is not None
    base.mkdir(parents=True, exist_ok=True)
    if user and os.geteuid() == 0:
        shutil.chown(base, user)
    subprocess.run([str(bins / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(make_url(primary).port), "-U", ROLE,
                    "-D", str(base / "data"), "-R", "-X", "stream", "--no-sync"],
                   check=True, capture_output=True, text=True, timeout=120, **_as(user, base))
    return start(base, user)


def promote(url: str) -> None:
    """The standby at ``url`` made a primary (pg_ctl promote), as a failover does."""
    from sqlalchemy.engine import make_url

    base, user = _STARTED[make_url(url).port or 5432]
    bins = bindir()
    assert bins is not None
    subprocess.run([str(bins / "pg_ctl"), "-D", str(base / "data"), "-w", "-t", "60", "promote"],
                   check=True, capture_output=True, text=True, timeout=120, **_as(user, base))


def stop(base: Path, user: Optional[str]) -> None:
    bins = bindir()
    if bins is None or not (base / "data").exists():
        return
    subprocess.run([str(bins / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop"],
                   capture_output=True, timeout=60, **_as(user, base))


def fresh_database(url: str, prefix: str = "t") -> str:
    """A new, empty database on the server at ``url``; returns its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def default_user() -> Optional[str]:
    """Who runs a throwaway server: ourselves, or as root the test user (else 'postgres')."""
    if os.geteuid() != 0:
        return None
    for name in (os.environ.get("HPCRUN_TEST_USER", "hpcuser"), "postgres"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--user", default=None)
    args = ap.parse_args()
    user = args.user or default_user()
    if args.action == "start":
        reason = why_not(user)
        if reason:
            print(f"pg: {reason}", file=sys.stderr)
            return 1
        print(start(args.dir, user))
    else:
        stop(args.dir, user)
    return 0


if __name__ == "__main__":
    sys.exit(main())
