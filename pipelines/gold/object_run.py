"""One object's gold run: silver versions folded into gold in steps, each step written whole.

:class:`ObjectRun` carries out, for one object, the protocol of :mod:`pipelines.gold.job`:
plan the steps from silver's history, and for each step read the appended silver rows, fold
them onto the touched gold rows and tombstones, and write the re-sync table, the tombstones,
the SCD2 history and last the gold MERGE that records the step's silver version.

The fold reads from gold only the columns it cannot leave to the MERGE
(:func:`~pipelines.gold.plan.kept_columns`): a record's other columns keep their values where
no change of the step set them (``FOLD_SET``, ``engine.merge(keep=...)``), so the gold rows
the step touches cross from the table to the fold and back with fewer columns. A step with
wildcard changes, or a gold table whose columns are not yet the fold's, reads whole rows.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from ingest.errors import ConfigError, LakeError
from ingest.schema import HEADER_FIELD
from pipelines.chunking import plan_chunks, version_sizes
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import (
    Kept,
    LakeEngine,
    MergeMetrics,
    Rows,
    TableRef,
    Txn,
    concurrent_write,
)
from pipelines.gold.columns import (
    DELETED,
    ID,
    ORDER_KEY,
    body_fields,
    gold_schema,
    tombstone_schema,
)
from pipelines.gold.dataflow import (
    batch_wildcards,
    fold_counts,
    fold_rows,
    gold_kept,
    gold_read,
    history_changes,
)
from pipelines.gold.folding import (
    FOLD_COUNTS_SCHEMA,
    RESOLVED_SCHEMA,
    FoldCounts,
    GoldPart,
    ResolvedPart,
    ResyncPart,
    TombstonePart,
    VersionsPart,
)
from pipelines.gold.plan import FOLD_SET, FoldPlan, fold_plan
from pipelines.gold.resync import RESYNC_SCHEMA, RESYNC_TABLE, open_rows_to_resolve_arrow
from pipelines.gold.scd2 import HISTORY_KEYS, history_schema
from pipelines.gold.tables import (
    HISTORY_APP_PREFIX,
    TOMBSTONE_APP_PREFIX,
    app_id,
    conflict_error,
    gold_table,
    history_table,
    tombstone_table,
)
from pipelines.ops.newest import CHANGE_EVENT_TIME, newest_time
from pipelines.ops.table import CommitRecord
from pipelines.silver.columns import SilverLayout
from pipelines.silver.registry import silver_layout
from pipelines.spec.models import ObjectSpec
from pipelines.spec.sections import DeleteMode

__all__ = [
    "RESYNC_COMPACT_EVERY",
    "ObjectResult",
    "ObjectRun",
    "merge_conditions",
    "tombstone_condition",
]

# Gold's log lines stay under the job's logger, whichever module writes them.
_log = logging.getLogger("pipelines.gold.job")

_META_SEQUENCE = "sfcdc.gold.order_by"
_META_SILVER_VERSIONS = "sfcdc.gold.silver_versions"
# Re-sync table versions between compactions of its small files.
RESYNC_COMPACT_EVERY = 25
_RESYNC_ARROW = spark_schema_to_arrow(RESYNC_SCHEMA)


def merge_conditions(deletes: DeleteMode) -> tuple[str, str | None]:
    """``(update_condition, delete_condition)`` of the gold MERGE on ``Id``: a row is updated
    only by a newer order key, and (hard deletes) deleted by a newer delete."""
    newer = f"(target.{ORDER_KEY} IS NULL OR source.{ORDER_KEY} > target.{ORDER_KEY})"
    if deletes == "hard":
        return newer, f"source.{DELETED} = true AND {newer}"
    return newer, None


def tombstone_condition(deletes: DeleteMode) -> tuple[str, str]:
    """``(update_condition, delete_condition)`` of the tombstone MERGE on ``Id``: a newer
    delete replaces a tombstone; a record live again (or, with soft deletes, kept as a row of
    gold) drops it."""
    newer = "(target._cdc_order_key IS NULL OR source._cdc_order_key > target._cdc_order_key)"
    if deletes == "hard":
        return f"source._cdc_is_deleted = true AND {newer}", "source._cdc_is_deleted = false"
    return "false", "true"


@dataclass(frozen=True)
class ObjectResult:
    """What one run did for one object.

    ``changes`` are the silver rows read, ``records`` the records they touched, ``applied``
    and ``ignored`` the changes the fold applied or found already reflected. ``merge`` is
    the gold MERGE's outcome (``None`` when skipped). ``skipped`` means there was nothing
    new in silver.
    """

    object: str
    table: TableRef
    silver_table: TableRef
    after_version: int | None
    silver_version: int | None
    changes: int
    records: int
    applied: int
    ignored: int
    merge: MergeMetrics | None
    resync_rows: int
    resolved: int
    tombstones: int
    versions: int
    skipped: bool
    duration_s: float


@dataclass(frozen=True)
class _Chunk:
    """What one gold step (one MERGE) did."""

    start: int
    end: int
    changes: int
    counts: Mapping[str, int]
    merge: MergeMetrics
    resync_rows: int
    tombstones: int
    versions: int


def _merged(merges: Sequence[MergeMetrics]) -> MergeMetrics:
    """The MERGEs of a run's steps as one: their rows summed, the last one's version."""
    last = merges[-1]
    return MergeMetrics(
        last.table,
        inserted=sum(m.inserted for m in merges),
        updated=sum(m.updated for m in merges),
        deleted=sum(m.deleted for m in merges),
        source_rows=sum(m.source_rows for m in merges),
        version=last.version,
        skipped=all(m.skipped for m in merges),
        duration_s=sum(m.duration_s for m in merges),
    )


class ObjectRun:
    """The gold run of one object (see the module docstring)."""

    def __init__(
        self,
        engine: LakeEngine,
        obj: ObjectSpec,
        silver: TableRef,
        *,
        registry: Mapping[str, Any],
        processed_at: datetime,
        partitions: int | None,
        replay_gaps: list[dict[str, Any]],
        clock: Callable[[], float],
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        on_commit: Callable[[CommitRecord], object] | None = None,
        layout: SilverLayout | None = None,
    ) -> None:
        self.engine = engine
        self.now = now
        self.on_commit = on_commit
        self.obj = obj
        self.layout = layout
        self.silver = silver
        self.gold = gold_table(obj)
        self.registry = registry
        self.processed_at = processed_at
        self.partitions = partitions
        self.replay_gaps = replay_gaps
        self.clock = clock
        self.started = clock()
        self._mark = self.started
        self._since = self.started

    def _step(self, name: str) -> None:
        """Debug timing of a step of the run (``-vv``): a small batch's pass is dominated by
        fixed costs, and this shows which."""
        now = self.clock()
        _log.debug("gold: %s: %s %.3f s", self.obj.api_name, name, now - self._mark)
        self._mark = now

    def _result(self, after: int | None, **values: Any) -> ObjectResult:
        defaults: dict[str, Any] = {
            "silver_version": after,
            "changes": 0,
            "records": 0,
            "applied": 0,
            "ignored": 0,
            "merge": None,
            "resync_rows": 0,
            "resolved": 0,
            "tombstones": 0,
            "versions": 0,
            "skipped": True,
        }
        defaults.update(values)
        return ObjectResult(
            object=self.obj.api_name,
            table=self.gold,
            silver_table=self.silver,
            after_version=after,
            duration_s=self.clock() - self.started,
            **defaults,
        )

    def run(self) -> ObjectResult:
        engine, obj = self.engine, self.obj
        after = engine.txn_version(self.gold, app_id(obj))
        current = engine.version(self.silver)
        if after is not None and current == after:
            # Nothing new: the Delta log says so, no read at all.
            written = self._write_resync(None)
            _log.info(
                "gold: %s is up to date with %s version %s%s",
                self.gold,
                self.silver,
                after,
                f"; {written} replay gap re-sync rows" if written else "",
            )
            return self._result(after, resync_rows=written)
        assert current is not None
        schema = engine.schema(self.silver)
        assert schema is not None
        plan = self._plan()
        self._check_sequence(plan)
        unknown = [c for c in plan.order_by if c not in schema.names]
        if unknown:
            raise ConfigError(
                f"gold of {obj.api_name}: sequence_by names {unknown}, which are not columns "
                f"of {self.silver} (columns: {', '.join(schema.names)})"
            )
        body = body_fields(schema)
        engine.ensure_table(
            self.gold, gold_schema(body), deletion_vectors=obj.gold.deletion_vectors
        )
        ends = self._chunks(after, current)
        self._step("plan")
        steps: list[_Chunk] = []
        reached = after
        for end in ends:
            step = self._chunk(reached, end, schema, plan, body)
            if step is not None:
                steps.append(step)
            reached = end
        if not steps:
            return self._result(after, resync_rows=self._write_resync(None))
        result = self._result(
            after,
            silver_version=reached,
            changes=sum(s.changes for s in steps),
            records=sum(s.counts["records"] for s in steps),
            applied=sum(s.counts["applied"] for s in steps),
            ignored=sum(s.counts["ignored"] for s in steps),
            merge=_merged([s.merge for s in steps]),
            resync_rows=sum(s.resync_rows for s in steps),
            resolved=sum(s.counts["resolved"] for s in steps),
            tombstones=sum(s.tombstones for s in steps),
            versions=sum(s.versions for s in steps),
            skipped=False,
        )
        if len(steps) > 1:
            _log.info(
                "gold: %s <- %s versions %s..%s in %d commits of at most %d silver rows: %d "
                "changes (%.1f s)",
                self.gold,
                self.silver,
                steps[0].start,
                reached,
                len(steps),
                obj.gold.max_rows_per_commit,
                result.changes,
                result.duration_s,
            )
        return result

    def _chunks(self, after: int | None, current: int) -> list[int]:
        """The silver versions to stop at, after ``after`` up to ``current``: each step folds
        at most ``gold.max_rows_per_commit`` silver rows (sizes from silver's history; one
        version is never split)."""
        first = 0 if after is None else after + 1
        if current <= first:
            # One version (or none: read_appends tells why), nothing to split.
            return [current]
        history = self.engine.history(self.silver, limit=current - first + 1)
        ends = plan_chunks(
            version_sizes(history),
            after,
            current,
            max_rows=self.obj.gold.max_rows_per_commit,
            # Silver's history records rows, not payload bytes: rows are the bound.
            max_bytes=sys.maxsize,
        )
        return ends or [current]

    def _chunk(
        self,
        after: int | None,
        end: int,
        schema: T.StructType,
        plan: FoldPlan,
        body: Sequence[Any],
    ) -> _Chunk | None:
        """One complete gold step: the silver rows after ``after`` up to ``end`` folded and
        written, the gold MERGE recording ``end``."""
        engine, obj = self.engine, self.obj
        changes = engine.read_appends(self.silver, after_version=after, until_version=end)
        start = changes.start_version
        self._step("read appends")
        if start is None:
            return None
        if changes.full_read:
            _log.warning(
                "gold: %s could not be read incrementally; folding all of it up to version %d "
                "(changes gold already reflects are ignored)",
                self.silver,
                end,
            )
        rows = engine.persist(changes.rows)
        held = [rows]
        try:
            wildcards = batch_wildcards(engine, rows, schema)
            kept = gold_kept(engine, self.gold, rows, plan=plan, body=body, wildcards=wildcards)
            folded = engine.persist(self._fold(rows, schema, plan, wildcards, kept))
            held.append(folded)
            counts = fold_counts(
                engine.to_arrow(engine.map_batches(folded, FoldCounts(), FOLD_COUNTS_SCHEMA))
            )
            self._step("fold")
            written = self._write_resync(folded)
            # Recorded with the first step's re-sync rows: later steps need not repeat them.
            self.replay_gaps = []
            self._step("re-sync")
            tombstoned = self._write_tombstones(folded, plan, end) if counts["tombstones"] else 0
            versions = self._write_history(folded, plan, body, end) if counts["versions"] else 0
            self._step("tombstones and history")
            merged = gold_schema(body)
            if kept:
                merged = T.StructType([*merged.fields, T.StructField(FOLD_SET, T.StringType())])
            gold_rows = engine.map_batches(folded, GoldPart(merged.names), merged)
            newest = None
            if self.on_commit is not None:
                column = CHANGE_EVENT_TIME if CHANGE_EVENT_TIME in schema.names else None
                newest = newest_time(engine, rows, column)
            # FOLD_SET has a flag per body column, whether the fold read it or not.
            keep = Kept(FOLD_SET, tuple(f.name for f in body)) if kept else None
            merge = self._merge_gold(gold_rows, plan, end, start, keep)
            self._step("merge")
        finally:
            for kept in held:
                engine.release(kept)
        step = _Chunk(
            start=start,
            end=end,
            changes=counts["changes"] + len(wildcards),
            counts=counts,
            merge=merge,
            resync_rows=written,
            tombstones=tombstoned,
            versions=versions,
        )
        # The run's first step also carries its planning.
        seconds = self.clock() - self._since
        self._since = self.clock()
        if self.on_commit is not None and not merge.skipped:
            self.on_commit(
                CommitRecord(
                    layer="gold",
                    kind="commit",
                    visible_at=self.now(),
                    topic=obj.topic,
                    object=obj.api_name,
                    table=str(self.gold),
                    version=merge.version,
                    events=step.changes,
                    rows=merge.inserted + merge.updated + merge.deleted,
                    resync_rows=written,
                    newest_commit_at=newest,
                    duration_seconds=seconds,
                )
            )
        _log.info(
            "gold: %s <- %s versions %s..%s: %d changes of %d records (%d applied, %d already "
            "reflected): %d inserted, %d updated, %d deleted; %d re-sync rows, %d tombstones, "
            "%d history versions (%.1f s)",
            self.gold,
            self.silver,
            start,
            end,
            step.changes,
            counts["records"],
            counts["applied"],
            counts["ignored"],
            merge.inserted,
            merge.updated,
            merge.deleted,
            written,
            tombstoned,
            versions,
            seconds,
        )
        return step

    def _fold(
        self,
        changes: Rows,
        schema: T.StructType,
        plan: FoldPlan,
        wildcards: Sequence[Mapping[str, Any]],
        kept: Sequence[str],
    ) -> Rows:
        """The batch's changes folded onto the gold rows and tombstones of the records they
        touch (all of them when the batch has wildcard changes); gold's ``kept`` columns are
        left to the MERGE."""
        engine = self.engine

        def state(table: TableRef, columns: Sequence[str] | None = None) -> Rows | None:
            if not engine.exists(table):
                return None
            if wildcards:
                return engine.read(table)
            return engine.read_keyed(table, key=ID, keys=changes, columns=columns)

        return fold_rows(
            engine,
            changes,
            schema=schema,
            plan=plan,
            wildcards=wildcards,
            gold=state(self.gold, gold_read(body_fields(schema), kept)),
            tombstones=state(tombstone_table(self.obj)),
        )

    # -- planning --------------------------------------------------------------------------

    def _plan(self) -> FoldPlan:
        obj = self.obj
        layout = self.layout or silver_layout(obj, self.registry)
        scd2 = obj.gold.scd2
        try:
            return fold_plan(
                layout,
                processed_at=self.processed_at,
                sequence_by=obj.gold.sequence_by,
                deletes=obj.gold.deletes,
                track=scd2.track if scd2.enabled else None,
                partitions=self.partitions,
                versions={
                    sid: [f.name for f in entry.schema.fields if f.name != HEADER_FIELD]
                    for sid, entry in self.registry.items()
                    if entry.schema is not None and entry.schema.entity_name == obj.api_name
                },
            )
        except ValueError as exc:
            raise ConfigError(f"gold of {obj.api_name}: {exc}") from exc

    def _check_sequence(self, plan: FoldPlan) -> None:
        # Stored order keys only compare with keys made of the same columns.
        wanted = ",".join(plan.order_by)
        if not self.engine.exists(self.gold):
            return
        for entry in self.engine.history(self.gold, limit=50):
            if entry.txn is not None and entry.txn.app_id == app_id(self.obj):
                stored = entry.metadata.get(_META_SEQUENCE)
                if stored is not None and stored != wanted:
                    raise ConfigError(
                        f"gold of {self.obj.api_name}: {self.gold} was built with sequence_by "
                        f"{stored.split(',')} but the configuration now says "
                        f"{list(plan.order_by)}; the stored order keys cannot be compared "
                        "with new ones: restore the old setting, or drop the gold table and "
                        "run again to rebuild it from silver"
                    )
                return

    # -- writes ----------------------------------------------------------------------------

    def _write_resync(self, folded: Rows | None) -> int:
        engine = self.engine
        pieces: list[Rows] = []
        if self.replay_gaps:
            pieces.append(engine.rows(pa.Table.from_pylist(self.replay_gaps, schema=_RESYNC_ARROW)))
        if folded is not None:
            pieces.append(engine.map_batches(folded, ResyncPart(), RESYNC_SCHEMA))
            resolved = engine.to_arrow(engine.map_batches(folded, ResolvedPart(), RESOLVED_SCHEMA))
            pairs = dict(
                zip(
                    resolved.column("record_id").to_pylist(),
                    resolved.column("resolved_by").to_pylist(),
                    strict=True,
                )
            )
            if pairs and engine.exists(RESYNC_TABLE):
                existing = engine.read_arrow(
                    RESYNC_TABLE,
                    where=[("object", "=", self.obj.api_name), ("record_id", "in", sorted(pairs))],
                )
                resolving = open_rows_to_resolve_arrow(
                    existing, pairs, object_name=self.obj.api_name, at=self.processed_at
                )
                pieces.append(engine.rows(resolving, RESYNC_SCHEMA))
        if not pieces:
            return 0
        data = engine.persist(engine.union(pieces, RESYNC_SCHEMA))
        try:
            if engine.count(data) == 0:
                return 0
            engine.ensure_table(RESYNC_TABLE, RESYNC_SCHEMA)
            # New rows are inserted; a known row only changes when it gets resolved, so a
            # re-run (or a re-read replay gap) leaves the table as it is.
            metrics = engine.merge(
                RESYNC_TABLE,
                data,
                on=["resync_id"],
                update_condition="source.resolved_at IS NOT NULL AND target.resolved_at IS NULL",
            )
        finally:
            engine.release(data)
        self._compact_resync(metrics)
        return metrics.inserted + metrics.updated

    def _compact_resync(self, metrics: MergeMetrics) -> None:
        # Every object of every pass adds a small file to the re-sync table, and every pass
        # reads and MERGEs it whole (its ids are hashes: no file is ever pruned), so without
        # compaction a continuous run's re-sync steps grow with the number of passes.
        if metrics.skipped or metrics.version is None:
            return
        if metrics.version == 0 or metrics.version % RESYNC_COMPACT_EVERY:
            return
        try:
            self.engine.maintain(RESYNC_TABLE, compact=True, checkpoint=False)
        except LakeError as exc:
            # Compaction only saves time; a concurrent writer (sfcdc resync) may win the race.
            _log.warning("gold: compacting %s failed, left for a later pass: %s", RESYNC_TABLE, exc)

    def _write_tombstones(self, folded: Rows, plan: FoldPlan, version: int) -> int:
        table = tombstone_table(self.obj)
        self.engine.ensure_table(table, tombstone_schema())
        update, delete = tombstone_condition(plan.deletes)
        metrics = self.engine.merge(
            table,
            self.engine.map_batches(folded, TombstonePart(), tombstone_schema()),
            on=[ID],
            update_condition=update,
            delete_condition=delete,
            insert=plan.deletes == "hard",
            txn=Txn(f"{TOMBSTONE_APP_PREFIX}{self.obj.api_name}", version),
        )
        return metrics.inserted + metrics.updated + metrics.deleted

    def _write_history(
        self, folded: Rows, plan: FoldPlan, body: Sequence[Any], version: int
    ) -> int:
        engine = self.engine
        table = history_table(self.obj)
        by_name = {f.name: f for f in body}
        tracked = [by_name[c] for c in plan.track or () if c in by_name]
        schema = history_schema(tracked)
        engine.ensure_table(table, schema, deletion_vectors=self.obj.gold.deletion_vectors)
        new = engine.persist(engine.map_batches(folded, VersionsPart(), schema))
        try:
            current = engine.read_keyed(table, key=ID, keys=new)
            changes = history_changes(engine, new, current, schema=schema)
            metrics = engine.merge(
                table,
                changes,
                on=list(HISTORY_KEYS),
                txn=Txn(f"{HISTORY_APP_PREFIX}{self.obj.api_name}", version),
            )
        finally:
            engine.release(new)
        return metrics.inserted

    def _merge_gold(
        self, source: Any, plan: FoldPlan, version: int, start: int, keep: Kept | None
    ) -> MergeMetrics:
        update, delete = merge_conditions(plan.deletes)
        try:
            return self.engine.merge(
                self.gold,
                source,
                on=[ID],
                update_condition=update,
                delete_condition=delete,
                txn=Txn(app_id(self.obj), version),
                metadata={
                    _META_SEQUENCE: ",".join(plan.order_by),
                    _META_SILVER_VERSIONS: f"{start}-{version}",
                },
                keep=keep,
            )
        except LakeError as exc:
            if not concurrent_write(exc):
                raise
            raise conflict_error(self.gold, self.obj.api_name, start, version) from exc
