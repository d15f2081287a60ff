"""Gold's steps as dataflow over an engine's rows: the fold and the SCD2 history changes.

Each function composes the pure Arrow functions of :mod:`pipelines.gold.folding` and
:mod:`pipelines.gold.scd2` with the engine's ``map_batches`` / ``union`` / ``map_groups``, so
the same definition runs in this process on the local engine and on executors on the spark
engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.engines.arrow import fit_to_schema, spark_schema_to_arrow
from pipelines.engines.base import Fits, LakeEngine, Rows, TableRef
from pipelines.gold.columns import ID, gold_schema
from pipelines.gold.folding import (
    DIFFED_SCHEMA,
    ChangeRows,
    DiffedFields,
    FoldTable,
    StateRows,
    Wildcards,
)
from pipelines.gold.plan import (
    ROLE_GOLD,
    ROLE_TOMBSTONE,
    FoldPlan,
    fold_input_schema,
    kept_columns,
)
from pipelines.gold.scd2 import (
    CURRENT_VERSION,
    HISTORY_ROLE,
    NEW_VERSION,
    HistoryChanges,
    history_input_schema,
)

__all__ = [
    "batch_diffs",
    "batch_wildcards",
    "fold_counts",
    "fold_rows",
    "gold_kept",
    "gold_read",
    "history_changes",
]


def batch_wildcards(
    engine: LakeEngine, changes: Rows, schema: T.StructType
) -> list[dict[str, Any]]:
    """The wildcard changes (record id ``001*``) of a batch of silver rows of ``schema``,
    collected for :func:`fold_rows` (Salesforce sends few: lossy field type conversions)."""
    rows: list[dict[str, Any]] = engine.to_arrow(
        engine.map_batches(changes, Wildcards(schema), schema)
    ).to_pylist()
    return rows


def batch_diffs(engine: LakeEngine, changes: Rows) -> set[str]:
    """The field paths a batch of silver rows diff-encodes (``diffFields``; few fields, and
    only long text ones, ever are)."""
    found = engine.to_arrow(engine.map_batches(changes, DiffedFields(), DIFFED_SCHEMA))
    return {p for p in found.column(0).to_pylist() if p is not None}


def gold_kept(
    engine: LakeEngine,
    gold: TableRef,
    changes: Rows,
    *,
    plan: FoldPlan,
    body: Sequence[T.StructField],
    wildcards: Sequence[Mapping[str, Any]] = (),
) -> tuple[str, ...]:
    """The columns of the ``gold`` table the fold of a batch of silver ``changes`` need not
    read, leaving them to the gold MERGE to keep (``FOLD_SET``; none: it reads whole rows).
    With wildcard changes the fold reads the whole table anyway, and a table whose columns are
    not the fold's (a new silver column) takes whole rows: its MERGE adds the new ones."""
    if wildcards or not engine.exists(gold):
        return ()
    have = engine.schema(gold)
    by_name = {f.name: f.dataType for f in have.fields} if have is not None else {}
    if any(by_name.get(f.name) != f.dataType for f in gold_schema(body).fields):
        return ()
    return kept_columns(plan, [f.name for f in body], batch_diffs(engine, changes))


def gold_read(body: Sequence[T.StructField], kept: Sequence[str]) -> list[str] | None:
    """The gold columns the fold reads when the MERGE keeps the ``kept`` ones (:func:`gold_kept`;
    ``None``: every column)."""
    if not kept:
        return None
    skipped = set(kept)
    return [f.name for f in gold_schema(body).fields if f.name not in skipped]


def fold_rows(
    engine: LakeEngine,
    changes: Rows,
    *,
    schema: T.StructType,
    plan: FoldPlan,
    wildcards: Sequence[Mapping[str, Any]] = (),
    gold: Rows | None = None,
    tombstones: Rows | None = None,
) -> Rows:
    """The fold of silver ``changes`` (rows of the silver ``schema``) onto the ``gold`` rows
    and hard-delete ``tombstones`` of the records they touch, run by ``engine``: one row of
    :func:`~pipelines.gold.plan.fold_output_schema` per record (and per GAP_OVERFLOW), split
    into ``plan.partitions`` groups by ``Id``.

    ``gold`` and ``tombstones`` are rows of the engine with (some of) their tables' columns,
    and may hold more records than the changes touch. ``wildcards`` are the batch's wildcard
    changes (:func:`batch_wildcards`): they travel with the fold and apply to every record
    that exists at their point of the order, so ``gold`` must then hold the whole table.
    """
    inputs = fold_input_schema(plan, schema)
    parts = [
        engine.map_batches(changes, ChangeRows(inputs, without_wildcards=bool(wildcards)), inputs)
    ]
    for state, role in ((gold, ROLE_GOLD), (tombstones, ROLE_TOMBSTONE)):
        if state is not None:
            parts.append(engine.map_batches(state, StateRows(inputs, role=role), inputs))
    function = FoldTable(plan, schema, wildcards)
    return engine.map_groups(
        engine.union(parts, inputs),
        key=ID,
        function=function,
        schema=function.output,
        partitions=plan.partitions,
    )


def history_changes(engine: LakeEngine, new: Rows, current: Rows, *, schema: T.StructType) -> Rows:
    """The rows to MERGE into an SCD2 history table of ``schema`` on
    :data:`~pipelines.gold.scd2.HISTORY_KEYS`, run by ``engine``: the ``new`` versions a fold
    started, and the ``current`` rows of the history table (of the records they touch) that
    they close (:class:`~pipelines.gold.scd2.HistoryChanges`)."""
    inputs = history_input_schema(schema)
    combined = engine.union(
        [
            engine.map_batches(new, _Tag(inputs, NEW_VERSION), inputs),
            engine.map_batches(current, _Tag(inputs, CURRENT_VERSION), inputs),
        ],
        inputs,
    )
    return engine.map_groups(combined, key=ID, function=HistoryChanges(schema), schema=schema)


def fold_counts(rows: pa.Table) -> dict[str, int]:
    """The sums of :class:`~pipelines.gold.folding.FoldCounts` rows."""
    return {name: int(pc.sum(rows.column(name)).as_py() or 0) for name in rows.column_names}


class _Tag:
    """History rows -> :func:`~pipelines.gold.scd2.history_input_schema` rows of a role."""

    def __init__(self, schema: T.StructType, role: str) -> None:
        self.schema = schema
        self.role = role
        self.fits = Fits(((HISTORY_ROLE, role),))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_schema_to_arrow(self.schema)
        for batch in batches:
            table = pa.Table.from_batches([batch])
            table = table.append_column(
                HISTORY_ROLE, pa.repeat(pa.scalar(self.role), table.num_rows)
            )
            yield from fit_to_schema(table, target).to_batches()
