#!/usr/bin/env python3
"""The Charliecloud image of hpcrun's container tests: build it once, cache it, unpack it.

    image.py build [--dest DIR]   build (or restore from the cache) and unpack; prints DIR
    image.py path  [--dest DIR]   print where the image is unpacked (exit 1 if it is not)
    image.py key                  print the cache key

The image is a Debian minbase (debootstrap) with python3, python3-h5py, mariadb-server and
mariadb-client installed by apt-get in a chroot, an /etc/hosts (ch-run binds none and
mariadb-install-db needs one) and the mount points the tests bind to (a ch-run image is
read-only, so a bind target must already exist in it). Facts and timings:
../shared/reference/charliecloud.md; decisions: docs/decisions/backends.md.

The slimmed image is cached as a tar.zst under $HPCRUN_TEST_CACHE (default
/var/cache/hpcrun-test), named by a key over everything that decides its contents: the
package list, the debootstrap suite and variant, the mount points and this file's own
bytes. A restore is a zstd unpack (about 2 s); a build about 50 s. Runs as root (debootstrap,
chroot); standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve()
SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES = ["python3", "python3-h5py", "mariadb-server", "mariadb-client"]
# Bind targets of the tests (anything under /tmp needs none: ch-run's /tmp is a host
# directory or a tmpfs, both writable). /var/tmp/hpcrun-test is where tests/test_job_charliecloud.py
# keeps its campaign, so that its binds need real mount points in the read-only image.
MOUNT_POINTS = ["/var/tmp/hpcrun-test", "/srv/hpcrun"]
SLIM = ["var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/info",
        "usr/share/locale", "usr/share/mysql/mysql-test", "var/lib/mysql"]
STAMP = "etc/hpcrun-test-image"
HOST_TOOLS = ["debootstrap", "zstd", "ch-run"]


def log(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("HPCRUN_TEST_CACHE") or "/var/cache/hpcrun-test")


def key() -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"suite": SUITE, "variant": VARIANT, "packages": PACKAGES,
                         "mounts": MOUNT_POINTS, "slim": SLIM}, sort_keys=True).encode())
    h.update(HERE.read_bytes())
    return h.hexdigest()[:16]


def archive() -> Path:
    return cache_dir() / f"charliecloud-reco-{key()}.tar.zst"


def default_dest() -> Path:
    cluster = os.environ.get("HPCRUN_TEST_CLUSTER_DIR")
    if cluster:
        return Path(cluster) / "images" / "reco"
    return cache_dir() / "images" / "reco"


def mirror() -> str:
    """The Debian mirror apt uses on this machine (debootstrap must use the same one)."""
    for src in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        uris, suites = None, ""
        for line in src.read_text().splitlines() + [""]:
            if line.startswith("URIs:"):
                uris = line.split(":", 1)[1].split()[0]
            elif line.startswith("Suites:"):
                suites = line.split(":", 1)[1]
            elif not line.strip():
                if uris and SUITE in suites.split() and "security" not in uris:
                    return uris
                uris, suites = None, ""
    for path in (Path("/etc/apt/sources.list"),):
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                    return parts[1]
    return "http://deb.debian.org/debian"


def is_ready(dest: Path) -> bool:
    try:
        return (dest / STAMP).read_text().strip() == key()
    except OSError:
        return False


def missing_tools() -> list:
    return [t for t in HOST_TOOLS if shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]


def _run(argv: list, **kw) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv[:6]))} ... failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def _build_tree(root: Path) -> None:
    t0 = time.monotonic()
    _run(["debootstrap", f"--variant={VARIANT}", SUITE, str(root), mirror()], timeout=900)
    log(f"debootstrap {VARIANT} {SUITE}: {time.monotonic() - t0:.1f}s")
    policy = root / "usr/sbin/policy-rc.d"          # no service starts inside the chroot
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    t1 = time.monotonic()
    script = ("apt-get update -q && apt-get install -y -q --no-install-recommends "
              + " ".join(PACKAGES) + " && apt-get clean")
    _run(["chroot", str(root), "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
          "DEBIAN_FRONTEND=noninteractive", "LANG=C", "sh", "-c", script], timeout=900)
    log(f"chroot apt-get install {' '.join(PACKAGES)}: {time.monotonic() - t1:.1f}s")
    policy.unlink()
    for rel in SLIM:
        target = root / rel
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    for mp in MOUNT_POINTS:
        (root / mp.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / STAMP).write_text(key() + "\n")


def _pack(root: Path, out: Path) -> None:
    t0 = time.monotonic()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-cf", "-", "."],
                               stdout=subprocess.PIPE)
        zst = subprocess.run(["zstd", "-q", "-T0", "-3"], stdin=tar.stdout, stdout=fh)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or zst.returncode != 0:
            tmp.unlink()
            raise RuntimeError("packing the image failed")
    tmp.replace(out)
    log(f"cached {out} ({out.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t0:.1f}s")


def _unpack(src: Path, dest: Path) -> None:
    t0 = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(dest.parent, 0o755)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    zst = subprocess.Popen(["zstd", "-q", "-d", "-c", str(src)], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-C", str(tmp), "--numeric-owner", "-xpf", "-"], stdin=zst.stdout,
                         capture_output=True, text=True)
    assert zst.stdout is not None
    zst.stdout.close()
    if zst.wait() != 0 or tar.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"unpacking {src} failed: {tar.stderr[-500:]}")
    os.chmod(tmp, 0o755)            # readable by the test user; ch-run mounts it read-only
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    log(f"unpacked into {dest} in {time.monotonic() - t0:.1f}s")


def build(dest: Optional[Path] = None) -> Path:
    """The unpacked image at ``dest`` (built or restored as needed). Root only."""
    dest = dest or default_dest()
    if is_ready(dest):
        log(f"{dest} is up to date (key {key()})")
        return dest
    if os.geteuid() != 0:
        raise RuntimeError("building or unpacking the image needs root")
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: run python3 tests/cluster/harness.py install")
    out = archive()
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="build.", dir=out.parent))
        try:
            _build_tree(work / "root")
            _pack(work / "root", out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for old in out.parent.glob("charliecloud-reco-*.tar.zst"):
            if old != out:
                old.unlink()
        log(f"built the image in {time.monotonic() - t0:.1f}s")
    else:
        log(f"restoring from {out}")
    _unpack(out, dest)
    return dest


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["build", "path", "key"])
    ap.add_argument("--dest", type=Path, default=None, help="where to unpack the image")
    args = ap.parse_args(argv)
    if args.command == "key":
        print(key())
        return 0
    dest = args.dest or default_dest()
    if args.command == "path":
        print(dest)
        return 0 if is_ready(dest) else 1
    try:
        print(build(dest))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
