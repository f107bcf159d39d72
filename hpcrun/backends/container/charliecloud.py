"""Charliecloud: ``ch-run`` of an unpacked image directory, with checked bind mounts."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import ClassVar, List, Sequence, Tuple

from hpcrun.backends.container.base import Bind, Runtime, RuntimeProblem, register
from hpcrun.shell import Shell, quote


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/") or root == ""


@register
@dataclass
class Charliecloud(Runtime):
    """Charliecloud ``ch-run`` of an unpacked image directory, launched by the task launcher like any program.

    Facts (Charliecloud 0.31): the image is mounted read-only, so every bind target must
    already exist in it (in a private /tmp tmpfs ch-run creates it; inside another bind, such as
    the host's $TMPDIR that ch-run mounts at /tmp, it must exist on the host, so hpcrun binds the
    host's /tmp there itself); the host environment passes through, but TMPDIR is unset inside, HOME names
    /home/$USER (missing in most images) and ch-run refuses to start without $USER; ch-run
    execs the command (no extra process, signals reach it directly). Every path is bound at
    the same place inside as outside, so HPCRUN_*, DW_* and command arguments need no rewriting.
    """

    name: ClassVar[str] = "charliecloud"
    WRITES_IMAGE: ClassVar[frozenset] = frozenset({"-w", "--write"})
    # variables the job passes into every container; --unset-env must leave them alone
    NEEDED_ENV: ClassVar[Tuple[str, ...]] = (
        "HPCRUN_RUNDIR", "HPCRUN_PLAN_DIR", "HPCRUN_DB_PORT", "HPCRUN_JOB_ID", "DW_JOB_STRIPED", "PATH", "USER")

    @property
    def settings(self):  # type: ignore[no-untyped-def]
        assert self.profile.containers.charliecloud is not None
        return self.profile.containers.charliecloud

    def _site_binds(self) -> List[Bind]:
        out = []
        for i, text in enumerate(self.settings.binds):
            src, _, dst = text.partition(":")
            dst = dst or src
            out.append(Bind(quote(src), quote(dst), path=dst if dst == src else None,
                            origin=("profile", "containers", "charliecloud", "binds", i)))
        return out

    def mounts(self) -> List[Bind]:
        """The binds in ch-run order: site binds, the burst-buffer root, hpcrun's own paths
        (each only when no identity bind before it already contains it), the plan directory."""
        chosen = self._site_binds()
        if not self.settings.private_tmp and not any(b.path == "/" for b in chosen):
            # ch-run would mount the host's $TMPDIR there, under which the paths of the host's
            # /tmp do not exist (and ch-run cannot create mount points inside a bind)
            chosen.insert(0, Bind("/tmp", "/tmp", path="/tmp", origin=(
                "profile", "containers", "charliecloud", "private_tmp")))
        covering = [b.path for b in chosen if b.path]
        root = self.settings.burst_buffer_root
        later: List[Bind] = []
        static: List[Bind] = []
        for b in self.binds:
            if b.origin and b.origin[0] == "bb" and root is not None:
                static.append(Bind(quote(root), quote(root), path=root, origin=(
                    "profile", "containers", "charliecloud", "burst_buffer_root")))
            elif b.path is None:
                later.append(b)          # the plan directory; a burst buffer without a root
            else:
                static.append(b)
        for b in sorted(static, key=lambda x: x.path or ""):
            assert b.path is not None
            if not any(_under(b.path, c) for c in covering):
                chosen.append(b)
                covering.append(b.path)
        return chosen + later

    def _covered(self, path: str) -> bool:
        """True when a bind target already holds ``path`` (or it is under /tmp: the host's /tmp
        bound at /tmp, or with private_tmp a tmpfs, where ch-run creates mount points)."""
        return _under(path, "/tmp") or any(
            b.path is not None and _under(path, b.path) for b in self.mounts())

    def prefix(self) -> Shell:
        s = self.settings
        words: List[str] = [quote(s.command)]
        words += [quote(o) for o in s.options]
        words += [quote(o) for o in self.spec.options]
        if s.private_tmp:
            words.append("--private-tmp")
        for b in self.mounts():
            words += ["-b", f"{b.source}:{b.target}"]
        home = quote(s.home) if s.home else '"$HPCRUN_RUNDIR"'
        words.append(f"--set-env=HOME={home}")
        assert self.spec.image is not None
        words += [quote(self.spec.image), "--"]
        return Shell(" ".join(words))

    def setup_lines(self) -> List[str]:
        s = self.settings
        image = self.spec.image or ""
        where = f"containers.charliecloud at site profile {self.profile.name}"
        lines = [
            "# ch-run refuses to start without USER, and makes the host's TMPDIR the container's",
            "# /tmp (a TMPDIR that does not exist here would stop every container)",
            'export USER="${USER:-$(id -un)}"',
            'if [ -n "${TMPDIR:-}" ] && [ ! -d "$TMPDIR" ]; then',
            '  log "TMPDIR=$TMPDIR does not exist on $(hostname); unsetting it for ch-run"',
            "  unset TMPDIR",
            "fi",
            f"ch_run={quote(s.command)}",
            f"ch_image={quote(image)}",
            'command -v "$ch_run" > /dev/null \\',
            f'  || fail "$EXIT_SETUP" "Charliecloud\'s $ch_run was not found on $(hostname) ({where})"',
            '[ -d "$ch_image" ] \\',
            '  || fail "$EXIT_SETUP" "the Charliecloud image $ch_image is not a directory on '
            '$(hostname); ch-run runs unpacked image directories"',
        ]
        root = s.burst_buffer_root
        for b in self.binds:
            if b.origin and b.origin[0] == "bb" and root:
                var = b.source.strip('"${}')
                lines += [
                    f"ch_bb_root={quote(root.rstrip('/'))}",
                    f'case "${{{var}:-}}" in',
                    '  "$ch_bb_root"/*) ;;',
                    f'  *) fail "$EXIT_SETUP" "the burst buffer {var}=${{{var}:-}} is not under '
                    f'burst_buffer_root $ch_bb_root ({where}), so ch-run cannot bind it" ;;',
                    "esac",
                ]
        plan_dir = next((b for b in self.binds if b.origin == ("plan",)), None)
        if plan_dir is not None:
            roots = sorted({"/tmp"} | {b.path for b in self.mounts() if b.path})
            pattern = "|".join(quote(r.rstrip("/")) + "/*" for r in roots if r != "/")
            lines += [
                "# the plan directory is bound at its own path: the read-only image needs that",
                "# mount point unless a bind above already contains it",
                'case "$HPCRUN_PLAN_DIR" in',
                f"  {pattern}) ;;" if pattern else "  /*) ;;",
                '  *) [ -d "$ch_image$HPCRUN_PLAN_DIR" ] || fail "$EXIT_SETUP" "the Charliecloud image '
                'has no mount point $HPCRUN_PLAN_DIR for the plan directory: create it in the image '
                f'(mkdir -p $ch_image$HPCRUN_PLAN_DIR) or add a site bind containing it ({where})" ;;',
                "esac",
            ]
        return lines

    def problems(self) -> Tuple[List[RuntimeProblem], List[str]]:
        s = self.settings
        found: List[RuntimeProblem] = []
        notes: List[str] = []
        base = ("containers", "charliecloud")
        for where, opts, path in (("profile", s.options, base + ("options",)),
                                  ("spec", self.spec.options, ("container", "options"))):
            for i, opt in enumerate(opts):
                if opt in self.WRITES_IMAGE:
                    found.append(RuntimeProblem(where, path + (i,), (
                        f"'{opt}' mounts the image read-write, but every chain of every job runs "
                        "from the same image at once; write to the outputs or the burst buffer "
                        "instead (they are bound).")))
                if opt.startswith("--unset-env"):
                    glob = opt.partition("=")[2]
                    hit = [n for n in self.NEEDED_ENV + self.task_env if glob and fnmatch.fnmatchcase(n, glob)]
                    if hit:
                        found.append(RuntimeProblem(where, path + (i,), (
                            f"'{opt}' removes {hit[0]}, which hpcrun passes into every container "
                            "(its HPCRUN_*, DW_* and the scheduler's task variables, PATH and USER); unset "
                            "narrower names.")))
        for b in self.binds:
            if b.path and ":" in b.path:
                found.append(RuntimeProblem(*_split(b.origin), (
                    f"'{b.path}' contains ':', which ch-run's -b SRC:DST cannot express.")))
        if any(b.origin and b.origin[0] == "bb" for b in self.binds) and s.burst_buffer_root is None:
            found.append(RuntimeProblem("profile", base, (
                "the campaign uses a burst buffer, whose per-job directory ($DW_JOB_STRIPED) "
                "cannot be a mount point in a read-only Charliecloud image; set "
                "containers.charliecloud.burst_buffer_root to the directory under which the "
                "burst-buffer system mounts job buffers.")))
        image = self.spec.image or ""
        if os.path.exists(image) and not os.path.isdir(image):
            found.append(RuntimeProblem("spec", ("container", "image"), (
                f"'{image}' is a file, but ch-run runs unpacked image directories here; unpack "
                f"it (e.g. ch-convert {image} /path/to/dir) and give the directory.")))
            return found, notes
        if not os.path.isdir(image):
            notes.append(f"Charliecloud image {image} is not visible here, so its mount points "
                         "were not checked; the job checks the image when it starts.")
            return found, notes
        # binds whose targets are not inside an earlier bind need a mount point in the image
        earlier: List[str] = []
        for b in self.mounts():
            if b.path is None and b.origin and b.origin[0] != "profile":
                continue                 # the plan directory: checked by the job itself
            target = b.path or b.target.strip("'")
            if not (_under(target, "/tmp") or any(_under(target, e) for e in earlier)):
                if not os.path.isdir(os.path.join(image, target.lstrip("/"))):
                    found.append(RuntimeProblem(*_split(b.origin), (
                        f"the Charliecloud image {image} has no mount point {target} for binding "
                        f"{target}: ch-run mounts images read-only and cannot create it. Create it "
                        f"when building the image (mkdir -p {os.path.join(image, target.lstrip('/'))}"
                        "), or add a site bind in containers.charliecloud.binds that contains it.")))
            if b.path:
                earlier.append(b.path)
        if s.home and not (self._covered(s.home) or os.path.isdir(os.path.join(image, s.home.lstrip("/")))):
            found.append(RuntimeProblem("profile", base + ("home",), (
                f"HOME {s.home} does not exist in the Charliecloud image {image} and is not "
                "under a bind; choose a directory that exists there (or leave home unset: the "
                "job's run directory).")))
        return found, notes


def _split(origin: Sequence[object]) -> Tuple[str, Tuple[object, ...]]:
    if origin and origin[0] in ("spec", "profile"):
        return str(origin[0]), tuple(origin[1:])
    return "spec", ("container", "image")
