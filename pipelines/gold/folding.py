"""The fold over tables: the pure functions the gold job has the engine run.

:mod:`pipelines.gold.fold` defines what a record's changes do to it and folds a table of
them (:func:`~pipelines.gold.fold.fold_table`). This module runs that over tables of rows,
as functions over Arrow data that read no table and write nothing, so both engines run the
same code -- in this process (local) or on Spark executors (spark):

1. :class:`ChangeRows` and :class:`StateRows` bring the batch's silver rows, the gold rows
   and the tombstones of the records they touch into one row type
   (:func:`~pipelines.gold.plan.fold_input_schema`), each tagged with its role;
2. :class:`FoldTable` folds a table holding every row of the records it sees (the engine's
   :meth:`~pipelines.engines.base.LakeEngine.map_groups` by ``Id``) into one output row per
   record (:func:`~pipelines.gold.plan.fold_output_schema`), column-wise;
3. :class:`GoldPart`, :class:`TombstonePart`, :class:`ResyncPart`, :class:`VersionsPart`,
   :class:`ResolvedPart` and :class:`FoldCounts` take the output apart for the writes.

Wildcard changes (record id ``001*``) travel with :class:`FoldTable` (every partition applies
them to each record that exists at their point of the order), so the state must then hold the
whole gold table; :class:`Wildcards` finds them in a batch. :class:`DiffedFields` finds the
fields a batch diff-encodes: the fold reads those columns from gold (a diff applies to the
value before it), and may leave others to the gold MERGE (``FOLD_SET``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.engines.arrow import fit_to_schema, spark_schema_to_arrow
from pipelines.engines.base import Fits, RowsFlagged, RowsWhere
from pipelines.gold.columns import (
    ID,
    body_fields,
    tombstone_schema,
)
from pipelines.gold.fold import fold_table
from pipelines.gold.order_keys import encode_order_key
from pipelines.gold.plan import (
    DIFF_FIELDS,
    FOLD_APPLIED,
    FOLD_CHANGES,
    FOLD_GOLD,
    FOLD_IGNORED,
    FOLD_RESOLVED_BY,
    FOLD_RESYNC,
    FOLD_TOMBSTONE,
    FOLD_VERSIONS,
    IS_WILDCARD,
    ROLE,
    ROLE_CHANGE,
    ROLE_GOLD,
    ROLE_TOMBSTONE,
    FoldPlan,
    change_columns,
    check_plan,
    fold_input_schema,
    fold_output_schema,
)

__all__ = [
    "DIFFED_SCHEMA",
    "FOLD_COUNTS_SCHEMA",
    "RESOLVED_SCHEMA",
    "ChangeRows",
    "DiffedFields",
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

    fits = Fits(((ROLE, ROLE_CHANGE),))

    def __init__(self, schema: T.StructType, *, without_wildcards: bool) -> None:
        self.schema = schema
        self.without_wildcards = without_wildcards
        if without_wildcards:
            self.keeps = RowsFlagged(IS_WILDCARD, flagged=False)

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
        self.fits = Fits(((ROLE, role),))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_schema_to_arrow(self.schema)
        for batch in batches:
            table = pa.Table.from_batches([batch])
            table = table.append_column(ROLE, pa.repeat(pa.scalar(self.role), table.num_rows))
            yield from fit_to_schema(table, target).to_batches()


class Wildcards:
    """Silver rows -> its wildcard changes (``_cdc_is_wildcard``) as rows of ``schema``
    (silver's latest: rows read up to an earlier version may lack its newest columns)."""

    keeps = RowsFlagged(IS_WILDCARD, flagged=True)
    fits = Fits()

    def __init__(self, schema: T.StructType) -> None:
        self.schema = schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_schema_to_arrow(self.schema)
        for batch in batches:
            rows = batch.filter(pc.fill_null(batch.column(IS_WILDCARD), False))
            if rows.num_rows:
                yield from fit_to_schema(pa.Table.from_batches([rows]), target).to_batches()


DIFFED_SCHEMA = T.StructType([T.StructField("field", T.StringType())])
_DIFFED = spark_schema_to_arrow(DIFFED_SCHEMA)


class DiffedFields:
    """Silver rows -> the distinct field paths of their ``diffFields`` (per batch)."""

    reads = (DIFF_FIELDS,)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            paths = pc.unique(pc.list_flatten(batch.column(DIFF_FIELDS)))
            if len(paths):
                yield pa.RecordBatch.from_arrays([paths.cast(pa.string())], schema=_DIFFED)


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
    rows of a record in one call): one output row per record the changes touch, and one for
    the changes without a record id (GAP_OVERFLOW). ``silver`` is the silver schema the
    changes came with; ``wildcards`` the batch's wildcard changes, which apply to every
    record of the table (:func:`~pipelines.gold.fold.fold_table`)."""

    def __init__(
        self,
        plan: FoldPlan,
        silver: T.StructType,
        wildcards: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        body = body_fields(silver)
        check_plan(plan, body, silver)
        self.plan = plan
        self.columns = change_columns(plan, silver)
        self.body = tuple(f.name for f in body)
        self.output = fold_output_schema(body, plan.track)
        self.schema = spark_schema_to_arrow(self.output)
        inputs = spark_schema_to_arrow(fold_input_schema(plan, silver))
        changes = pa.schema([inputs.field(c) for c in self.columns])
        self.wildcards: pa.Table | None = None
        self.wildcard_keys: pa.Array | None = None
        if wildcards:
            self.wildcards = pa.Table.from_pylist(
                [{c: w.get(c) for c in self.columns} for w in wildcards], schema=changes
            )
            self.wildcard_keys = pa.array(
                [encode_order_key(w.get(c) for c in plan.order_by) for w in wildcards],
                pa.string(),
            )

    def __call__(self, combined: pa.Table) -> pa.Table:
        with _collector_paused():
            return self._fold(combined)

    def _fold(self, combined: pa.Table) -> pa.Table:
        role = combined.column(ROLE)
        rows = combined.filter(pc.equal(role, ROLE_CHANGE)).select(self.columns)
        return fold_table(
            rows,
            combined.filter(pc.equal(role, ROLE_GOLD)),
            combined.filter(pc.equal(role, ROLE_TOMBSTONE)),
            plan=self.plan,
            body=self.body,
            schema=self.schema,
            wildcards=self.wildcards,
            wildcard_keys=self.wildcard_keys,
        )


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

    reads = (
        FOLD_CHANGES,
        FOLD_APPLIED,
        FOLD_IGNORED,
        FOLD_TOMBSTONE,
        FOLD_VERSIONS,
        FOLD_RESOLVED_BY,
    )

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

    keeps = RowsWhere(FOLD_GOLD, null=False)

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.selects = tuple(self.names)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            rows = b.filter(pc.is_valid(b.column(FOLD_GOLD)))
            if rows.num_rows:
                yield rows.select(self.names)


class TombstonePart:
    """Fold output -> the rows to MERGE into the tombstone table: new or newer deletes
    (upserts) and records live again (``_cdc_is_deleted`` false: their tombstone goes)."""

    keeps = RowsWhere(FOLD_TOMBSTONE, null=False)
    selects = tuple(f.name for f in tombstone_schema().fields)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            rows = b.filter(pc.is_valid(b.column(FOLD_TOMBSTONE)))
            if rows.num_rows:
                yield rows.select(list(self.selects))


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
