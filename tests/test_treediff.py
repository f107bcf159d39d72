"""`plan --diff` of large files in bounded memory: the same hunks as a whole-file diff, with the
lines' true numbers; a change too large to print is described, not printed."""

from __future__ import annotations

import difflib
import random

import pytest

from hpcrun.render import treediff


def _whole(a, b, rel):
    return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}", n=treediff.CONTEXT))


@pytest.mark.parametrize("edits", [
    [("change", 0)], [("change", 4999)], [("change", 100), ("change", 2500), ("insert", 4000)],
    [("delete", 7), ("insert", 8), ("change", 4990)], [("append", None)],
])
def test_large_files_give_the_whole_diff(tmp_path, monkeypatch, edits):
    monkeypatch.setattr(treediff, "WHOLE_BYTES", 0)      # every file takes the streamed way
    monkeypatch.setattr(treediff, "_BLOCK", 64)          # several blocks in 5000 lines
    rng = random.Random(3)
    old = [f"{k}\t/data/raw/f{rng.randrange(10**9):09d}.raw\t{rng.randrange(100)}\n" for k in range(5000)]
    new = list(old)
    for kind, at in sorted(edits, key=lambda e: -(e[1] or 10**9)):
        if kind == "change":
            new[at] = "changed " + new[at]
        elif kind == "insert":
            new.insert(at, "inserted\n")
        elif kind == "delete":
            del new[at]
        else:
            new.append("appended\n")
    (tmp_path / "a").write_text("".join(old))
    (tmp_path / "b").write_text("".join(new))
    got = "".join(treediff.diff_file(tmp_path / "a", tmp_path / "b", "tasks.tsv"))
    assert got and got == _whole("".join(old), "".join(new), "tasks.tsv")


def test_added_removed_and_equal_large_files(tmp_path, monkeypatch):
    monkeypatch.setattr(treediff, "WHOLE_BYTES", 0)
    text = "".join(f"line {k}\n" for k in range(300))
    (tmp_path / "a").write_text(text)
    (tmp_path / "b").write_text(text)
    assert list(treediff.diff_file(tmp_path / "a", tmp_path / "b", "x")) == []
    added = "".join(treediff.diff_file(None, tmp_path / "b", "x"))
    assert added == "".join(difflib.unified_diff([], text.splitlines(keepends=True), fromfile="/dev/null",
                                                 tofile="b/x", n=treediff.CONTEXT))
    removed = "".join(treediff.diff_file(tmp_path / "a", None, "x"))
    assert removed.startswith("--- a/x\n+++ /dev/null\n@@ -1,300 +0,0 @@\n-line 0\n")


def test_a_change_too_large_to_print_is_described(tmp_path, monkeypatch):
    monkeypatch.setattr(treediff, "WHOLE_BYTES", 0)
    monkeypatch.setattr(treediff, "MAX_SHOWN_LINES", 50)
    (tmp_path / "a").write_text("".join(f"{k} old\n" for k in range(1000)))
    (tmp_path / "b").write_text("".join(f"{k} {'new' if 10 <= k < 900 else 'old'}\n" for k in range(1000)))
    got = "".join(treediff.diff_file(tmp_path / "a", tmp_path / "b", "manifest.json"))
    assert got.splitlines()[:3] == ["--- a/manifest.json", "+++ b/manifest.json", "@@ -11,890 +11,890 @@"]
    assert "890 lines of the old file and 890 of the new one differ from line 11 on" in got
    assert "10 new" not in got and len(got) < 400
