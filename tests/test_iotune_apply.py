"""--apply edits a profile as text: comments, order and other keys survive; the result validates."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpcrun.errors import InputError
from hpcrun.iotune.apply import apply, block, edit, exact_size
from hpcrun.model.profiles import load_profile

REC = {"transfer": 2**20, "writers": 4, "target": "bb", "bw_mib_mean": 2048.25}
RECOMMENDATION = {"overall": {"operation": "write", "recommended": REC}}


def _mk(indent):
    return block(REC, "write", "2026-01-02T03:04:05Z", "/sweeps/a", indent)


@pytest.mark.parametrize("text", [
    "name: a\n# last comment\n",
    "name: a\niotune:\n    scratch: /x   # keep me\n    # note\nlauncher:\n  command: srun\n",
    "name: a\niotune:\n  recommended:\n    transfer_size: 4MiB\n    # old\n    writers_per_node: 1\n  fio: fio\nx: 1\n",
    "name: a\niotune:\nlauncher: {}\n",
])
def test_edit_keeps_everything_else(text):
    new = edit(text, Path("p.yaml"), _mk)
    old_data, new_data = yaml.safe_load(text), yaml.safe_load(new)
    rec = new_data["iotune"]["recommended"]
    assert rec["transfer_size"] == "1MiB" and rec["writers_per_node"] == 4 and rec["target"] == "bb"
    assert rec["measured"] == "2026-01-02T03:04:05Z"            # quoted: stays text, not a date
    assert list(new_data) == list(old_data) + (["iotune"] if "iotune" not in old_data else [])
    for key, value in old_data.items():
        if key != "iotune":
            assert new_data[key] == value
    for line in text.splitlines():
        if "# old" not in line and not line.strip().startswith(("transfer_size", "writers_per_node", "recommended")):
            assert line in new, line
    assert new.count("recommended:") == 1


def test_flow_style_is_refused():
    with pytest.raises(InputError) as info:
        edit("name: a\niotune: {fio: fio}\n", Path("p.yaml"), _mk)
    assert "flow style" in str(info.value) and "line 2" in str(info.value)


def test_apply_validates_and_replaces_atomically(tmp_path):
    prof = tmp_path / "site.yaml"
    prof.write_text("# site\nextends: local-test\nname: site\n")
    apply(prof, RECOMMENDATION, "2026-01-02T03:04:05Z", "/sweeps/a")
    loaded = load_profile(str(prof)).profile
    assert loaded.iotune.recommended.transfer_size == 2**20
    assert loaded.iotune.recommended.bandwidth_mib_s == 2048.2 or loaded.iotune.recommended.bandwidth_mib_s == 2048.3
    assert prof.read_text().startswith("# site\nextends: local-test\nname: site\n")
    assert [p.name for p in tmp_path.iterdir()] == ["site.yaml"]


def test_apply_leaves_an_invalid_profile_unchanged(tmp_path):
    prof = tmp_path / "site.yaml"
    original = "extends: local-test\nname: site\nmax_array_size: -4\n"
    prof.write_text(original)
    with pytest.raises(InputError) as info:
        apply(prof, RECOMMENDATION, "2026-01-02", "/s")
    assert "left unchanged" in str(info.value) and "max_array_size" in str(info.value)
    assert prof.read_text() == original and [p.name for p in tmp_path.iterdir()] == ["site.yaml"]


def test_apply_without_results_writes_nothing(tmp_path):
    prof = tmp_path / "site.yaml"
    prof.write_text("extends: local-test\nname: site\n")
    with pytest.raises(InputError, match="nothing to recommend"):
        apply(prof, {"overall": None}, "d", "/s")
    with pytest.raises(InputError, match="site profile YAML"):
        apply(tmp_path / "missing.yaml", RECOMMENDATION, "d", "/s")


def test_exact_size():
    assert [exact_size(n) for n in (65536, 2**20, 3 * 2**30, 1000)] == ["64KiB", "1MiB", "3GiB", "1000"]
