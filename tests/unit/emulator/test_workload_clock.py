"""A workload stamped by a real clock: commit timestamps in milliseconds, never backwards."""

from __future__ import annotations

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.workload import DEFAULT_START_MS, Workload


def test_commit_timestamps_follow_the_injected_clock_to_the_millisecond() -> None:
    ticks = iter(range(DEFAULT_START_MS + 10_001, DEFAULT_START_MS + 10_000_000, 7))
    workload = Workload(default_catalogue(), seed=5, clock_ms=lambda: next(ticks))
    events = list(workload.events(200))
    stamps = [change.commit_timestamp for change in workload.log]
    assert len(stamps) == len(events)
    assert stamps == sorted(stamps)
    assert any(s % 1000 for s in stamps), "expected millisecond commit timestamps"
    assert stamps[0] >= DEFAULT_START_MS + 10_001


def test_a_clock_behind_the_workload_never_moves_commits_backwards() -> None:
    workload = Workload(default_catalogue(), seed=5, clock_ms=lambda: 0)
    list(workload.events(50))
    stamps = [change.commit_timestamp for change in workload.log]
    assert set(stamps) == {DEFAULT_START_MS}
    assert workload.now_ms == DEFAULT_START_MS


def test_without_a_clock_timestamps_are_whole_seconds() -> None:
    workload = Workload(default_catalogue(), seed=5)
    list(workload.events(100))
    assert all(
        change.commit_timestamp % 1000 == 0
        for change in workload.log
        if change.change_type != "PLATFORM_EVENT"
    )
