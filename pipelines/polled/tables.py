"""The bronze table of a polled object: the records each poll read, the describes they were read
with, and each poll's watermark, all committed together.

One table per polled object (``bronze.<object>_polled`` by default). Every poll is one append
with the Delta application transaction ``(sfcdc.poll:<Object>, batch id)``, holding:

- ``describe`` rows: the object's describe (``sobjects/<Object>/describe``) when its fields
  changed since the describe the table last stored (always in the first poll), so silver knows
  every record's columns without calling Salesforce;
- ``record`` rows: each record the poll read, as the REST API shapes it (a Bulk API row is
  shaped the same way), with its ``Id``, ``SystemModstamp`` and ``IsDeleted``;
- one ``watermark`` row: the newest ``SystemModstamp`` read so far (the next poll reads from
  there, minus the look-back), the lower bound this poll read from, and how many records it
  read.

==================  ==========  ===============================================================
column              type        meaning
==================  ==========  ===============================================================
``kind``            string      ``record`` | ``describe`` | ``watermark``
``record_id``       string      a record row's ``Id``
``system_modstamp`` timestamp   a record row's ``SystemModstamp``
``is_deleted``      boolean     a record row's ``IsDeleted`` (in the Recycle Bin)
``payload``         string      a record's or a describe's JSON, as Salesforce sent it
``fingerprint``     string      the describe's fingerprint (a record row: the describe its
                                fields were read with)
``api``             string      ``rest`` or ``bulk``: how the poll read
``polled_at``       timestamp   when the poll's query started
``batch_id``        bigint      the poll: 1, 2, ... (the transaction version)
``batch_seq``       int         position in the poll: ``(batch_id, batch_seq)`` is the order
``watermark``       timestamp   a watermark row: the newest ``SystemModstamp`` read so far
``since``           timestamp   a watermark row: the lower bound this poll read from (null:
                                the whole object)
``records``         bigint      a watermark row: the records this poll read
==================  ==========  ===============================================================

Exactly once: the records and the watermark that moves past them are one commit. A poll killed
before it commits leaves nothing, and the next poll reads from the last committed watermark; a
poll that committed is never repeated (the transaction version is the batch id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipelines.engines.base import TableRef, WriteLayout
from pipelines.spec import ObjectSpec

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine

__all__ = [
    "POLLED_LAYOUT",
    "POLLED_SCHEMA",
    "POLL_APP_PREFIX",
    "TIMESTAMP",
    "PollState",
    "StoredDescribe",
    "poll_app_id",
    "poll_state",
    "polled_table",
    "stored_describes",
]

POLL_APP_PREFIX = "sfcdc.poll:"
# The type of every time column (and of the poll's SystemModstamps).
TIMESTAMP = pa.timestamp("us", tz="UTC")

POLLED_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("record_id", pa.string()),
        pa.field("system_modstamp", TIMESTAMP),
        pa.field("is_deleted", pa.bool_()),
        pa.field("payload", pa.string()),
        pa.field("fingerprint", pa.string()),
        pa.field("api", pa.string()),
        pa.field("polled_at", TIMESTAMP, nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("batch_seq", pa.int32(), nullable=False),
        pa.field("watermark", TIMESTAMP),
        pa.field("since", TIMESTAMP),
        pa.field("records", pa.int64()),
    ]
)
# Payloads and ids are unique per row: no dictionaries; readers filter on kind and batch only.
POLLED_LAYOUT = WriteLayout(
    distinct=("record_id", "payload", "batch_seq"),
    unindexed=("payload",),
)


def polled_table(obj: ObjectSpec) -> TableRef:
    """The bronze table a polled object's polls land in."""
    return TableRef("bronze", obj.tables.bronze)


def poll_app_id(obj: ObjectSpec) -> str:
    """The Delta app id whose version is the object's last committed poll (batch id)."""
    return f"{POLL_APP_PREFIX}{obj.api_name}"


@dataclass(frozen=True)
class PollState:
    """Where an object's polls stand: the last committed poll (``batch_id``, ``None``: never
    polled), when it ran, and the newest ``SystemModstamp`` read so far."""

    batch_id: int | None
    polled_at: datetime | None
    watermark: datetime | None


def poll_state(engine: LakeEngine, obj: ObjectSpec) -> PollState:
    """The object's :class:`PollState`, from its table's transaction and watermark row."""
    table = polled_table(obj)
    if not engine.exists(table):
        return PollState(None, None, None)
    batch = engine.txn_version(table, poll_app_id(obj))
    if batch is None:
        return PollState(None, None, None)
    rows = engine.read_arrow(
        table,
        columns=["polled_at", "watermark"],
        where=[("kind", "=", "watermark"), ("batch_id", "=", batch)],
    ).to_pylist()
    if not rows:
        return PollState(batch, None, None)
    return PollState(batch, rows[0]["polled_at"], rows[0]["watermark"])


@dataclass(frozen=True)
class StoredDescribe:
    """A describe the table holds, with its fingerprint and the poll that stored it."""

    fingerprint: str
    describe: dict[str, Any]
    batch_id: int


def stored_describes(engine: LakeEngine, obj: ObjectSpec) -> list[StoredDescribe]:
    """Every describe the object's table holds, oldest first."""
    table = polled_table(obj)
    if not engine.exists(table):
        return []
    rows = engine.read_arrow(
        table, columns=["fingerprint", "payload", "batch_id"], where=[("kind", "=", "describe")]
    ).to_pylist()
    rows.sort(key=lambda r: r["batch_id"])
    return [StoredDescribe(r["fingerprint"], json.loads(r["payload"]), r["batch_id"]) for r in rows]
