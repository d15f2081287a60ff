"""The gold job: new silver rows -> current-state gold tables, through the engine's MERGE.

For every configured change event object, :func:`run_gold`

1. finds how far the gold table got: the version of its Delta app transaction
   ``sfcdc.gold:<object>`` is the last silver version it applied;
2. reads only the silver rows appended after that version (``engine.read_appends``) and,
   from the gold table (and the tombstone table, with hard deletes), the rows of the records
   they touch (every row when the batch has a wildcard change);
3. folds them (:func:`pipelines.gold.fold.fold_changes`): one complete row per record; the
   local engine, which writes from the driver, folds there
   (:func:`~pipelines.gold.fold.fold_changes_arrow`), and reads a small batch's silver rows
   with pyarrow from the files the Delta log lists, so it costs no Spark job at all;
4. writes, in this order: the re-sync table (new rows, and rows a full image resolved), the
   tombstones (hard deletes), the SCD2 history, and last the gold table with
   ``engine.merge(on=["Id"], update_condition=<newer order key>,
   delete_condition=<hard delete>)`` under the txn ``(sfcdc.gold:<object>, silver version)``.

Exactly once. The gold MERGE is last and records the silver version it reached: a run that
dies before it leaves the range unapplied, and the next run folds it again. That is safe
because every write is idempotent: the re-sync table is keyed by a stable id, the tombstone
and history MERGEs carry their own txns, and the fold ignores any change a record already
reflects (order keys) while a tombstone newer than its gold row wins. A retried run with
nothing new in silver reads nothing and writes nothing.

Replay gaps (``replay_gap`` rows of the bronze checkpoint table: events lost because a
rejected replay id was skipped by policy) are recorded in the re-sync table as whole-object
re-syncs of every object on the topic.

One gold run per lake at a time: runs do not coordinate with each other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ingest.errors import ConfigError, LakeError
from pipelines.engines import LakeEngine, MergeMetrics, TableRef, Txn
from pipelines.engines.arrow import arrow_to_dataframe, dataframe_to_arrow, spark_schema_to_arrow
from pipelines.engines.base import Condition
from pipelines.gold.columns import ID, body_fields, gold_schema, tombstone_schema
from pipelines.gold.fold import (
    FOLD_APPLIED,
    FOLD_CHANGES,
    FOLD_GOLD,
    FOLD_IGNORED,
    FOLD_RESOLVED_BY,
    FOLD_RESYNC,
    FOLD_TOMBSTONE,
    FOLD_VERSIONS,
    FoldPlan,
    fold_changes,
    fold_changes_arrow,
    fold_output_schema,
    fold_plan,
    gold_changes,
    history_versions,
    merge_conditions,
    resync_entries,
    tombstone_changes,
    wildcard_changes,
    wildcard_rows,
)
from pipelines.gold.resync import (
    RESYNC_SCHEMA,
    RESYNC_TABLE,
    open_rows_to_resolve,
    open_rows_to_resolve_arrow,
    replay_gap_rows,
)
from pipelines.gold.scd2 import HISTORY_KEYS, SCD_IS_CURRENT, history_changes, history_schema
from pipelines.silver import small
from pipelines.silver.job import REGISTRY_TABLE, read_registry, silver_layout
from pipelines.spec import Conf, DeleteMode, ObjectSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CHECKPOINT_TABLE",
    "GOLD_APP_PREFIX",
    "HISTORY_APP_PREFIX",
    "RESYNC_COMPACT_EVERY",
    "TOMBSTONE_APP_PREFIX",
    "GoldResult",
    "ObjectResult",
    "app_id",
    "gold_table",
    "history_table",
    "run_gold",
    "tombstone_condition",
    "tombstone_table",
]

_log = logging.getLogger(__name__)

GOLD_APP_PREFIX = "sfcdc.gold:"
TOMBSTONE_APP_PREFIX = "sfcdc.gold.tombstones:"
HISTORY_APP_PREFIX = "sfcdc.gold.history:"
CHECKPOINT_TABLE = TableRef("bronze", "sfcdc_checkpoints")
_META_SEQUENCE = "sfcdc.gold.order_by"
_META_SILVER_VERSIONS = "sfcdc.gold.silver_versions"
# Re-sync table versions between compactions of its small files.
RESYNC_COMPACT_EVERY = 25


def app_id(obj: ObjectSpec) -> str:
    """The Delta app id under which ``obj``'s gold table records the silver version."""
    return f"{GOLD_APP_PREFIX}{obj.api_name}"


def gold_table(obj: ObjectSpec) -> TableRef:
    return TableRef("gold", obj.tables.gold)


def tombstone_table(obj: ObjectSpec) -> TableRef:
    """Where hard deletes are remembered: ``<gold table>_tombstones``."""
    return TableRef("gold", f"{obj.tables.gold}_tombstones")


def history_table(obj: ObjectSpec) -> TableRef:
    """The SCD2 history: ``<gold table>_history``."""
    return TableRef("gold", f"{obj.tables.gold}_history")


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
class GoldResult:
    """What :func:`run_gold` did, per object; ``replay_gaps`` counts the whole-object
    re-sync rows recorded for replay gaps in this run."""

    objects: tuple[ObjectResult, ...]
    replay_gaps: int = 0
    not_applicable: tuple[str, ...] = ()


def _select(conf: Conf, names: Sequence[str] | None) -> tuple[list[ObjectSpec], list[str]]:
    by_name = {o.api_name: o for o in conf.objects}
    problems = []
    for name in names or ():
        obj = by_name.get(name)
        if obj is None:
            known = ", ".join(o.api_name for o in conf.objects) or "none"
            problems.append(
                f"--objects: no object {name!r} in {conf.conf_dir} (configured: {known})"
            )
        elif not obj.enabled:
            problems.append(f"--objects: {name} is disabled (enabled: false in its file)")
    if problems:
        raise ConfigError("cannot select the objects to process", problems)
    wanted = set(names or ())
    chosen = [o for o in conf.enabled_objects() if not wanted or o.api_name in wanted]
    # A platform event is an immutable event, not a record with a current state.
    events = [o.api_name for o in chosen if o.kind != "change_events"]
    reserved = {RESYNC_TABLE.name}
    clashes = [o.api_name for o in chosen if o.tables.gold in reserved]
    if clashes:
        raise ConfigError(
            f"gold table name {RESYNC_TABLE.name!r} is reserved for the re-sync table",
            [f"{name}: set tables.gold to another name" for name in clashes],
        )
    return [o for o in chosen if o.kind == "change_events"], events


def run_gold(
    engine: LakeEngine,
    conf: Conf,
    *,
    objects: Sequence[str] | None = None,
    registry_table: TableRef = REGISTRY_TABLE,
    checkpoint_table: TableRef = CHECKPOINT_TABLE,
    partitions: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> GoldResult:
    """Bring the gold tables of ``objects`` (default: every enabled change event object) up
    to date with silver. See the module docstring for the protocol. ``partitions`` is the
    fold's parallelism (default: the session's shuffle partitions); ``clock`` times the work
    and ``now`` stamps ``_cdc_updated_at`` and re-sync rows (one value per run)."""
    selected, events = _select(conf, objects)
    if events:
        _log.info("gold: platform events have no current-state table: %s", ", ".join(events))
    processed_at = now()
    registry: Mapping[str, Any] | None = None
    results = []
    gaps = _replay_gaps(engine, conf, selected, checkpoint_table, processed_at)
    for obj in selected:
        silver = TableRef("silver", obj.tables.silver)
        if not engine.exists(silver):
            _log.info("gold: %s has no silver table %s yet; nothing to do", obj.api_name, silver)
            continue
        if registry is None:
            registry = read_registry(engine, registry_table)
        runner = _ObjectRun(
            engine,
            obj,
            silver,
            registry=registry,
            processed_at=processed_at,
            partitions=partitions,
            replay_gaps=[g for g in gaps if g["object"] == obj.api_name],
            clock=clock,
        )
        results.append(runner.run())
    return GoldResult(tuple(results), len(gaps), tuple(events))


def _replay_gaps(
    engine: LakeEngine,
    conf: Conf,
    objs: Sequence[ObjectSpec],
    checkpoint_table: TableRef,
    at: datetime,
) -> list[dict[str, Any]]:
    """Re-sync rows for replay gaps not yet recorded."""
    if not objs or not engine.exists(checkpoint_table):
        return []
    topics: dict[str, list[str]] = {}
    for obj in objs:
        topics.setdefault(obj.topic, []).append(obj.api_name)
    # Every pass asks, and the checkpoint table grows with every landing batch: a filtered
    # Arrow read skips the files whose statistics rule gaps out, and needs no Spark job.
    gap_rows = engine.read_arrow(
        checkpoint_table,
        where=[("kind", "=", "replay_gap"), ("topic", "in", sorted(topics))],
    ).to_pylist()
    rows = replay_gap_rows(gap_rows, objects=topics, detected_at=at)
    if not rows or not engine.exists(RESYNC_TABLE):
        return rows
    known = set(
        engine.read_arrow(
            RESYNC_TABLE, columns=["resync_id"], where=[("reason", "=", "replay_gap")]
        )
        .column("resync_id")
        .to_pylist()
    )
    return [r for r in rows if r["resync_id"] not in known]


class _ObjectRun:
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
    ) -> None:
        self.engine = engine
        self.obj = obj
        self.silver = silver
        self.gold = gold_table(obj)
        self.registry = registry
        self.processed_at = processed_at
        self.partitions = partitions
        self.replay_gaps = replay_gaps
        self.clock = clock
        self.started = clock()
        self._mark = self.started

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
        rows: pa.Table | None = None
        df: DataFrame | None = None
        if after is not None and current == after:
            # Nothing new: the Delta log says so, no read at all.
            start = end = None
            full_read = False
        else:
            rows = self._small_appends(after, current)
            if rows is not None:
                assert current is not None
                start, end, full_read = 0 if after is None else after + 1, current, False
            else:
                changes = engine.read_appends(self.silver, after_version=after)
                start, end = changes.start_version, changes.end_version
                full_read, df = changes.full_read, changes.df
        self._step("read appends")
        if start is None or end is None:
            written = self._write_resync(None)
            _log.info(
                "gold: %s is up to date with %s version %s%s",
                self.gold,
                self.silver,
                after,
                f"; {written} replay gap re-sync rows" if written else "",
            )
            return self._result(after, resync_rows=written)
        if full_read:
            _log.warning(
                "gold: %s could not be read incrementally; folding all of it (changes gold "
                "already reflects are ignored)",
                self.silver,
            )
        schema = df.schema if df is not None else engine.schema(self.silver)
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
        engine.ensure_table(self.gold, gold_schema(body))
        self._step("plan")
        parts: _Folded
        wildcards: Sequence[Mapping[str, Any]]
        if engine.name == "local":
            if rows is None:
                assert df is not None
                rows = dataframe_to_arrow(df)
                self._step("collect changes")
            parts = self._fold_arrow(rows, schema, plan)
            wildcards = parts.wildcards
        else:
            assert df is not None
            wildcards = wildcard_changes(df)
            state, tombstones = self._state(df, everything=bool(wildcards))
            folded = fold_changes(df, state, plan=plan, tombstones=tombstones, wildcards=wildcards)
            parts = _SparkFolded(folded)
        try:
            counts = parts.counts()
            self._step("fold")
            written = self._write_resync(parts)
            self._step("re-sync")
            tombstoned = self._write_tombstones(parts, plan, end) if counts["tombstones"] else 0
            versions = self._write_history(parts, plan, body, end) if counts["versions"] else 0
            self._step("tombstones and history")
            merge = self._merge_gold(parts.gold(), plan, end, start)
            self._step("merge")
        finally:
            parts.close()
        result = self._result(
            after,
            silver_version=end,
            changes=counts["changes"] + len(wildcards),
            records=counts["records"],
            applied=counts["applied"],
            ignored=counts["ignored"],
            merge=merge,
            resync_rows=written,
            resolved=counts["resolved"],
            tombstones=tombstoned,
            versions=versions,
            skipped=False,
        )
        _log.info(
            "gold: %s <- %s versions %s..%s: %d changes of %d records (%d applied, %d already "
            "reflected): %d inserted, %d updated, %d deleted; %d re-sync rows, %d tombstones, "
            "%d history versions (%.1f s)",
            self.gold,
            self.silver,
            start,
            end,
            result.changes,
            result.records,
            result.applied,
            result.ignored,
            merge.inserted,
            merge.updated,
            merge.deleted,
            written,
            tombstoned,
            versions,
            result.duration_s,
        )
        return result

    # -- planning --------------------------------------------------------------------------

    def _plan(self) -> FoldPlan:
        obj = self.obj
        layout = silver_layout(obj, self.registry)
        scd2 = obj.gold.scd2
        try:
            return fold_plan(
                layout,
                processed_at=self.processed_at,
                sequence_by=obj.gold.sequence_by,
                deletes=obj.gold.deletes,
                track=scd2.track if scd2.enabled else None,
                partitions=self.partitions,
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

    def _small_appends(self, after: int | None, current: int | None) -> pa.Table | None:
        """The local engine's new silver rows read with pyarrow from the files the Delta
        log lists, when they are few (``None``: read them with Spark)."""
        if self.engine.name != "local" or current is None:
            return None
        return small.read_appended(
            self.engine,
            self.silver,
            after_version=after,
            until_version=current,
            max_rows=small.SMALL_BATCH_ROWS,
        )

    def _fold_arrow(self, rows: pa.Table, schema: T.StructType, plan: FoldPlan) -> _ArrowFolded:
        """The local engine's fold: the changes as Arrow (read without Spark when few, else
        collected by one Spark job), the state of the records they touch read with
        delta-rs, and the fold run here. The local engine writes from the driver anyway; a
        few hundred rows then cost no shuffle and no Python worker."""
        wildcards = wildcard_rows(rows)
        ids = pc.unique(pc.drop_null(rows.column(ID))).to_pylist()
        where: list[Condition] = [] if wildcards else [(ID, "in", ids)]

        def state(table: TableRef) -> pa.Table | None:
            if not wildcards and not ids:
                return None
            return self.engine.read_arrow(table, where=where)

        stones = tombstone_table(self.obj)
        folded = fold_changes_arrow(
            rows,
            state(self.gold),
            schema=schema,
            plan=plan,
            tombstones=state(stones) if self.engine.exists(stones) else None,
            wildcards=wildcards,
        )
        output = fold_output_schema(body_fields(schema), plan.track)
        return _ArrowFolded(folded, output, wildcards)

    def _state(self, changes: DataFrame, *, everything: bool) -> tuple[DataFrame, DataFrame | None]:
        """The gold rows and tombstones of the records ``changes`` touch (``everything``:
        all of them, for a wildcard change)."""
        from pyspark.sql import functions as F

        # The batch's ids are few next to the table's rows: broadcast them, so the gold rows
        # are filtered where they are read instead of being shuffled for the join.
        ids = F.broadcast(changes.select(ID).where(F.col(ID).isNotNull()).distinct())
        gold = self.engine.read(self.gold)
        state = gold if everything else gold.join(ids, on=ID, how="left_semi")
        tombstones = None
        stones = tombstone_table(self.obj)
        if self.engine.exists(stones):
            table = self.engine.read(stones)
            tombstones = table if everything else table.join(ids, on=ID, how="left_semi")
        return state, tombstones

    # -- writes ----------------------------------------------------------------------------

    def _write_resync(self, parts: _Folded | None) -> int:
        engine = self.engine
        pieces: list[Any] = []
        if self.replay_gaps:
            pieces.append(pa.Table.from_pylist(self.replay_gaps, schema=_RESYNC_ARROW))
        if isinstance(parts, _ArrowFolded):
            pieces.append(parts.resync())
            pairs = parts.resolved_pairs()
            if pairs and engine.exists(RESYNC_TABLE):
                existing = engine.read_arrow(
                    RESYNC_TABLE,
                    where=[("object", "=", self.obj.api_name), ("record_id", "in", sorted(pairs))],
                )
                pieces.append(
                    open_rows_to_resolve_arrow(
                        existing, pairs, object_name=self.obj.api_name, at=self.processed_at
                    )
                )
        elif parts is not None:
            pieces.append(parts.resync())
            resolved = parts.resolved(engine.spark)
            if resolved is not None and engine.exists(RESYNC_TABLE):
                pieces.append(
                    open_rows_to_resolve(
                        engine.read(RESYNC_TABLE),
                        resolved,
                        object_name=self.obj.api_name,
                        at=self.processed_at,
                    )
                )
        data = _combine(engine, pieces, RESYNC_SCHEMA)
        if data is None:
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

    def _write_tombstones(self, parts: _Folded, plan: FoldPlan, version: int) -> int:
        table = tombstone_table(self.obj)
        self.engine.ensure_table(table, tombstone_schema())
        update, delete = tombstone_condition(plan.deletes)
        metrics = self.engine.merge(
            table,
            parts.tombstones(),
            on=[ID],
            update_condition=update,
            delete_condition=delete,
            insert=plan.deletes == "hard",
            txn=Txn(f"{TOMBSTONE_APP_PREFIX}{self.obj.api_name}", version),
        )
        return metrics.inserted + metrics.updated + metrics.deleted

    def _write_history(
        self, parts: _Folded, plan: FoldPlan, body: Sequence[Any], version: int
    ) -> int:
        from pyspark.sql import functions as F

        table = history_table(self.obj)
        by_name = {f.name: f for f in body}
        tracked = [by_name[c] for c in plan.track or () if c in by_name]
        self.engine.ensure_table(table, history_schema(tracked))
        new = parts.versions(self.engine.spark)
        ids = F.broadcast(new.select(ID).distinct())
        current = (
            self.engine.read(table).where(F.col(SCD_IS_CURRENT)).join(ids, on=ID, how="left_semi")
        )
        metrics = self.engine.merge(
            table,
            history_changes(new, current),
            on=list(HISTORY_KEYS),
            txn=Txn(f"{HISTORY_APP_PREFIX}{self.obj.api_name}", version),
        )
        return metrics.inserted

    def _merge_gold(self, source: Any, plan: FoldPlan, version: int, start: int) -> MergeMetrics:
        update, delete = merge_conditions(plan.deletes)
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
        )


_RESYNC_ARROW = spark_schema_to_arrow(RESYNC_SCHEMA)
_FOLD_COUNTS = {
    "changes": FOLD_CHANGES,
    "applied": FOLD_APPLIED,
    "ignored": FOLD_IGNORED,
}


class _Folded(Protocol):
    """A fold's output, computed once, taken apart for the writes."""

    def counts(self) -> dict[str, int]: ...
    def gold(self) -> Any: ...
    def tombstones(self) -> Any: ...
    def resync(self) -> Any: ...
    def resolved(self, spark: SparkSession) -> DataFrame | None: ...
    def versions(self, spark: SparkSession) -> DataFrame: ...
    def close(self) -> None: ...


class _SparkFolded:
    """The spark engine's view: the fold cached while its parts are merged as DataFrames."""

    def __init__(self, folded: DataFrame) -> None:
        self.df = folded.persist()

    def counts(self) -> dict[str, int]:
        from pyspark.sql import functions as F

        df = self.df
        row = df.agg(
            F.count(F.lit(1)).alias("records"),
            *[F.sum(F.col(c)).alias(k) for k, c in _FOLD_COUNTS.items()],
            F.count(F.col(FOLD_TOMBSTONE)).alias("tombstones"),
            F.sum(F.size(F.col(FOLD_VERSIONS))).alias("versions"),
            F.count(F.col(FOLD_RESOLVED_BY)).alias("resolved"),
        ).collect()[0]
        return {k: int(row[k] or 0) for k in row.asDict()}

    def gold(self) -> DataFrame:
        return gold_changes(self.df)

    def tombstones(self) -> DataFrame:
        return tombstone_changes(self.df)

    def resync(self) -> DataFrame:
        return resync_entries(self.df)

    def resolved(self, spark: SparkSession) -> DataFrame | None:
        from pyspark.sql import functions as F

        rows = self.df.where(F.col(FOLD_RESOLVED_BY).isNotNull()).select(
            F.col(ID).alias("record_id"), F.col(FOLD_RESOLVED_BY).alias("resolved_by")
        )
        return rows if rows.take(1) else None

    def versions(self, spark: SparkSession) -> DataFrame:
        return history_versions(self.df)

    def close(self) -> None:
        self.df.unpersist()


class _ArrowFolded:
    """The local engine's view: the fold as Arrow (the local engine writes Arrow anyway),
    split there with no Spark job; ``wildcards`` are the batch's wildcard changes."""

    def __init__(
        self, table: pa.Table, schema: T.StructType, wildcards: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        self.schema = schema
        self.table = table
        self.wildcards = list(wildcards)

    def _where(self, column: str) -> pa.Table:
        return self.table.filter(pc.is_valid(self.table.column(column)))

    def counts(self) -> dict[str, int]:
        t = self.table
        out = {"records": t.num_rows}
        for key, column in _FOLD_COUNTS.items():
            out[key] = int(pc.sum(t.column(column)).as_py() or 0)
        out["tombstones"] = int(pc.count(t.column(FOLD_TOMBSTONE)).as_py())
        out["versions"] = int(pc.sum(pc.list_value_length(t.column(FOLD_VERSIONS))).as_py() or 0)
        out["resolved"] = int(pc.count(t.column(FOLD_RESOLVED_BY)).as_py())
        return out

    def gold(self) -> pa.Table:
        names = [n for n in self.table.column_names if not n.startswith("_fold_")]
        return self._where(FOLD_GOLD).select(names)

    def tombstones(self) -> pa.Table:
        return self._where(FOLD_TOMBSTONE).select([f.name for f in tombstone_schema().fields])

    def _flat(self, column: str) -> pa.Table:
        values = pc.list_flatten(self.table.column(column))
        element = self.table.schema.field(column).type.value_type
        if len(values) == 0:
            return pa.schema(list(element)).empty_table()
        return pa.Table.from_struct_array(values.combine_chunks())

    def resync(self) -> pa.Table:
        return self._flat(FOLD_RESYNC)

    def resolved_pairs(self) -> dict[str, str]:
        """Record id -> event id of the full image that resolves its open re-sync rows."""
        rows = self._where(FOLD_RESOLVED_BY)
        return dict(
            zip(
                rows.column(ID).to_pylist(),
                rows.column(FOLD_RESOLVED_BY).to_pylist(),
                strict=True,
            )
        )

    def resolved(self, spark: SparkSession) -> DataFrame | None:
        rows = self._where(FOLD_RESOLVED_BY)
        if rows.num_rows == 0:
            return None
        pairs = pa.table(
            {"record_id": rows.column(ID), "resolved_by": rows.column(FOLD_RESOLVED_BY)}
        )
        return arrow_to_dataframe(spark, pairs)

    def versions(self, spark: SparkSession) -> DataFrame:
        element = self.schema[FOLD_VERSIONS].dataType
        assert isinstance(element, T.ArrayType) and isinstance(element.elementType, T.StructType)
        return arrow_to_dataframe(spark, self._flat(FOLD_VERSIONS), element.elementType)

    def close(self) -> None:
        self.table = self.table.slice(0, 0)


def _combine(engine: LakeEngine, pieces: Sequence[Any], schema: T.StructType) -> Any:
    """Arrow tables and DataFrames of one schema as one source for ``engine.merge``: Arrow
    for the local engine, a DataFrame for Spark; ``None`` when they hold no row."""
    target = spark_schema_to_arrow(schema)
    if engine.name == "local":
        tables = [
            (p if isinstance(p, pa.Table) else dataframe_to_arrow(p)).select(target.names)
            for p in pieces
        ]
        tables = [t.cast(target) for t in tables if t.num_rows]
        return pa.concat_tables(tables) if tables else None
    frames = [
        arrow_to_dataframe(engine.spark, p, schema) if isinstance(p, pa.Table) else p
        for p in pieces
    ]
    if not frames:
        return None
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    return rows if rows.take(1) else None
