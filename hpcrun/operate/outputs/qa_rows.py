"""The QA rows finished jobs wrote (``run/<job>/<id>/qa.tsv``), read by a status poll.

Each row: stem, events in, events out, verdict, output name, input. The input is how a row finds
its input (stems may come from the path); older five-column rows are found by stem.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Sequence, Set, Tuple

from hpcrun.plan.intake.stems import stem_of
from hpcrun.store.records import ActiveSubmission, QaResult
from hpcrun.store.store import StateStore

LIST_RUN_DIR_ABOVE = 1000   # jobs ended in one poll: above this, one listing of run/ before opening QA files

Ended = Sequence[Tuple[ActiveSubmission, str]]   # (submission, the raw id of the job that ended)


def read_or_empty(path: str) -> str:
    """A small file the job wrote (reason, QA), stripped; "" when it is not there."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def qa_outcomes(store: StateStore, run_dir: str, job_dir: Callable[[ActiveSubmission, str], str],
                ended: Ended) -> List[QaResult]:
    """The QA outcome of each row the finished jobs wrote, tied to the input it names."""
    written = _qa_texts(run_dir, job_dir, ended)
    if not written:
        return []
    inputs = store.submission_inputs([a.id for a, _ in written])
    results = []
    for a, text in written:
        by_path = {path: iid for iid, path in inputs.get(a.id, [])}
        by_stem = {stem_of(path): iid for iid, path in inputs.get(a.id, [])}   # records without the input
        for line in text.splitlines():
            parts = line.split("\t")
            iid = by_path.get(parts[5]) if len(parts) == 6 else by_stem.get(parts[0])
            if len(parts) not in (4, 5, 6) or iid is None:
                continue
            stem, ev_in, ev_out, verdict = parts[:4]
            output = parts[4] if len(parts) >= 5 else stem
            results.append(QaResult(iid, output, verdict == "pass",
                                    int(ev_in) if ev_in.isdigit() else None,
                                    int(ev_out) if ev_out.isdigit() else None, a.id))
    return results


def _qa_texts(run_dir: str, job_dir: Callable[[ActiveSubmission, str], str],
              ended: Ended) -> List[Tuple[ActiveSubmission, str]]:
    """The QA files the finished jobs wrote. When many ended in one poll, one listing of run/ says
    which jobs have a directory at all: a job that never started wrote nothing, and an open of a
    missing file is a metadata call on a parallel filesystem too."""
    present: Optional[Set[str]] = None
    if len(ended) > LIST_RUN_DIR_ABOVE:
        try:
            present = set(os.listdir(run_dir))
        except OSError:
            return []
    out = []
    for a, raw in ended:
        if raw and (present is None or (a.job_name or "?") in present):
            text = read_or_empty(job_dir(a, raw) + "/qa.tsv")
            if text:
                out.append((a, text))
    return out
