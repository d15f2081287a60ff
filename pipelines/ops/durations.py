"""Commit durations counted into fixed buckets, the shape of a Prometheus histogram.

Landing counts its own commits this way, and its progress snapshots carry the counts, so a
parent process (``sfcdc run --continuous``) can publish a landing child's durations as one
histogram without seeing each commit.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

__all__ = ["COMMIT_SECONDS_BUCKETS", "Durations", "DurationsSnapshot"]

# Upper bounds (seconds) of the buckets; a last one, above every bound, catches the rest.
COMMIT_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


@dataclass(frozen=True)
class DurationsSnapshot:
    """Counts per bucket of :data:`COMMIT_SECONDS_BUCKETS` (not cumulative; one more for
    durations above the last bound) and the sum of the durations."""

    counts: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as a Prometheus histogram has them, ending with ``+Inf``."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*COMMIT_SECONDS_BUCKETS, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class Durations:
    """Thread-safe counts of observed durations."""

    def __init__(self) -> None:
        self._counts = [0] * (len(COMMIT_SECONDS_BUCKETS) + 1)
        self._total = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(COMMIT_SECONDS_BUCKETS, seconds)
        with self._lock:
            self._counts[index] += 1
            self._total += seconds

    def snapshot(self) -> DurationsSnapshot:
        with self._lock:
            return DurationsSnapshot(tuple(self._counts), self._total)
