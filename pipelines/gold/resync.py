"""The re-sync table: records (or whole objects) gold cannot reproduce from events.

Some changes reach a replica without their values, and gold says so instead of guessing.
Every such case is one row of ``gold.sfcdc_resync`` (one table for every object):

=====================  ==========  ==========================================================
column                 type        meaning
=====================  ==========  ==========================================================
``resync_id``          string      stable key of the row (same cause, same id: re-runs add
                                   nothing)
``object``             string      API name of the object (``Account``)
``record_id``          string      the record to re-read; null: the whole object
``change_type``        string      change type of the event that caused it (null for a
                                   replay gap)
``reason``             string      one of :data:`REASONS`
``detail``             string      what exactly (the field, the diff error, the replay gap)
``commit_timestamp``   timestamp   commit time of the event
``replay_id``          binary      its replay id
``event_id``           string      its event id
``bronze_batch_id``    bigint      the bronze batch that landed it
``detected_at``        timestamp   when the gold run found it
``resolved_at``        timestamp   when a later full image (CREATE / UNDELETE) made the record
                                   exact again; null while open
``resolved_by``        string      the event id of that full image
=====================  ==========  ==========================================================

Reasons (:data:`REASONS`):

- ``gap``: a GAP_CREATE / GAP_UPDATE / GAP_DELETE / GAP_UNDELETE event: the change happened
  but Salesforce sent no values.
- ``overflow``: a GAP_OVERFLOW event: a transaction changed more records than Salesforce
  reports; the whole object needs a re-sync (``record_id`` null).
- ``replay_gap``: the stored replay id was rejected and the subscription resumed elsewhere by
  policy (a ``replay_gap`` row of the bronze checkpoint table): events may be lost, the whole
  object needs a re-sync.
- ``diff_missing_base``: a diff-encoded long text value arrived for a field gold has no value
  for; ``diff_failed``: the diff could not be applied to gold's value or its SHA-256 did not
  match. Gold keeps the previous value.
- ``missing_base``: an UPDATE or DELETE of a record gold has never seen (created before the
  subscription started, or before the events were retained): gold wrote what it knows.
- ``update_of_deleted``: an UPDATE of a deleted record; Salesforce does not send these, so an
  UNDELETE was missed.
- ``unknown_field``: a changed field the object's silver columns do not have.
- ``unsupported_change_type``: a change type gold does not know (``SNAPSHOT`` is reserved by
  Salesforce; ``POLLED`` and ``POLLED_DELETED`` are sfcdc's own, for polled objects).
- ``drift``: ``sfcdc reconcile`` found the record missing from gold, live in gold but deleted
  (or hard-deleted) in Salesforce, or older in gold than its ``SystemModstamp``
  (:mod:`pipelines.reconcile`): an event was lost.

Open rows (``resolved_at`` null) are the work list of a re-sync: re-read those records (or
re-bootstrap those objects) from Salesforce.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import types as T

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import TableRef

__all__ = [
    "OBJECT_LEVEL_REASONS",
    "REASONS",
    "RESYNC_SCHEMA",
    "RESYNC_TABLE",
    "Reason",
    "open_rows_to_resolve_arrow",
    "replay_gap_rows",
    "resync_id",
    "resync_row",
]

RESYNC_TABLE = TableRef("gold", "sfcdc_resync")

Reason = Literal[
    "gap",
    "overflow",
    "replay_gap",
    "diff_missing_base",
    "diff_failed",
    "missing_base",
    "update_of_deleted",
    "unknown_field",
    "unsupported_change_type",
    "drift",
]
REASONS: tuple[Reason, ...] = (
    "gap",
    "overflow",
    "replay_gap",
    "diff_missing_base",
    "diff_failed",
    "missing_base",
    "update_of_deleted",
    "unknown_field",
    "unsupported_change_type",
    "drift",
)
OBJECT_LEVEL_REASONS: frozenset[str] = frozenset({"overflow", "replay_gap"})

RESYNC_SCHEMA = T.StructType(
    [
        T.StructField("resync_id", T.StringType()),
        T.StructField("object", T.StringType()),
        T.StructField("record_id", T.StringType()),
        T.StructField("change_type", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("detail", T.StringType()),
        T.StructField("commit_timestamp", T.TimestampType()),
        T.StructField("replay_id", T.BinaryType()),
        T.StructField("event_id", T.StringType()),
        T.StructField("bronze_batch_id", T.LongType()),
        T.StructField("detected_at", T.TimestampType()),
        T.StructField("resolved_at", T.TimestampType()),
        T.StructField("resolved_by", T.StringType()),
    ]
)


def resync_id(object_name: str, record_id: str | None, reason: str, *cause: object) -> str:
    """The stable key of a re-sync row: the same object, record, reason and cause (event id,
    field, replay gap position) always give the same id, so a re-run adds nothing."""
    text = "\x1f".join(
        ["" if p is None else str(p) for p in (object_name, record_id or "*", reason, *cause)]
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def resync_row(
    *,
    object_name: str,
    record_id: str | None,
    reason: Reason,
    change_type: str | None,
    detail: str | None,
    commit_timestamp: datetime | None,
    replay_id: bytes | None,
    event_id: str | None,
    bronze_batch_id: int | None,
    detected_at: datetime,
    cause: Sequence[object] = (),
) -> dict[str, Any]:
    """One open re-sync row (a dict of :data:`RESYNC_SCHEMA` columns). ``cause`` tells apart
    two rows of one event and reason (the field of a failed diff)."""
    if reason not in REASONS:
        raise ValueError(f"re-sync reason must be one of {', '.join(REASONS)} (got {reason!r})")
    return {
        "resync_id": resync_id(object_name, record_id, reason, event_id, *cause),
        "object": object_name,
        "record_id": record_id,
        "change_type": change_type,
        "reason": reason,
        "detail": detail,
        "commit_timestamp": commit_timestamp,
        "replay_id": replay_id,
        "event_id": event_id,
        "bronze_batch_id": bronze_batch_id,
        "detected_at": detected_at,
        "resolved_at": None,
        "resolved_by": None,
    }


def replay_gap_rows(
    checkpoints: Iterable[Mapping[str, Any]],
    *,
    objects: Mapping[str, Sequence[str]],
    detected_at: datetime,
) -> list[dict[str, Any]]:
    """Re-sync rows for the ``replay_gap`` rows of the bronze checkpoint table.

    ``checkpoints`` are checkpoint rows (``topic``, ``batch_id``, ``kind``, ``gap_requested``,
    ``gap_resumed``, ``detail``, ``committed_at``); ``objects`` maps each topic to the objects
    it carries. Each gap yields one whole-object row per object of its topic, keyed by the
    topic and batch, so reading the same gap again yields the same ids.
    """
    rows = []
    for cp in checkpoints:
        if cp.get("kind") != "replay_gap":
            continue
        topic = str(cp.get("topic"))
        batch = cp.get("batch_id")
        detail = (
            f"replay gap on {topic} (bronze batch {batch}): the stored position "
            f"{cp.get('gap_requested') or '?'} was rejected and the subscription resumed at "
            f"{cp.get('gap_resumed') or '?'}; events in between may be lost"
        )
        if cp.get("detail"):
            detail += f" ({cp['detail']})"
        for object_name in objects.get(topic, ()):
            rows.append(
                resync_row(
                    object_name=object_name,
                    record_id=None,
                    reason="replay_gap",
                    change_type=None,
                    detail=detail,
                    commit_timestamp=None,
                    replay_id=None,
                    event_id=None,
                    bronze_batch_id=None if batch is None else int(batch),
                    detected_at=detected_at,
                    cause=(topic, batch),
                )
            )
    return rows


def open_rows_to_resolve_arrow(
    existing: pa.Table, resolved: Mapping[str, str], *, object_name: str, at: datetime
) -> pa.Table:
    """The open re-sync rows of ``object_name`` in ``existing`` (re-sync rows: any subset
    that includes the records' open rows) whose record a later full image made exact again,
    with ``resolved_at`` / ``resolved_by`` set. ``resolved`` maps a record id to the event id
    of its full image. Whole-object rows are never resolved this way: only a re-bootstrap
    does."""
    schema = spark_schema_to_arrow(RESYNC_SCHEMA)
    rows = []
    for row in existing.select(schema.names).to_pylist():
        by = resolved.get(row["record_id"]) if row["record_id"] is not None else None
        if row["object"] == object_name and row["resolved_at"] is None and by is not None:
            rows.append({**row, "resolved_at": at, "resolved_by": by})
    return pa.Table.from_pylist(rows, schema=schema)
