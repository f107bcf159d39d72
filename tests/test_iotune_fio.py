"""fio: sweep parameters -> command line, and tolerant reading of its JSON."""

from __future__ import annotations

import json

import pytest

from hpcrun.iotune.engines import fio
from hpcrun.iotune.points import DIR, EngineOutputError, Measurement, Point, combine


def _point(**kw):
    base = dict(id="p0001", target="/x", api="posix", nodes=1, writers=4, transfer=65536, block=2**24,
                layout="file-per-process")
    base.update(kw)
    return Point(**base)


def test_mapping_file_per_process_write():
    argv = fio.argv("/usr/bin/fio", _point(), "write", direct=False)
    assert argv[0] == "/usr/bin/fio"
    for opt in ("--rw=write", "--bs=65536", f"--size={2**24}", "--numjobs=4", "--group_reporting",
                "--output-format=json", f"--directory={DIR}", "--end_fsync=1",
                "--filename_format=hpcrun.$jobnum.$filenum"):
        assert opt in argv, opt
    assert not any(a.startswith(("--filename=", "--offset_increment", "--direct=")) for a in argv)


def test_mapping_shared_file_read_direct():
    argv = fio.argv("fio", _point(layout="shared-file", writers=2), "read", direct=True)
    assert "--rw=read" in argv and "--filename=hpcrun.shared" in argv
    assert f"--offset_increment={2**24}" in argv and "--direct=1" in argv
    assert "--end_fsync=1" not in argv and not any(a.startswith("--filename_format") for a in argv)


def _doc(op="write", bw=2**20 * 500, io=2**24, error=0):
    return json.dumps({"fio version": "fio-3.33", "jobs": [
        {"jobname": "hpcrun", "error": error, op: {"bw_bytes": bw, "io_bytes": io, "iops": 8000.0}}]})


def test_parse_good_and_with_leading_warnings():
    m = fio.parse(_doc(), "write")
    assert m.bw_mean == pytest.approx(500.0) and m.iops_mean == 8000.0
    m = fio.parse("fio: some warning\n" + _doc("read", bw=2**20 * 100), "read")
    assert m.bw_mean == pytest.approx(100.0)


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("   \n", "empty"),
    ("fio: engine psync not loadable\n", "no JSON"),
    ('{"fio version": "fio-3.33", "jobs": [{"jobname": "hp', "truncated"),
    ('{"fio version": "fio-3.33"}', "no 'jobs'"),
    (_doc(error=5), "error 5"),
    (_doc("read"), "no write bandwidth"),
    (_doc(io=0), "moved no bytes"),
])
def test_parse_bad_output_is_a_clear_error(text, words):
    with pytest.raises(EngineOutputError) as info:
        fio.parse(text, "write")
    assert words in str(info.value)


def test_combine_repetitions():
    m = combine([Measurement(100, 100, 100, 10, 1, [100]), Measurement(300, 300, 300, 30, 1, [300])])
    assert (m.bw_mean, m.bw_min, m.bw_max, m.reps, m.iops_mean) == (200, 100, 300, 2, 20)


def test_ior_adapter_reads_real_ior_output(tmp_path):
    """The IOR engine adapter over the IOR reader, on a real IOR JSON summary; a truncated one
    becomes that point's error."""
    from hpcrun.iotune.engines import ior as ior_engine
    from hpcrun.iotune.readers.ior_output import parse_file
    from tests.shared_data import shared_data

    src = shared_data("ior/grid") / "ior_hdf5_fpp_n1_t1m_b16m.json"
    run = parse_file(src)
    write = run.op("write")
    assert write is not None
    found, version = ior_engine.parse(src, ["write"])
    assert version.startswith("IOR-") and found["write"].bw_mean == pytest.approx(write.bw_mib_mean)
    assert found["write"].reps == write.reps
    truncated = tmp_path / "p0001.json"
    truncated.write_text(src.read_text()[:200])
    with pytest.raises(EngineOutputError):
        ior_engine.parse(truncated, ["write"])
    if run.op("read") is None:
        with pytest.raises(EngineOutputError, match="no read result"):
            ior_engine.parse(src, ["write", "read"])


