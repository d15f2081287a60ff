"""The commits table summed up per table: what ``sfcdc status`` needs of it.

The table grows by a row per commit, so it is not read into this process: a pure batch
function (:class:`CommitSummary`) reduces each batch where the engine holds it (in this
process, or on Spark executors) to one row per (layer, kind, topic, object, table), and only
those come back to be merged (:func:`read_summary`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.base import LakeEngine
from pipelines.ops.table import OPS_TABLE

__all__ = ["SUMMARY_SCHEMA", "CommitSummary", "Summary", "TableSummary", "read_summary"]

_TS = pa.timestamp("us", tz="UTC")
_KEYS = ("layer", "kind", "topic", "object", "table_name")
SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("layer", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("object", pa.string()),
        pa.field("table_name", pa.string()),
        pa.field("newest_commit_at", _TS),
        pa.field("visible_at", _TS),
        pa.field("events_recent", pa.int64()),
        pa.field("rows_recent", pa.int64()),
        pa.field("count", pa.int64()),
        pa.field("message", pa.string()),
    ]
)
_READ = [*_KEYS, "newest_commit_at", "visible_at", "events", "rows", "message"]


class CommitSummary:
    """Commits-table batches -> one row per (layer, kind, topic, object, table): the latest
    ``newest_commit_at`` and ``visible_at``, the events and rows of commits visible since
    ``since``, how many rows, and (``error`` rows) the latest message."""

    def __init__(self, since: datetime) -> None:
        self.since = since

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            table = pa.Table.from_batches([batch]).select(_READ)
            table = table.set_column(
                table.schema.get_field_index("visible_at"),
                "visible_at",
                pc.cast(table.column("visible_at"), _TS),
            )
            table = table.set_column(
                table.schema.get_field_index("newest_commit_at"),
                "newest_commit_at",
                pc.cast(table.column("newest_commit_at"), _TS),
            )
            recent = pc.greater_equal(table.column("visible_at"), pa.scalar(self.since, _TS))
            recent = pc.fill_null(recent, False)
            zero = pa.scalar(0, pa.int64())
            table = table.append_column(
                "events_recent",
                pc.if_else(recent, pc.cast(table.column("events"), pa.int64()), zero),
            ).append_column(
                "rows_recent", pc.if_else(recent, pc.cast(table.column("rows"), pa.int64()), zero)
            )
            grouped = table.group_by(list(_KEYS), use_threads=False).aggregate(
                [
                    ("newest_commit_at", "max"),
                    ("visible_at", "max"),
                    ("events_recent", "sum"),
                    ("rows_recent", "sum"),
                    ([], "count_all"),
                ]
            )
            latest_error: dict[tuple[Any, ...], tuple[datetime, str | None]] = {}
            errors = table.filter(pc.equal(table.column("kind"), "error"))
            for row in errors.select([*_KEYS, "visible_at", "message"]).to_pylist():
                key = tuple(row[k] for k in _KEYS)
                if key not in latest_error or row["visible_at"] > latest_error[key][0]:
                    latest_error[key] = (row["visible_at"], row["message"])
            messages = [
                latest_error.get(key, (None, None))[1]
                for key in zip(*(grouped.column(k).to_pylist() for k in _KEYS), strict=True)
            ]
            out = pa.table(
                {
                    **{k: grouped.column(k) for k in _KEYS},
                    "newest_commit_at": grouped.column("newest_commit_at_max"),
                    "visible_at": grouped.column("visible_at_max"),
                    "events_recent": grouped.column("events_recent_sum"),
                    "rows_recent": grouped.column("rows_recent_sum"),
                    "count": grouped.column("count_all"),
                    "message": pa.array(messages, pa.string()),
                }
            )
            yield from out.cast(SUMMARY_SCHEMA).to_batches()


@dataclass(frozen=True)
class TableSummary:
    """One (layer, kind, topic, object, table) group of the commits table."""

    layer: str
    kind: str
    topic: str | None
    object: str | None
    table: str | None
    newest_commit_at: datetime | None
    visible_at: datetime | None
    events_recent: int
    rows_recent: int
    count: int
    message: str | None


@dataclass(frozen=True)
class Summary:
    """Every group of the commits table (empty when the table does not exist)."""

    groups: tuple[TableSummary, ...]
    exists: bool = True

    def find(
        self,
        layer: str,
        kind: str,
        *,
        table: str | None = None,
        topic: str | None = None,
        object: str | None = None,
    ) -> list[TableSummary]:
        """The groups of ``layer`` and ``kind`` matching the given table, topic and object."""
        return [
            g
            for g in self.groups
            if g.layer == layer
            and g.kind == kind
            and (table is None or g.table == table)
            and (topic is None or g.topic == topic)
            and (object is None or g.object == object)
        ]


def _aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def read_summary(engine: LakeEngine, *, since: datetime) -> Summary:
    """The commits table of ``engine``'s lake, summed up (``since``: the start of the window
    ``events_recent`` covers)."""
    if not engine.exists(OPS_TABLE):
        return Summary((), exists=False)
    rows = engine.read(OPS_TABLE)
    partial = engine.to_arrow(
        engine.map_batches(rows, CommitSummary(since), arrow_schema_to_spark(SUMMARY_SCHEMA))
    )
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in partial.to_pylist():
        key = tuple(row[k] for k in _KEYS)
        row["newest_commit_at"] = _aware(row["newest_commit_at"])
        row["visible_at"] = _aware(row["visible_at"])
        have = merged.get(key)
        if have is None:
            merged[key] = row
            continue
        for name in ("newest_commit_at", "visible_at"):
            values = [v for v in (have[name], row[name]) if v is not None]
            latest = max(values, default=None)
            if (
                name == "visible_at"
                and row["visible_at"] is not None
                and latest == row["visible_at"]
            ):
                have["message"] = row["message"]
            have[name] = latest
        for name in ("events_recent", "rows_recent", "count"):
            have[name] = (have[name] or 0) + (row[name] or 0)
    return Summary(
        tuple(
            TableSummary(
                layer=r["layer"],
                kind=r["kind"],
                topic=r["topic"],
                object=r["object"],
                table=r["table_name"],
                newest_commit_at=r["newest_commit_at"],
                visible_at=r["visible_at"],
                events_recent=int(r["events_recent"] or 0),
                rows_recent=int(r["rows_recent"] or 0),
                count=int(r["count"] or 0),
                message=r["message"],
            )
            for r in merged.values()
        )
    )
