"""The newest Salesforce commit time among rows a silver or gold commit writes.

Silver and gold rows carry the event's commit time in a column: ``_cdc_commit_timestamp`` for
change events, ``CreatedDate`` for platform events. :func:`newest_time` asks the engine for
its maximum with a pure batch function, so it runs where the rows are (in this process, or
on Spark executors) and only one small row per batch comes back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.engines.base import LakeEngine, Rows

__all__ = ["CHANGE_EVENT_TIME", "PLATFORM_EVENT_TIME", "NewestTime", "newest_time", "time_column"]

CHANGE_EVENT_TIME = "_cdc_commit_timestamp"
PLATFORM_EVENT_TIME = "CreatedDate"
_OUT = pa.schema([pa.field("newest", pa.timestamp("us", tz="UTC"))])
_OUT_SPARK = T.StructType([T.StructField("newest", T.TimestampType())])


def time_column(columns: Sequence[str], *, change_events: bool) -> str | None:
    """The column of ``columns`` that holds the event's commit time, if there is one."""
    wanted = CHANGE_EVENT_TIME if change_events else PLATFORM_EVENT_TIME
    return wanted if wanted in columns else None


class NewestTime:
    """Batches -> one row per batch holding the maximum of ``column`` (a timestamp)."""

    def __init__(self, column: str) -> None:
        self.column = column

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            values = batch.column(batch.schema.get_field_index(self.column))
            if not pa.types.is_timestamp(values.type):
                continue
            newest = pc.max(values)
            if not newest.is_valid:
                continue
            cast = pa.array([newest.as_py()], _OUT.field("newest").type)
            yield pa.RecordBatch.from_arrays([cast], schema=_OUT)


def newest_time(engine: LakeEngine, rows: Rows, column: str | None) -> datetime | None:
    """The latest value of ``column`` in ``rows`` (``None`` without the column or a value)."""
    if column is None:
        return None
    found = engine.to_arrow(engine.map_batches(rows, NewestTime(column), _OUT_SPARK))
    if found.num_rows == 0:
        return None
    value: datetime | None = pc.max(found.column("newest")).as_py()
    if value is None:
        return None
    if value.tzinfo is None:  # Spark returns session-local naive values as UTC here
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)
