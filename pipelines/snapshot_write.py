"""Snapshot rows into gold: MERGEd chunk by chunk, with tombstones and SCD2 versions.

A record read from Salesforce (:mod:`pipelines.snapshot_rows`) becomes a gold row flagged as a
snapshot (``_cdc_last_change_type = 'SNAPSHOT'``, ``_cdc_needs_resync`` cleared) whose order key
is :func:`snapshot_key`'s (why that key is right: :mod:`pipelines.bootstrap`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from pipelines.bronze.checkpoint import Checkpoint
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import LakeEngine, MergeMetrics, TableRef
from pipelines.gold.columns import (
    DELETED,
    DELETED_AT,
    ID,
    LAST_CHANGE_TYPE,
    LAST_COMMIT_NUMBER,
    LAST_COMMIT_TS,
    LAST_EVENT_ID,
    LAST_REPLAY_ID,
    NEEDS_RESYNC,
    ORDER_KEY,
    RESERVED_PREFIX,
    RESYNC_REASON,
    UPDATED_AT,
    tombstone_schema,
)
from pipelines.gold.scd2 import (
    HISTORY_KEYS,
    SCD_CHANGE_TYPE,
    SCD_EVENT_ID,
    SCD_IS_CURRENT,
    SCD_IS_DELETED,
    SCD_ORDER_KEY,
    SCD_VALID_FROM,
    SCD_VALID_TO,
    history_schema,
)
from pipelines.gold.tables import history_table, tombstone_table
from pipelines.spec.models import ObjectSpec

if TYPE_CHECKING:
    from pyspark.sql import types as T

__all__ = ["SNAPSHOT_CHANGE_TYPE", "SNAPSHOT_MARK", "Mode", "SnapshotWriter", "snapshot_key"]

SNAPSHOT_CHANGE_TYPE = "SNAPSHOT"
SNAPSHOT_MARK = "~snapshot"

Mode = Literal["bootstrap", "resync"]


def snapshot_key(order_key: str | None, last_change_type: str | None) -> str:
    """The order key of a snapshot row over a gold row with ``order_key`` (``None``: no row;
    the argument is in the module docstring)."""
    if not order_key:
        return ""
    if last_change_type == SNAPSHOT_CHANGE_TYPE:
        return order_key
    return order_key + SNAPSHOT_MARK


class SnapshotWriter:
    """MERGEs snapshot rows into gold (and tombstones, with hard deletes), chunk by chunk."""

    def __init__(
        self,
        engine: LakeEngine,
        obj: ObjectSpec,
        gold: TableRef,
        schema: pa.Schema,
        *,
        at: datetime,
        mode: Mode,
        position: Checkpoint | None,
        untracked: frozenset[str] = frozenset(),
    ) -> None:
        self.engine = engine
        # Columns SCD2 history never tracks (formula fields: the gold fold does not see them).
        self.untracked = untracked
        self.obj = obj
        self.gold = gold
        self.schema = schema
        self.at = at
        self.mode = mode
        self.replay = position.replay_id.value if position and position.replay_id else None
        self.metrics: MergeMetrics | None = None
        self.deleted_read = 0

    def __call__(
        self,
        entries: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None, bool, bool]],
        current: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """``entries`` are ``(body, existing gold row, deleted, vanished)``."""
        out = []
        for body, existing, is_deleted, vanished in entries:
            row: dict[str, Any] = dict.fromkeys(self.schema.names)
            row.update(body)
            row.update(_control(existing, is_deleted=is_deleted, at=self.at, replay=self.replay))
            out.append(row)
            self.deleted_read += int(is_deleted and not vanished)
        if self.obj.gold.scd2.enabled:
            self._history(out)
        hard = self.obj.gold.deletes == "hard"
        if hard:
            # Tombstones first, as the gold job writes them: a crash before the gold MERGE
            # leaves a tombstone newer than its gold row, which the fold takes as the truth.
            _write_tombstones(self.engine, self.obj, out)
            out = [r for r in out if not r[DELETED] or r[ID] in current]
        if not out:
            return
        metrics = self.engine.merge(
            self.gold,
            pa.Table.from_pylist(out, schema=self.schema),
            on=[ID],
            delete_condition=f"source.{DELETED} = true" if hard else None,
            metadata={"sfcdc.snapshot": f"{self.mode} {self.at.isoformat()}"},
        )
        self.metrics = metrics if self.metrics is None else _add(self.metrics, metrics)

    def _history(self, rows: Sequence[dict[str, Any]]) -> None:
        """SCD2: a snapshot that changes a tracked column or the deleted flag starts a version
        (``_scd_change_type = 'SNAPSHOT'``, keyed by the snapshot's order key, so it sorts
        after the versions of the changes it reflects) and closes the current one."""
        engine, obj = self.engine, self.obj
        table = history_table(obj)
        gold_fields = {f.name: f for f in _arrow_fields(self.schema)}
        track = obj.gold.scd2.track
        names = [
            n
            for n in (track if track != "all" else gold_fields)
            if n in gold_fields
            and n != ID
            and not n.startswith(RESERVED_PREFIX)
            and n not in self.untracked
        ]
        schema = history_schema([gold_fields[n] for n in names])
        engine.ensure_table(table, schema)
        ids = [r[ID] for r in rows]
        current = (
            {
                r[ID]: r
                for r in engine.read_arrow(
                    table, where=[(ID, "in", ids), (SCD_IS_CURRENT, "=", True)]
                ).to_pylist()
            }
            if ids
            else {}
        )
        changes = []
        for row in rows:
            state = (*(row.get(n) for n in names), row[DELETED])
            now = current.get(row[ID])
            if now is not None and (*(now.get(n) for n in names), now[SCD_IS_DELETED]) == state:
                continue
            version = {ID: row[ID], **{n: row.get(n) for n in names}}
            version.update(
                {
                    SCD_VALID_FROM: self.at,
                    SCD_VALID_TO: None,
                    SCD_IS_CURRENT: True,
                    SCD_IS_DELETED: row[DELETED],
                    SCD_CHANGE_TYPE: SNAPSHOT_CHANGE_TYPE,
                    SCD_ORDER_KEY: row[ORDER_KEY],
                    SCD_EVENT_ID: None,
                }
            )
            changes.append(version)
            # A snapshot over a snapshot with no change in between shares its key: the
            # version is corrected in place rather than closed.
            if now is not None and now[SCD_ORDER_KEY] != row[ORDER_KEY]:
                changes.append({**now, SCD_VALID_TO: self.at, SCD_IS_CURRENT: False})
        if changes:
            engine.merge(
                table,
                pa.Table.from_pylist(changes, schema=spark_schema_to_arrow(schema)),
                on=list(HISTORY_KEYS),
            )


def _arrow_fields(schema: pa.Schema) -> list[T.StructField]:
    from pipelines.engines.arrow import arrow_schema_to_spark

    return list(arrow_schema_to_spark(schema).fields)


def _add(a: MergeMetrics, b: MergeMetrics) -> MergeMetrics:
    return dataclasses.replace(
        b,
        inserted=a.inserted + b.inserted,
        updated=a.updated + b.updated,
        deleted=a.deleted + b.deleted,
        source_rows=a.source_rows + b.source_rows,
        duration_s=a.duration_s + b.duration_s,
    )


def _control(
    existing: Mapping[str, Any] | None, *, is_deleted: bool, at: datetime, replay: bytes | None
) -> dict[str, Any]:
    deleted_at = None
    if is_deleted:
        deleted_at = (existing or {}).get(DELETED_AT) or at
    return {
        DELETED: is_deleted,
        DELETED_AT: deleted_at,
        NEEDS_RESYNC: False,
        RESYNC_REASON: None,
        LAST_CHANGE_TYPE: SNAPSHOT_CHANGE_TYPE,
        LAST_COMMIT_TS: at,
        LAST_COMMIT_NUMBER: None,
        LAST_REPLAY_ID: replay,
        # Kept, so that the event applied last, delivered again in a later bronze batch (its
        # key is then greater), is still recognised as already reflected.
        LAST_EVENT_ID: (existing or {}).get(LAST_EVENT_ID),
        ORDER_KEY: snapshot_key(
            (existing or {}).get(ORDER_KEY), (existing or {}).get(LAST_CHANGE_TYPE)
        ),
        UPDATED_AT: at,
    }


def _write_tombstones(engine: LakeEngine, obj: ObjectSpec, rows: Sequence[dict[str, Any]]) -> None:
    """Hard deletes: a deleted record's snapshot becomes its tombstone (so a late change
    cannot bring it back), and a record the snapshot found live loses its tombstone."""
    table = tombstone_table(obj)
    schema = tombstone_schema()
    arrow = spark_schema_to_arrow(schema)
    names = schema.fieldNames()
    deleted = [{n: r.get(n) for n in names} for r in rows if r[DELETED]]
    live = [{n: r.get(n) for n in names} for r in rows if not r[DELETED]]
    if deleted:
        engine.ensure_table(table, schema)
        engine.merge(table, pa.Table.from_pylist(deleted, schema=arrow), on=[ID])
    if live and engine.exists(table):
        engine.merge(
            table,
            pa.Table.from_pylist(live, schema=arrow),
            on=[ID],
            delete_condition="true",
            insert=False,
        )
