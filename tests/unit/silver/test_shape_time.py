"""Time-of-day text from milliseconds, computed on whole columns, as Spark writes it."""

from __future__ import annotations

import pyarrow as pa

from pipelines.silver.shape import _time, _time_text


def test_times_of_day_are_formatted_on_the_whole_column() -> None:
    values = [None, 0, 1, 999, 61_001, 9 * 3_600_000 + 61_001, 86_399_999, 3 * 86_400_000 + 5]
    got = _time(pa.array(values, pa.int64())).to_pylist()
    assert got[:6] == [
        None,
        "00:00:00.000",
        "00:00:00.001",
        "00:00:00.999",
        "00:01:01.001",
        "09:01:01.001",
    ]
    assert got == [None if v is None else _time_text(v) for v in values]


def test_values_outside_a_day_keep_sparks_signs() -> None:
    values = [-1, -3_600_001, 5, None, 2**60]
    got = _time(pa.array(values, pa.int64())).to_pylist()
    assert got == [None if v is None else _time_text(v) for v in values]
    assert _time(pa.array([None, None], pa.int64())).to_pylist() == [None, None]
