"""The fold over tables: the pure functions the gold job has the engine run.

:mod:`pipelines.gold.fold` defines what a record's changes do to it (:func:`fold_record`).
This module applies that to tables of rows, as functions over Arrow data that read no table
and write nothing, so both engines run the same code -- in this process (local) or on Spark
executors (spark):

1. :class:`ChangeRows` and :class:`StateRows` bring the batch's silver rows, the gold rows
   and the tombstones of the records they touch into one row type
   (:func:`~pipelines.gold.plan.fold_input_schema`), each tagged with its role;
2. :class:`FoldTable` folds a table holding every row of the records it sees (the engine's
   :meth:`~pipelines.engines.base.LakeEngine.map_groups` by ``Id``) into one output row per
   record (:func:`~pipelines.gold.plan.fold_output_schema`). Records a batch only creates,
   and records a batch's wildcard changes set the same way, are built column-wise; the rest
   are folded one record at a time in Python;
3. :class:`GoldPart`, :class:`TombstonePart`, :class:`ResyncPart`, :class:`VersionsPart`,
   :class:`ResolvedPart` and :class:`FoldCounts` take the output apart for the writes.

Wildcard changes (record id ``001*``) travel with :class:`FoldTable` (every partition applies
them to each record that exists at their point of the order), so the state must then hold the
whole gold table; :class:`Wildcards` finds them in a batch.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.engines.arrow import fit_to_schema, spark_schema_to_arrow
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
    RESYNC_REASON,
    UPDATED_AT,
    body_fields,
    tombstone_schema,
)
from pipelines.gold.columnwise import fold_columnwise, null_if_empty
from pipelines.gold.fold import OVERFLOW, fold_record, in_order
from pipelines.gold.order_keys import encode_order_key, order_keys
from pipelines.gold.plan import (
    CHANGE_KEY,
    CHANGE_TYPE,
    CHANGED_FIELDS,
    COMMIT_NUMBER,
    COMMIT_TS,
    DIFF_FIELDS,
    EVENT_ID,
    FOLD_APPLIED,
    FOLD_CHANGES,
    FOLD_GOLD,
    FOLD_IGNORED,
    FOLD_RESOLVED_BY,
    FOLD_RESYNC,
    FOLD_TOMBSTONE,
    FOLD_VERSIONS,
    IS_WILDCARD,
    NULLED_FIELDS,
    REPLAY_ID,
    ROLE,
    ROLE_CHANGE,
    ROLE_GOLD,
    ROLE_TOMBSTONE,
    FoldPlan,
    change_columns,
    check_plan,
    fold_output_schema,
)

__all__ = [
    "FOLD_COUNTS_SCHEMA",
    "RESOLVED_SCHEMA",
    "ChangeRows",
    "FoldCounts",
    "FoldTable",
    "GoldPart",
    "ResolvedPart",
    "ResyncPart",
    "StateRows",
    "TombstonePart",
    "VersionsPart",
    "Wildcards",
]


# ---------------------------------------------------------------------------- the input


class ChangeRows:
    """Silver rows -> fold input rows with the change role (wildcard changes left out when
    the batch's wildcards travel with :class:`FoldTable`)."""

    def __init__(self, schema: T.StructType, *, without_wildcards: bool) -> None:
        self.schema = schema
        self.without_wildcards = without_wildcards

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_schema_to_arrow(self.schema)
        for batch in batches:
            table = pa.Table.from_batches([batch])
            if self.without_wildcards:
                table = table.filter(pc.invert(pc.fill_null(table.column(IS_WILDCARD), False)))
            table = table.append_column(ROLE, pa.repeat(pa.scalar(ROLE_CHANGE), table.num_rows))
            yield from fit_to_schema(table, target).to_batches()


class StateRows:
    """Gold rows (role ``g``) or tombstones (role ``t``) -> fold input rows: columns found
    case-insensitively, absent ones null, each in the input's type."""

    def __init__(self, schema: T.StructType, *, role: str) -> None:
        self.schema = schema
        self.role = role

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_schema_to_arrow(self.schema)
        for batch in batches:
            table = pa.Table.from_batches([batch])
            table = table.append_column(ROLE, pa.repeat(pa.scalar(self.role), table.num_rows))
            yield from fit_to_schema(table, target).to_batches()


class Wildcards:
    """Silver rows -> its wildcard changes (``_cdc_is_wildcard``) as rows of ``schema``
    (silver's latest: rows read up to an earlier version may lack its newest columns)."""

    def __init__(self, schema: T.StructType) -> None:
        self.schema = schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_schema_to_arrow(self.schema)
        for batch in batches:
            rows = batch.filter(pc.fill_null(batch.column(IS_WILDCARD), False))
            if rows.num_rows:
                yield from fit_to_schema(pa.Table.from_batches([rows]), target).to_batches()


# ----------------------------------------------------------------------------- folding


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for one fold. A fold makes millions of short-lived
    objects (values, row tuples), which refcounting frees; the collector still walks every
    live one each time its allocation counters trip, about a fifth of a fold's time in
    profiles. A fold makes no cycles worth collecting in its few seconds."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class FoldTable:
    """The fold of a table of fold input rows holding every row of the records it sees (all
    rows of a record in one call): one output row per record the changes touch, and one per
    GAP_OVERFLOW (null ``Id``). ``silver`` is the silver schema the changes came with.

    Records a batch only creates, the plainest others (:mod:`pipelines.gold.columnwise`)
    and records only a batch's wildcard changes touch are folded column-wise;
    ``columnwise=False`` folds every record one by one with
    :func:`~pipelines.gold.fold.fold_record`, the definition those paths must equal."""

    def __init__(
        self,
        plan: FoldPlan,
        silver: T.StructType,
        wildcards: Sequence[Mapping[str, Any]] = (),
        *,
        columnwise: bool = True,
    ) -> None:
        body = body_fields(silver)
        self.columnwise = columnwise
        check_plan(plan, body, silver)
        self.plan = plan
        self.columns = change_columns(plan, silver)
        self.body = tuple(f.name for f in body)
        self.output = fold_output_schema(body, plan.track)
        self.function = _FoldFunction(
            plan, self.body, spark_schema_to_arrow(self.output), wildcards
        )

    def __call__(self, combined: pa.Table) -> pa.Table:
        with _collector_paused():
            return self._fold(combined)

    def _fold(self, combined: pa.Table) -> pa.Table:
        role = combined.column(ROLE)
        schema = spark_schema_to_arrow(self.output)
        rows = combined.filter(pc.equal(role, ROLE_CHANGE))
        rows = rows.select([*self.columns, ROLE])
        gold_rows = combined.filter(pc.equal(role, ROLE_GOLD))
        stones = combined.filter(pc.equal(role, ROLE_TOMBSTONE))
        function = self.function
        parts = [rows]
        wildcard_only: pa.Table | None = None
        if gold_rows.num_rows:
            if function.wildcards and self.columnwise:
                gold_rows, wildcard_only = _wildcard_only(
                    gold_rows,
                    rows,
                    stones,
                    plan=self.plan,
                    body=self.body,
                    wildcards=function.wildcards,
                    schema=schema,
                )
            parts.append(gold_rows)
        if stones.num_rows:
            parts.append(stones)
        created: pa.Table | None = None
        columnwise: pa.Table | None = None
        if self.columnwise and not function.wildcards and self.plan.track is None:
            known = [t.column(ID) for t in parts[1:]]
            parts[0], created = _lone_creates(rows, known, plan=self.plan, schema=schema)
            parts[0], gold_left, columnwise = fold_columnwise(
                parts[0],
                order_keys(parts[0], self.plan.order_by),
                gold_rows,
                stones,
                plan=self.plan,
                body=self.body,
                schema=schema,
            )
            if gold_rows.num_rows:
                parts[1] = gold_left
        combined = pa.concat_tables(parts, promote_options="default")
        # The fold needs each record's rows next to each other, not in any order among them.
        combined = combined.sort_by([(ID, "ascending")])
        batches = list(function(iter(combined.to_batches(max_chunksize=10_000))))
        folded = pa.Table.from_batches(batches, schema=schema)
        extra = [t for t in (wildcard_only, created, columnwise) if t is not None and t.num_rows]
        if not extra:
            return folded
        return pa.concat_tables([folded, *extra])


def _lone_creates(
    changes: pa.Table, known: Sequence[pa.ChunkedArray], *, plan: FoldPlan, schema: pa.Schema
) -> tuple[pa.Table, pa.Table | None]:
    """Split a batch's change rows (no wildcards, no SCD2): ``(rows to fold one by one,
    folded rows)``. A record the batch creates and changes no further, with no gold row or
    tombstone (ids in ``known``), is its CREATE's full image, stamped: a quarter of a
    typical batch, built column-wise here instead of one record at a time in Python -- the
    same rows :class:`_FoldFunction` makes of them."""
    import pyarrow.compute as pc

    ids = changes.column(ID)
    if changes.num_rows == 0:
        return changes, None
    counts = changes.select([ID]).group_by(ID).aggregate([(ID, "count")])
    single = counts.filter(pc.equal(counts.column(f"{ID}_count"), 1)).column(ID)
    # A change without a record id is not a record's (the per-record fold flags it).
    mask = pc.and_(pc.is_valid(ids), pc.is_in(ids, value_set=pc.drop_null(single)))
    mask = pc.and_(mask, pc.equal(changes.column(CHANGE_TYPE), "CREATE"))
    for other in known:
        mask = pc.and_(mask, pc.invert(pc.is_in(ids, value_set=pc.drop_null(other))))
    mask = pc.fill_null(mask, False)
    lone = changes.filter(mask)
    n = lone.num_rows
    if n == 0:
        return changes, None
    keys = order_keys(lone, plan.order_by)
    stamped = {
        ID: lone.column(ID),
        LAST_CHANGE_TYPE: lone.column(CHANGE_TYPE),
        LAST_COMMIT_TS: lone.column(COMMIT_TS),
        LAST_COMMIT_NUMBER: lone.column(COMMIT_NUMBER),
        LAST_REPLAY_ID: lone.column(REPLAY_ID),
        LAST_EVENT_ID: lone.column(EVENT_ID),
        ORDER_KEY: keys,
    }
    constants: dict[str, Any] = {
        DELETED: False,
        DELETED_AT: None,
        NEEDS_RESYNC: False,
        RESYNC_REASON: None,
        UPDATED_AT: plan.processed_at,
        FOLD_GOLD: "upsert",
        FOLD_TOMBSTONE: None,
        FOLD_RESYNC: [],
        FOLD_VERSIONS: [],
        FOLD_RESOLVED_BY: None,
        FOLD_CHANGES: 1,
        FOLD_APPLIED: 1,
        FOLD_IGNORED: 0,
    }
    arrays = []
    for f in schema:
        if f.name in stamped:
            arrays.append(stamped[f.name].cast(f.type))
        elif f.name in constants:
            arrays.append(pa.repeat(pa.scalar(constants[f.name], f.type), n))
        elif f.name in lone.column_names:
            column = lone.column(f.name).cast(f.type)
            arrays.append(null_if_empty(column) if f.name in plan.structs else column)
        else:
            return changes, None  # a column this shortcut does not know how to fill
    return changes.filter(pc.invert(mask)), pa.Table.from_arrays(arrays, schema=schema)


_STAMPED = (
    LAST_CHANGE_TYPE,
    LAST_COMMIT_TS,
    LAST_COMMIT_NUMBER,
    LAST_REPLAY_ID,
    LAST_EVENT_ID,
    ORDER_KEY,
    UPDATED_AT,
)


def _wildcard_template(
    plan: FoldPlan, body: Sequence[str], wildcards: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], frozenset[str], str, Any, int] | None:
    """What the batch's wildcard changes make of a record that has no other change, when
    that does not depend on the record: ``(row, columns, first key, first event id,
    count)`` -- the folded row of a blank record, the columns the wildcards set, the order
    key and event id of the first one applied, how many apply. ``None`` when a wildcard
    needs the record's own values (a diff, a child of a compound), flags it, or the
    wildcards do not all apply one after the other; each record is then folded alone."""
    if plan.track is not None:
        return None  # SCD2 versions carry each record's tracked values
    keyed = in_order(wildcards, lambda c: c[CHANGE_KEY])
    keys = [k for k, _ in keyed]
    if not keyed or any(a >= b for a, b in itertools.pairwise(keys)):
        return None
    columns: set[str] = set()
    for _key, change in keyed:
        if change.get(CHANGE_TYPE) == OVERFLOW or change.get(DIFF_FIELDS):
            return None
        for path in (*(change.get(CHANGED_FIELDS) or ()), *(change.get(NULLED_FIELDS) or ())):
            targets = plan.targets.get(path)
            if targets is None or any(t.child is not None for t in targets):
                return None
            columns.update(t.column for t in targets)
            columns.update(plan.clears.get(path, ()))
    blank = {ID: "", DELETED: False, NEEDS_RESYNC: False}
    folded = fold_record(plan, body, "", gold=blank, tombstone=None, changes=[c for _, c in keyed])
    if folded.row is None or folded.resync or folded.applied != len(keyed):
        return None
    return folded.row, frozenset(columns), keys[0], keyed[0][1].get(EVENT_ID), len(keyed)


def _wildcard_only(
    gold: pa.Table,
    changes: pa.Table,
    tombstones: pa.Table | None,
    *,
    plan: FoldPlan,
    body: Sequence[str],
    wildcards: Sequence[Mapping[str, Any]],
    schema: pa.Schema,
) -> tuple[pa.Table, pa.Table | None]:
    """Split the gold rows of a batch with wildcard changes: ``(rows to fold one by one,
    folded rows)``. A wildcard touches every record of the table, and most have no other
    change in the batch: those whose row the wildcards all apply to get the same values
    (:func:`_wildcard_template`), set column-wise here instead of folding each record in
    Python -- the same rows :class:`_FoldFunction` makes of them."""
    import pyarrow.compute as pc

    template = _wildcard_template(plan, body, wildcards)
    if template is None or gold.num_rows == 0:
        return gold, None
    row, columns, first_key, first_event, count = template
    ids = gold.column(ID)
    alone = pc.invert(pc.is_in(ids, value_set=pc.drop_null(changes.column(ID))))
    if tombstones is not None and tombstones.num_rows:
        alone = pc.and_(alone, pc.invert(pc.is_in(ids, value_set=tombstones.column(ID))))
    key = gold.column(ORDER_KEY)
    alone = pc.and_(alone, pc.or_(pc.is_null(key), pc.less(key, first_key)))
    if first_event is not None:
        last = gold.column(LAST_EVENT_ID)
        alone = pc.and_(alone, pc.or_(pc.is_null(last), pc.not_equal(last, first_event)))
    if plan.deletes == "hard":
        # A deleted row of gold under hard deletes is deleted by the MERGE instead.
        alone = pc.and_(alone, pc.invert(pc.fill_null(gold.column(DELETED), False)))
    alone = pc.fill_null(alone, False)
    fast = gold.filter(alone)
    if fast.num_rows == 0:
        return gold, None
    n = fast.num_rows
    constants: dict[str, Any] = {
        FOLD_GOLD: "upsert",
        FOLD_TOMBSTONE: None,
        FOLD_RESYNC: [],
        FOLD_VERSIONS: [],
        FOLD_RESOLVED_BY: None,
        FOLD_CHANGES: 0,
        FOLD_APPLIED: count,
        FOLD_IGNORED: 0,
    }
    constants.update({c: row[c] for c in (*columns, *_STAMPED)})
    arrays = []
    for f in schema:
        if f.name in constants:
            arrays.append(pa.repeat(pa.scalar(constants[f.name], f.type), n))
        elif f.name in (DELETED, NEEDS_RESYNC):
            arrays.append(pc.fill_null(fast.column(f.name), False).cast(f.type))
        else:
            arrays.append(fast.column(f.name).cast(f.type))
    folded = pa.Table.from_arrays(arrays, schema=schema)
    return gold.filter(pc.invert(alone)), folded


class _FoldFunction:
    """The ``mapInArrow`` function: groups the sorted rows of a partition by ``Id`` and folds
    each group. Picklable (plan, names, schema, wildcard changes)."""

    def __init__(
        self,
        plan: FoldPlan,
        body: tuple[str, ...],
        schema: pa.Schema,
        wildcards: Sequence[Mapping[str, Any]],
    ) -> None:
        self.plan = plan
        self.body = body
        self.schema = schema
        self.wildcards = [
            {**w, CHANGE_KEY: encode_order_key(w.get(c) for c in plan.order_by)} for w in wildcards
        ]

    def _keys(self, batch: pa.RecordBatch) -> list[str]:
        keys: list[str] = order_keys(pa.Table.from_batches([batch]), self.plan.order_by).to_pylist()
        return keys

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out: list[dict[str, Any]] = []
        group: list[dict[str, Any]] = []
        current: object = _NO_GROUP
        for batch in batches:
            keys = self._keys(batch)
            for row, key in zip(batch.to_pylist(), keys, strict=True):
                row[CHANGE_KEY] = key
                rid = row.get(ID)
                if rid != current and group:
                    self._emit(current, group, out)
                    group = []
                current = rid
                group.append(row)
            if len(out) >= 10_000:
                yield pa.RecordBatch.from_pylist(out, schema=self.schema)
                out = []
        if group:
            self._emit(current, group, out)
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=self.schema)

    def _emit(
        self, record_id: object, group: list[dict[str, Any]], out: list[dict[str, Any]]
    ) -> None:
        gold = tombstone = None
        changes = []
        for row in group:
            role = row[ROLE]
            if role == ROLE_GOLD:
                gold = row
            elif role == ROLE_TOMBSTONE:
                tombstone = row
            else:
                if row.get(IS_WILDCARD):
                    raise ValueError(
                        f"{self.plan.object_name}: wildcard change {row.get(EVENT_ID)} reached "
                        "the per-record fold; pass the batch's wildcard changes with "
                        "fold_rows(wildcards=...)"
                    )
                changes.append(row)
        count = len(changes)
        if self.wildcards and record_id is not None:
            changes.extend(self.wildcards)
        if not changes:
            return
        rid = None if record_id is None else str(record_id)
        folded = fold_record(
            self.plan, self.body, rid, gold=gold, tombstone=tombstone, changes=changes
        )
        if folded.row is None and not folded.resync:
            return
        if folded.applied == 0 and not folded.resync and count == 0:
            return  # only wildcards, none of which changed this record
        row_out: dict[str, Any] = dict(folded.row) if folded.row is not None else {ID: rid}
        row_out[FOLD_GOLD] = folded.gold
        row_out[FOLD_TOMBSTONE] = folded.tombstone
        row_out[FOLD_RESYNC] = folded.resync
        row_out[FOLD_VERSIONS] = folded.versions
        row_out[FOLD_RESOLVED_BY] = folded.resolved_by
        row_out[FOLD_CHANGES] = count
        row_out[FOLD_APPLIED] = folded.applied
        row_out[FOLD_IGNORED] = folded.ignored
        out.append(row_out)


_NO_GROUP = object()


# ------------------------------------------------------------------------- taking apart

FOLD_COUNTS_SCHEMA = T.StructType(
    [
        T.StructField("records", T.LongType()),
        T.StructField("changes", T.LongType()),
        T.StructField("applied", T.LongType()),
        T.StructField("ignored", T.LongType()),
        T.StructField("tombstones", T.LongType()),
        T.StructField("versions", T.LongType()),
        T.StructField("resolved", T.LongType()),
    ]
)
RESOLVED_SCHEMA = T.StructType(
    [T.StructField("record_id", T.StringType()), T.StructField("resolved_by", T.StringType())]
)
_FOLD_COUNTS = spark_schema_to_arrow(FOLD_COUNTS_SCHEMA)


def _sum(column: pa.Array) -> int:
    return int(pc.sum(column).as_py() or 0)


class FoldCounts:
    """Fold output -> per batch: records, changes, applied and ignored changes, tombstones,
    SCD2 versions and records whose open re-sync rows a full image resolves."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            values = [
                b.num_rows,
                _sum(b.column(FOLD_CHANGES)),
                _sum(b.column(FOLD_APPLIED)),
                _sum(b.column(FOLD_IGNORED)),
                b.num_rows - b.column(FOLD_TOMBSTONE).null_count,
                _sum(pc.list_value_length(b.column(FOLD_VERSIONS))),
                b.num_rows - b.column(FOLD_RESOLVED_BY).null_count,
            ]
            yield pa.RecordBatch.from_arrays(
                [pa.array([v], pa.int64()) for v in values], schema=_FOLD_COUNTS
            )


class GoldPart:
    """Fold output -> the rows to MERGE into the gold table (gold columns): upserts, and with
    hard deletes the rows to delete (``_cdc_is_deleted`` true)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            rows = b.filter(pc.is_valid(b.column(FOLD_GOLD)))
            if rows.num_rows:
                yield rows.select(self.names)


class TombstonePart:
    """Fold output -> the rows to MERGE into the tombstone table: new or newer deletes
    (upserts) and records live again (``_cdc_is_deleted`` false: their tombstone goes)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        names = [f.name for f in tombstone_schema().fields]
        for b in batches:
            rows = b.filter(pc.is_valid(b.column(FOLD_TOMBSTONE)))
            if rows.num_rows:
                yield rows.select(names)


def _flatten(batch: pa.RecordBatch, column: str) -> pa.RecordBatch | None:
    values = pc.list_flatten(batch.column(column))
    if len(values) == 0:
        return None
    return pa.RecordBatch.from_struct_array(values)


class ResyncPart:
    """Fold output -> the re-sync rows the fold found
    (:data:`~pipelines.gold.resync.RESYNC_SCHEMA`)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            rows = _flatten(b, FOLD_RESYNC)
            if rows is not None:
                yield rows


class VersionsPart:
    """Fold output -> the SCD2 versions the fold started
    (:func:`~pipelines.gold.plan.versions_schema`)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            rows = _flatten(b, FOLD_VERSIONS)
            if rows is not None:
                yield rows


class ResolvedPart:
    """Fold output -> record id and the event id of the full image that makes the record
    exact again (:data:`RESOLVED_SCHEMA`)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            rows = b.filter(pc.is_valid(b.column(FOLD_RESOLVED_BY)))
            if rows.num_rows:
                yield pa.RecordBatch.from_arrays(
                    [rows.column(ID), rows.column(FOLD_RESOLVED_BY)],
                    names=["record_id", "resolved_by"],
                )
