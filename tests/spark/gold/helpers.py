"""Assertions shared by the gold tests: projections compared row by row with chispa."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from chispa import assert_basic_rows_equality
from pyspark.sql import DataFrame


def assert_rows(
    actual: DataFrame, columns: Sequence[str], expected: Iterable[Sequence[Any]]
) -> None:
    """``actual`` projected on ``columns`` holds exactly ``expected`` (any row order), typed
    as ``actual``'s columns."""
    projected = actual.select(*columns)
    wanted = actual.sparkSession.createDataFrame([tuple(r) for r in expected], projected.schema)
    # Sorted here rather than with chispa's ignore_row_order, which sorts in Spark (a shuffle
    # per DataFrame per assertion).
    assert_basic_rows_equality(
        sorted(projected.collect(), key=repr), sorted(wanted.collect(), key=repr)
    )
