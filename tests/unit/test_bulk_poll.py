"""When the Bulk API client reads a query job's state again (``ingest.bulk.poll_pause``), and
in sets of how many records it reads a completed job's results (``ingest.bulk.set_size``)."""

from __future__ import annotations

from itertools import pairwise

import pytest

from ingest.bulk import MIN_SET_RECORDS, OVERLAP_SETS, poll_pause, set_size


def reads_until(finished: float, *, initial: float = 0.1, longest: float = 10.0) -> list[float]:
    """The moments a job's state is read, the last being the first at or after ``finished``."""
    moments = [initial]
    while moments[-1] < finished:
        moments.append(moments[-1] + poll_pause(moments[-1], initial, longest, 0.25))
    return moments


@pytest.mark.parametrize("finished", [0.05, 0.3, 0.82, 1.7, 12.0, 95.0, 600.0])
def test_a_finished_job_is_seen_at_most_a_quarter_of_its_run_time_late(finished: float) -> None:
    seen = reads_until(finished)[-1]
    assert seen - finished <= max(0.1, 0.25 * finished) + 1e-9
    # and never later than the longest pause
    assert seen - finished <= 10.0


def test_the_reads_grow_with_the_logarithm_of_the_run_time() -> None:
    # A minute-long job is read a few dozen times, an hour-long one a few times a minute.
    assert len(reads_until(60.0)) <= 30
    hour = reads_until(3600.0)
    assert len(hour) <= 400
    assert max(b - a for a, b in pairwise(hour)) == pytest.approx(10.0)


def test_the_pauses_start_at_the_initial_one_and_never_go_below_a_hundredth() -> None:
    assert poll_pause(0.0, 0.1, 10.0, 0.25) == pytest.approx(0.1)
    assert poll_pause(0.0, 0.0, 10.0, 0.25) == pytest.approx(0.01)
    assert poll_pause(2.0, 0.1, 10.0, 0.25) == pytest.approx(0.5)
    assert poll_pause(1000.0, 0.1, 10.0, 0.25) == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("records", "size"),
    [
        (100_000, 25_000),  # four sets rather than two of 50,000
        (150_001, 37_501),
        (200_000, 50_000),  # four sets of max_records already
        (1_000_000, 50_000),  # a large job: sets of max_records, as few requests as ever
        (30_000, MIN_SET_RECORDS),  # three sets: none smaller than MIN_SET_RECORDS
        (2_000, MIN_SET_RECORDS),  # one set
        (0, MIN_SET_RECORDS),
        (None, 50_000),  # a count Salesforce did not give: max_records
    ],
)
def test_a_job_is_read_in_at_least_four_sets_of_a_least_the_minimum(
    records: int | None, size: int
) -> None:
    assert set_size(records, 50_000) == size
    if records:
        sets = -(-records // size)
        assert sets >= min(OVERLAP_SETS, -(-records // MIN_SET_RECORDS))


def test_a_set_is_never_larger_than_max_records_nor_smaller_than_asked() -> None:
    assert set_size(100_000, 7) == 7
    assert set_size(100_000, 50_000, 40_000) == 40_000
    assert set_size(100, 50_000, 1) == 25
