"""XRootD (``root://host[:port]//path``): sizes and checksums asked with ``xrdfs`` at plan time.

One ``xrdfs`` process per server and batch reads its commands (``stat``, ``query checksum``)
on standard input, so 10^4 files cost a few processes, not 2 x 10^4. The client's defaults wait
minutes for a dead server; the environment below bounds each request, and every batch has a
wall-clock limit. A catalog (sizes in the list file, ``inputs.checksum_catalog``) spares the
server entirely, which is what a 10^5-file campaign should use.
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from hpcrun.backends.storage.base import Described, Sender, Storage, StorageError, TransferError, register

_URL = re.compile(r"^root://([A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?)(/[^\s?#]*)$")
_PROMPT = re.compile(r"^\[[^\]]*\] \S* > (stat|query checksum) (\S+)\s*$")
_SIZE = re.compile(r"^Size:\s+([0-9]+)\s*$")
_SUM = re.compile(r"^([a-z0-9]+) ([0-9a-fA-F]+)\s*$")
_UNREACHABLE = ("Connection error", "Connection refused", "Operation expired", "Socket error")


@dataclass(frozen=True)
class Client:
    """How the planner runs the client (from the site profile's ``xrootd`` table)."""
    xrdfs: Sequence[str] = ("xrdfs",)
    request_timeout_s: int = 10
    parallel: int = 4
    batch: int = 2000


def split(url: str) -> Tuple[str, str]:
    """``root://h:p//store/a`` -> (``h:p``, ``/store/a``); the URL must have passed syntax_error."""
    m = _URL.match(url)
    assert m, url
    path = m.group(2)
    return m.group(1), "/" + path.lstrip("/")


@register
class XRootD(Storage):
    scheme = "root"

    def syntax_error(self, url: str) -> Optional[str]:
        if not _URL.match(url):
            return (f"'{url}' is not an XRootD URL hpcrun can read: give root://HOST[:PORT]//ABSOLUTE/PATH "
                    "(no spaces, no '?' options, no user name)")
        return None

    def describe(self, urls: Sequence[str], algo: Optional[str], settings: object) -> Dict[str, Described]:
        client = settings if isinstance(settings, Client) else Client()
        by_server: Dict[str, List[str]] = {}
        for server, path in map(split, urls):
            by_server.setdefault(server, []).append(path)
        work = [(server, paths[i:i + client.batch])
                for server, paths in sorted(by_server.items())
                for i in range(0, len(paths), client.batch)]
        answered: Dict[Tuple[str, str], Described] = {}
        with ThreadPoolExecutor(max_workers=max(1, client.parallel)) as pool:
            for server, answers in pool.map(lambda w: (w[0], _ask(w[0], w[1], algo, client)), work):
                answered.update(((server, path), described) for path, described in answers.items())
        # the caller's spelling of each URL (root://h//a and root://h/a are the same file)
        return {url: answered[split(url)] for url in urls}

    def put(self, local: str, url: str, sender: Sender) -> None:
        put(local, url, sender)

    def stored(self, urls: Sequence[str], sender: Sender) -> Dict[str, Described]:
        return facts(urls, sender)


def _ask(server: str, paths: Sequence[str], algo: Optional[str], client: Client) -> Dict[str, Described]:
    commands = []
    for path in paths:
        commands.append(f"stat {path}\n")
        if algo:
            commands.append(f"query checksum {path}\n")
    env = dict(os.environ, XRD_CONNECTIONRETRY="1", XRD_REQUESTTIMEOUT=str(client.request_timeout_s),
               XRD_STREAMTIMEOUT=str(client.request_timeout_s))
    limit = 3 * client.request_timeout_s + 0.05 * len(paths)
    try:
        done = subprocess.run([*client.xrdfs, f"root://{server}"], input="".join(commands), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=limit, check=False)
    except FileNotFoundError:
        raise StorageError(f"the XRootD client '{client.xrdfs[0]}' is not installed here "
                           "(Debian: apt-get install xrootd-client)") from None
    except subprocess.TimeoutExpired:
        raise StorageError(f"the XRootD server {server} did not answer {len(paths)} stat(s) within "
                           f"{limit:.0f} s") from None
    answers = _parse(done.stdout, algo)
    if paths and all(a.error and any(w in a.error for w in _UNREACHABLE) for a in answers.values()) \
            and len(answers) == len(set(paths)):
        first = next(iter(answers.values())).error
        raise StorageError(f"cannot reach the XRootD server root://{server} ({first}); is it up and is "
                           "the port right? Sizes in the list file and an inputs.checksum_catalog let "
                           "hpcrun plan without asking the server")
    lost = [p for p in paths if p not in answers]
    if lost:
        tail = done.stdout.strip().splitlines()[-1:] or ["no output"]
        raise StorageError(f"xrdfs root://{server} stopped before answering for {lost[0]} "
                           f"(exit {done.returncode}: {tail[0]})")
    return answers


def _parse(text: str, algo: Optional[str]) -> Dict[str, Described]:
    """Each prompt line opens the answer to its command; errors are kept per path."""
    facts: Dict[str, Dict[str, object]] = {}
    current: Optional[Tuple[str, str]] = None
    for line in text.splitlines():
        line = line.replace("\0", "").rstrip()
        m = _PROMPT.match(line)
        if m:
            current = (m.group(1), m.group(2))
            facts.setdefault(current[1], {})
            continue
        if current is None or not line:
            continue
        command, path = current
        f = facts[path]
        if line.startswith("[ERROR]") or line.startswith("[FATAL]"):
            if "[3011]" in line:
                f["missing"] = True
            f.setdefault("error", line.split("] ", 1)[-1].strip())
        elif command == "stat" and _SIZE.match(line):
            f["size"] = int(_SIZE.match(line).group(1))  # type: ignore[union-attr]
        elif command == "query checksum" and _SUM.match(line):
            kind, digits = _SUM.match(line).groups()  # type: ignore[union-attr]
            if algo is None or kind == algo:
                f["checksum"] = f"{kind}:{digits.lower()}"
    out: Dict[str, Described] = {}
    for path, f in facts.items():
        if "size" not in f and "missing" not in f and "error" not in f:
            continue  # the prompt was echoed but nothing came back: treat as not answered
        out[path] = Described(size=f.get("size"), checksum=f.get("checksum"),  # type: ignore[arg-type]
                              missing=bool(f.get("missing")),
                              error=None if "size" in f and not f.get("missing") else f.get("error"))  # type: ignore[arg-type]
    return out


def _client(sender: Sender, argv: Sequence[str], what: str) -> str:
    """Run one client command with the sender's bounded waits; its output, or TransferError."""
    env = dict(os.environ, **dict(sender.env))
    try:
        done = subprocess.run(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=sender.timeout_s, check=False)
    except FileNotFoundError:
        raise TransferError(f"the XRootD client '{argv[0]}' is not installed here "
                            "(Debian: apt-get install xrootd-client)") from None
    except subprocess.TimeoutExpired:
        raise TransferError(f"{what} did not finish within {sender.timeout_s:.0f} s") from None
    if done.returncode != 0:
        said = [ln.strip() for ln in done.stdout.replace("\0", "").splitlines() if ln.strip()]
        raise TransferError(f"{what} failed (exit {done.returncode}): {said[-1] if said else 'no message'}")
    return done.stdout


def put(local: str, url: str, sender: Sender) -> None:
    server, path = split(url)
    part = f"{path}.hpcrun-part"
    _client(sender, [*sender.copy, "--force", "--silent", "--nopbar", "--path", local, f"root://{server}/{part}"],
            f"xrdcp to root://{server}/{part}")
    _client(sender, [*sender.ask, f"root://{server}", "mv", part, path], f"renaming {part} to {path} on {server}")


def facts(urls: Sequence[str], sender: Sender) -> Dict[str, Described]:
    """Size and adler32 of each URL as its server has it now (the destination's own answer)."""
    client = Client(xrdfs=tuple(sender.ask), request_timeout_s=sender.request_timeout_s, parallel=1)
    return XRootD().describe(urls, "adler32", client)
