"""Polite polling: once a minute by default, never below the site's minimum, backing off while
nothing changes (login nodes are shared; the scheduler is everyone's)."""

from __future__ import annotations

from types import SimpleNamespace

import hpcrun.operate.track as track
from hpcrun.operate.plandir import next_interval, poll_interval


def test_the_interval_defaults_to_a_minute_and_respects_the_site_minimum():
    site = {"submit": {"min_poll_interval": 30}}
    assert poll_interval(site, None) == 60
    assert poll_interval(site, 5) == 30          # raised to the site's minimum
    assert poll_interval(site, 120) == 120
    assert poll_interval({"submit": {}}, 2) == 2   # plans from before the setting


def test_backoff_doubles_up_to_ten_times_and_drops_back_on_a_change():
    seen, current = [], 60.0
    for _ in range(6):
        current = next_interval(60, current, changed=False)
        seen.append(current)
    assert seen == [120, 240, 480, 600, 600, 600]
    assert next_interval(60, 600, changed=True) == 60


def test_watch_sleeps_politely(monkeypatch, tmp_path):
    """Five polls: nothing changes twice, a change, nothing, then nothing is left in flight."""
    changes = iter([0, 0, 3, 0, 1])
    left = iter([2, 2, 1, 1, 0])
    monkeypatch.setattr(track, "read_manifest", lambda *a, **k: {"submit": {"min_poll_interval": 1}})
    monkeypatch.setattr(track, "poll", lambda *a, **k: SimpleNamespace(
        in_flight=next(left), held=0, finalize_in_flight=False, observed=next(changes)))
    sleeps = []
    track.watch(tmp_path, interval=2, sleep=sleeps.append)
    assert sleeps == [4, 8, 2, 4]
