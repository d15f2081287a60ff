"""The fold's input and output functions run by each engine as they are defined: the spark
engine does the ones that say what they do (``fits``, ``keeps``, ``selects``) as a Spark
projection, without a Python worker, and must give the rows the function itself gives."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from pipelines.engines import LakeEngine, Rows
from pipelines.engines.arrow import arrow_schema_to_spark, spark_schema_to_arrow
from pipelines.engines.base import BatchFunction
from pipelines.gold.columns import tombstone_schema
from pipelines.gold.dataflow import fold_counts
from pipelines.gold.folding import (
    FOLD_COUNTS_SCHEMA,
    ChangeRows,
    FoldCounts,
    GoldPart,
    StateRows,
    TombstonePart,
    Wildcards,
)
from pipelines.gold.plan import ROLE, ROLE_GOLD, ROLE_TOMBSTONE, fold_input_schema
from tests.spark.gold.conftest import Silver, fold, plan


def direct(function: BatchFunction, data: pa.Table, schema: T.StructType) -> pa.Table:
    batches = list(function(iter(data.to_batches())))
    if not batches:
        return spark_schema_to_arrow(schema).empty_table()
    return pa.Table.from_batches(batches)


def content(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=repr)


def python_runs(engine: LakeEngine, rows: Rows) -> bool:
    """Whether the spark engine's plan of ``rows`` sends rows to a Python worker."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rows.explain(mode="simple")
    return "MapInArrow" in out.getvalue()


def check(
    engine: LakeEngine,
    function: BatchFunction,
    data: pa.Table,
    schema: T.StructType,
    *,
    python: bool,
    source: Rows | None = None,
) -> None:
    """``function`` run by ``engine`` over ``data`` (or ``source``, its rows) gives what it
    gives when called, in ``schema``'s columns; on the spark engine, with a Python worker
    only when ``python``."""
    rows = engine.map_batches(engine.rows(data) if source is None else source, function, schema)
    got = engine.to_arrow(rows)
    assert got.column_names == schema.names
    assert content(got) == content(direct(function, data, schema))
    if not isinstance(rows, pa.Table):
        assert python_runs(engine, rows) == python, type(function).__name__


@pytest.fixture
def silver_rows(silver: Silver) -> Silver:
    silver.create("001A", 1, Name="Acme", BillingAddress={"City": "Lyon"})
    silver.update("001A", 2, Phone="555-0199")
    silver.add("001*", "UPDATE", 3, wildcard=True, changed=["Phone"], Phone="0")
    return silver


def test_change_rows_and_wildcards_are_filters_and_projections(
    engine: LakeEngine, silver_rows: Silver
) -> None:
    inputs = fold_input_schema(plan(), silver_rows.schema)
    data = silver_rows.table()
    check(engine, ChangeRows(inputs, without_wildcards=False), data, inputs, python=False)
    check(engine, ChangeRows(inputs, without_wildcards=True), data, inputs, python=False)
    kept = engine.to_arrow(
        engine.map_batches(engine.rows(data), ChangeRows(inputs, without_wildcards=True), inputs)
    )
    assert sorted(kept.column("Id").to_pylist()) == ["001A", "001A"]
    schema = silver_rows.schema
    check(engine, Wildcards(schema), data, schema, python=False)
    found = engine.to_arrow(engine.map_batches(engine.rows(data), Wildcards(schema), schema))
    assert found.column("Id").to_pylist() == ["001*"]
    # Rows read up to an earlier silver version lack its newest columns: null in the output.
    older = data.drop_columns(["Phone"])
    check(engine, Wildcards(schema), older, schema, python=False)


def test_state_rows_take_columns_by_name_in_any_case_and_fill_the_missing_ones(
    engine: LakeEngine, silver_rows: Silver
) -> None:
    inputs = fold_input_schema(plan(), silver_rows.schema)
    # Gold rows spelled in other cases, with a column the input lacks and without most of
    # the input's columns.
    gold = pa.table(
        {
            "id": ["001A", "001B"],
            "NAME": ["Acme", None],
            "phone": ["555-0100", "555-0101"],
            "Unrelated__c": [1, 2],
        }
    )
    for role in (ROLE_GOLD, ROLE_TOMBSTONE):
        check(engine, StateRows(inputs, role=role), gold, inputs, python=False)
    state = engine.map_batches(engine.rows(gold), StateRows(inputs, role=ROLE_GOLD), inputs)
    got = engine.to_arrow(state)
    assert set(got.column(ROLE).to_pylist()) == {ROLE_GOLD}
    assert sorted(got.column("Id").to_pylist()) == ["001A", "001B"]


def test_state_rows_that_need_a_cast_go_through_the_function(
    engine: LakeEngine, silver_rows: Silver
) -> None:
    inputs = fold_input_schema(plan(), silver_rows.schema)
    assert inputs["NumberOfEmployees"].dataType != T.LongType()
    gold = pa.table({"Id": ["001A"], "NumberOfEmployees": pa.array([7], pa.int64())})
    check(engine, StateRows(inputs, role=ROLE_GOLD), gold, inputs, python=True)


def test_the_parts_of_a_fold_output_are_filters_and_projections(
    engine: LakeEngine, silver: Silver
) -> None:
    silver.create("001A", 1, Name="Acme")
    silver.add("001B", "DELETE", 2)
    silver.update("001C", 3, Phone="1")
    folded = engine.to_arrow(fold(engine, silver, the_plan=plan(deletes="hard")))
    output = arrow_schema_to_spark(folded.schema)
    gold = T.StructType([f for f in output.fields if not f.name.startswith("_fold_")])
    source = engine.rows(folded, output)
    check(engine, GoldPart(gold.names), folded, gold, python=False, source=source)
    check(engine, TombstonePart(), folded, tombstone_schema(), python=False, source=source)
    tombstones = engine.to_arrow(engine.map_batches(source, TombstonePart(), tombstone_schema()))
    assert tombstones.column("Id").to_pylist() == ["001B"]
    # Counts are per batch (the spark engine sends FoldCounts only the columns it reads).
    counts = engine.to_arrow(engine.map_batches(source, FoldCounts(), FOLD_COUNTS_SCHEMA))
    expected = fold_counts(direct(FoldCounts(), folded, FOLD_COUNTS_SCHEMA))
    assert fold_counts(counts) == expected
    assert (expected["records"], expected["changes"], expected["tombstones"]) == (3, 3, 1)
