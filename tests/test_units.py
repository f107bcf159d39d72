import pytest

from hpcrun.units import (
    UnitError,
    format_binary_suffix,
    format_capacity,
    format_duration,
    parse_duration,
    parse_size,
    round_up,
)


@pytest.mark.parametrize("text,expected", [
    ("500GB", 500 * 10**9), ("2TiB", 2 * 2**40), ("50G", 50 * 2**30), ("1k", 1024),
    ("10 MB", 10 * 10**6), ("3.5TB", 3_500 * 10**9), ("123", 123), (0, 0), (4096, 4096),
    ("1.5GiB", 3 * 2**29),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["3.5XB", "-1GB", "GB", "1.5", "1,5GB", "", True, 1.5, -3, "1e3"])
def test_parse_size_rejects(bad):
    with pytest.raises(UnitError) as exc:
        parse_size(bad)
    assert str(exc.value)


@pytest.mark.parametrize("nbytes,text", [
    (3_500 * 10**9, "3500GB"), (80 * 2**30, "80GiB"), (20 * 10**9, "20GB"), (2**40, "1TiB"),
    (1, "1B"), (10**12, "1TB"), (1536 * 2**20, "1536MiB"),
])
def test_format_capacity_is_exact_integer(nbytes, text):
    assert format_capacity(nbytes) == text
    assert "." not in text
    assert parse_size(text) == nbytes


def test_capacity_roundtrip_many():
    for n in [1, 999, 10**9 + 1, 7 * 2**30, 123456789012]:
        assert parse_size(format_capacity(n)) == n


def test_round_up_to_granularity():
    assert round_up(9 * 10**9, 20 * 10**9) == 20 * 10**9
    assert round_up(20 * 10**9, 20 * 10**9) == 20 * 10**9
    assert round_up(5, 1) == 5


def test_binary_suffix_rounds_up():
    assert format_binary_suffix(50 * 2**30) == "50G"
    assert format_binary_suffix(50 * 2**30 + 1) == "51G"


@pytest.mark.parametrize("text,seconds", [
    ("08:00:00", 28800), ("1-00:00", 86400), ("90s", 90), ("2h", 7200),
    ("10:30", 630), ("2-12", 2 * 86400 + 12 * 3600), ("1.5h", 5400), ("30m", 1800),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["8 hours", "00:61:00", "-5", "", 0, "1:2:3:4", True, 30, "45", 28800])
def test_parse_duration_rejects(bad):
    with pytest.raises(UnitError):
        parse_duration(bad)


def test_format_duration():
    assert format_duration(28800) == "08:00:00"
    assert format_duration(90061) == "1-01:01:01"
