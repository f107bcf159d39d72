"""How jobs read URL inputs: stream or stage, through a cache or not (the site's ``xrootd`` table)."""

from __future__ import annotations

import os
import pwd
from typing import List, Optional, Sequence, Tuple

from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.checks import Checks
from hpcrun.plan.intake.remote import is_url, urls_of
from hpcrun.plan.job.database import node_dir
from hpcrun.plan.values import NodeCachePlan, RemotePlan
from hpcrun.shell import quote


def remote_plan(campaign: Campaign, profile: SiteProfile, paths: Sequence[str], inputs_key: str,
                checks: Checks, notes: List[str]) -> Optional[RemotePlan]:
    """How the jobs read URL inputs, or None when every input is a path.

    A campaign's inputs are all paths or all URLs: staged URLs land in one directory the job
    reads them from, which local paths would then be looked for in too."""
    urls = urls_of(paths)
    if not urls:
        if campaign.jobs.locality == "prefer":
            checks.spec_error(("jobs", "locality"), (
                "locality: prefer sends jobs to the node whose cache holds their root:// inputs; these "
                "inputs are paths, which every node reads alike; use locality: any"))
        return None
    if len(urls) != len(paths):
        local = next(p for p in paths if not is_url(p))
        checks.spec_error(("inputs", inputs_key), (
            f"inputs mix URLs ('{urls[0]}') and paths ('{local}'); a campaign reads either; "
            "give the local files as root:// URLs of a server that exports them, or split the campaign."))
        return None
    x = profile.xrootd
    bb = campaign.burst_buffer
    if bb is not None and bb.stage_inputs:
        checks.spec_error(("burst_buffer", "stage_inputs"), (
            f"'{urls[0]}' is a URL, and #DW stage_in reads only the parallel filesystem; set "
            "stage_inputs: false: with the site's xrootd.access 'stage' jobs copy URL inputs "
            "into the buffer themselves (xrdcp, checksum verified)."))
    if x.access == "stage" and x.stage_dir and campaign.jobs.nodes > 1:
        checks.spec_error(("jobs", "nodes"), (
            f"{campaign.jobs.nodes} nodes per job, but site profile '{profile.name}' stages root:// "
            f"inputs into node-local {x.stage_dir} (xrootd.stage_dir), which chains on other nodes "
            "cannot read; use 1 node per job, or a burst buffer."))
    if x.access == "stream" and campaign.inputs.checksum != "none":
        notes.append("inputs are streamed over XRootD (site xrootd.access: stream): the job does "
                     "not verify their checksums (XRootD verifies nothing on a streamed read).")
    if campaign.jobs.locality == "prefer" and (x.node_cache is None or x.access != "stage"):
        checks.spec_error(("jobs", "locality"), (
            f"locality: prefer needs nodes that keep staged inputs, and site profile '{profile.name}' has "
            f"{'no xrootd.node_cache' if x.node_cache is None else 'xrootd.access: stream'}; use locality: any, "
            "or a profile with xrootd.node_cache and access: stage"))
    mapped = tuple(sorted(x.local_paths.items(), key=lambda kv: -len(kv[0]))) if x.access == "stage" else ()
    _local_notes(profile, urls, mapped, notes)
    return RemotePlan(access=x.access, cache=x.cache, xrdcp=x.xrdcp, retries=x.retries, client_env=client_env(profile),
                      private_stage=x.access == "stage" and x.stage_dir is not None,
                      node_cache=node_cache_plan(profile) if x.access == "stage" else None,
                      local_paths=mapped, parallel=x.parallel_copies)


def local_path_of(url: str, mappings: Sequence[Tuple[str, str]]) -> Optional[str]:
    """The local path a mapping gives a URL (the longest prefix first), or None."""
    for prefix, path in mappings:
        if url.startswith(prefix):
            return path + url[len(prefix):]
    return None


def _local_notes(profile: SiteProfile, urls: Sequence[str], local: Sequence[Tuple[str, str]],
                 notes: List[str]) -> None:
    """How many inputs a mapping covers; a mapped path this host cannot see is a note (nodes may mount
    what a login node does not)."""
    if profile.xrootd.local_paths and profile.xrootd.access != "stage":
        notes.append(f"site profile '{profile.name}' maps URLs to local paths (xrootd.local_paths), used by "
                     "staged reads only; these inputs are streamed (xrootd.access: stream): read through the server.")
        return
    if not local:
        return
    covered = [u for u in urls if local_path_of(u, local) is not None]
    notes.append(f"{len(covered)} of {len(urls)} input(s) are under a local path of the nodes "
                 "(xrootd.local_paths): read in place when size and checksum match, else copied from the server.")
    unseen = sorted({path for _prefix, path in local if not os.path.isdir(path)})
    if unseen and covered:
        notes.append(f"{', '.join(unseen)} (xrootd.local_paths) cannot be seen from this host; the jobs look "
                     "for the files on their nodes and copy them from the server where they are not there.")


def client_env(profile: SiteProfile) -> Tuple[Tuple[str, str], ...]:
    """The XRD_* variables bounding every wait of the XRootD client (jobs' copies in, exports out)."""
    x = profile.xrootd
    return (("XRD_CONNECTIONRETRY", str(x.connection_retry)),
            ("XRD_CONNECTIONWINDOW", str(int(x.connection_window))),
            ("XRD_REQUESTTIMEOUT", str(int(x.request_timeout))))


def node_cache_plan(profile: SiteProfile) -> Optional[NodeCachePlan]:
    """Where each node keeps the user's staged inputs, and the shared index of what each holds."""
    nc = profile.xrootd.node_cache
    if nc is None:
        return None
    where = '"$cache_node"'.join(quote(part) if part else "" for part in nc.path.rstrip("/").split("{node}"))
    return NodeCachePlan(dir_expr=f'{where}/hpcrun.cache."$cache_user"', max_bytes=int(nc.max_size),
                         index=nc.index or cache_index_default(profile))


def cache_index_default(profile: SiteProfile) -> str:
    """~/.hpcrun/node-caches/<cluster or profile> of the planning user (who also runs the jobs)."""
    home = pwd.getpwuid(os.getuid()).pw_dir
    return os.path.join(home, ".hpcrun", "node-caches", profile.scheduler.cluster or profile.name)


def stage_dir_expr(profile: SiteProfile, root_var: Optional[str], work_dir: str) -> str:
    """Shell text of where a job copies its URL inputs: the site's node-local directory, else
    the job's burst buffer, else its work directory (both seen by every node of the job)."""
    x = profile.xrootd
    if x.stage_dir:
        return node_dir(x.stage_dir, "${HPCRUN_JOB_ID:-local}.in")
    if root_var:
        return f'"${{{root_var}%/}}"/in'
    return f"{work_dir}/in"
