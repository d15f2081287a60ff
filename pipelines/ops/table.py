"""The commits table: one row per landing, silver and gold commit, and one per failure.

``bronze.sfcdc_commits`` sits next to the other bookkeeping tables of the bronze schema
(checkpoints, schema registry). It is what ``sfcdc status`` computes lag and throughput from
and what the Databricks dashboard charts; any SQL tool can read it.

=====================  =========  ============================================================
column                 type       meaning
=====================  =========  ============================================================
``layer``              string     ``bronze``, ``silver`` or ``gold``
``kind``               string     ``commit``; ``caught_up`` (bronze: a keepalive showed nothing
                                  pending beyond what was committed); ``replay_gap``;
                                  ``error`` (the layer's run failed); ``reconcile`` (gold: one
                                  object reconciled; ``events`` records in Salesforce,
                                  ``rows`` drifting records, ``resync_rows`` repaired,
                                  ``message`` the counts by kind)
``topic``              string     the topic (bronze) or the object's topic
``object``             string     the object (silver, gold; null for a topic's bronze rows)
``table_name``         string     the table committed, ``layer.name``
``version``            bigint     its Delta version holding the commit
``events``             bigint     events the commit applied (landed, decoded; gold: record
                                  changes folded, one per record an event names)
``rows``               bigint     rows it wrote (gold: inserted + updated + deleted)
``payload_bytes``      bigint     Avro payload bytes landed (bronze)
``quarantined``        bigint     rows quarantined (silver)
``resync_rows``        bigint     re-sync rows recorded or resolved (gold)
``newest_commit_at``   timestamp  newest Salesforce commit time among the events applied
                                  (CDC ``commitTimestamp``, platform event ``CreatedDate``)
``visible_at``         timestamp  when the commit became visible to readers (``caught_up``:
                                  the keepalive's time; ``error``: when it failed)
``lag_seconds``        double     ``visible_at - newest_commit_at``: how long the newest event
                                  took from Salesforce to this table
``duration_seconds``   double     how long the commit (or the step that made it) took
``message``            string     the error (``error`` rows), the gap (``replay_gap``)
=====================  =========  ============================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import pyarrow as pa

from pipelines.bookkeeping import BookkeepingTable
from pipelines.engines.base import TableRef

__all__ = [
    "COMMITS_BOOKKEEPING",
    "COMMITS_TABLE",
    "OPS_SCHEMA",
    "OPS_TABLE",
    "CommitRecord",
    "RecordKind",
    "records_to_arrow",
    "utc",
]

RecordKind = Literal["commit", "caught_up", "replay_gap", "error", "reconcile"]
# Reserved in the bronze schema (pipelines.bronze.tables), next to the checkpoints.
COMMITS_TABLE = "sfcdc_commits"
OPS_TABLE = TableRef("bronze", COMMITS_TABLE)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# Error messages are stored whole up to this length (they name the stage and the fix).
_MESSAGE_MAX = 2000

OPS_SCHEMA = pa.schema(
    [
        pa.field("layer", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("object", pa.string()),
        pa.field("table_name", pa.string()),
        pa.field("version", pa.int64()),
        pa.field("events", pa.int64()),
        pa.field("rows", pa.int64()),
        pa.field("payload_bytes", pa.int64()),
        pa.field("quarantined", pa.int64()),
        pa.field("resync_rows", pa.int64()),
        pa.field("newest_commit_at", _TIMESTAMP),
        pa.field("visible_at", _TIMESTAMP, nullable=False),
        pa.field("lag_seconds", pa.float64()),
        pa.field("duration_seconds", pa.float64()),
        pa.field("message", pa.string()),
    ]
)
# Every layer records its commits here, so every layer's run creates it (pipelines.bookkeeping):
# empty with ops.commits_table off, so the dashboard and the alerts find it all the same.
COMMITS_BOOKKEEPING = BookkeepingTable(OPS_TABLE, OPS_SCHEMA)


@dataclass(frozen=True)
class CommitRecord:
    """One row of the commits table (see the module docstring for each field)."""

    layer: str
    kind: RecordKind
    visible_at: datetime
    topic: str | None = None
    object: str | None = None
    table: str | None = None
    version: int | None = None
    events: int = 0
    rows: int = 0
    payload_bytes: int | None = None
    quarantined: int = 0
    resync_rows: int = 0
    newest_commit_at: datetime | None = None
    duration_seconds: float | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        if self.visible_at.tzinfo is None:
            raise ValueError(f"visible_at must be timezone-aware (got {self.visible_at!r})")
        if self.newest_commit_at is not None and self.newest_commit_at.tzinfo is None:
            raise ValueError(
                f"newest_commit_at must be timezone-aware (got {self.newest_commit_at!r})"
            )

    @property
    def lag_seconds(self) -> float | None:
        """How long the newest event took from its Salesforce commit to this commit."""
        if self.newest_commit_at is None:
            return None
        return (self.visible_at - self.newest_commit_at).total_seconds()

    def row(self) -> dict[str, Any]:
        """The record as a row of :data:`OPS_SCHEMA`."""
        message = self.message
        if message is not None and len(message) > _MESSAGE_MAX:
            message = message[: _MESSAGE_MAX - 1] + "…"
        return {
            "layer": self.layer,
            "kind": self.kind,
            "topic": self.topic,
            "object": self.object,
            "table_name": self.table,
            "version": self.version,
            "events": self.events,
            "rows": self.rows,
            "payload_bytes": self.payload_bytes,
            "quarantined": self.quarantined,
            "resync_rows": self.resync_rows,
            "newest_commit_at": self.newest_commit_at,
            "visible_at": self.visible_at,
            "lag_seconds": self.lag_seconds,
            "duration_seconds": self.duration_seconds,
            "message": message,
        }


def records_to_arrow(records: Iterable[CommitRecord]) -> pa.Table:
    """``records`` as rows of the commits table."""
    return pa.Table.from_pylist([r.row() for r in records], schema=OPS_SCHEMA)


def utc(epoch_seconds: float | None) -> datetime | None:
    """Epoch seconds as an aware UTC datetime (``None`` stays ``None``)."""
    if epoch_seconds is None:
        return None
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc)
