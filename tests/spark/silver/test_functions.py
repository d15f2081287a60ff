"""Silver's batch functions run by each lake engine (``map_batches``: in this process, or on
Spark executors with ``mapInArrow``) give the rows they give when called directly."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from pipelines.engines import LakeEngine, Rows
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.base import BatchFunction
from pipelines.silver.columns import build_layout
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, SilverRows
from pipelines.silver.quarantine import (
    COUNTS_SCHEMA,
    QUARANTINE_SCHEMA,
    AfterBatch,
    QuarantinePart,
    SchemaCounts,
    SilverPart,
    Undecodable,
    WithoutKeys,
)
from pipelines.silver.shape import shaped_struct
from tests.spark.silver.lake import UTC, account_batch_0
from tests.unit.silver.support import ACCOUNT_V1, ACCOUNT_V2, CONTACT, bronze_batch, change_event

AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def bronze() -> pa.Table:
    """Three bronze batches: every kind of Account event and quarantine reason, a schema
    change, an empty schema id."""
    v1, v2 = ACCOUNT_V1, ACCOUNT_V2
    later = [
        (v1.schema_id, change_event(v1, "UPDATE", ["001A"], {"Phone": "1"}, changed=["Phone"])),
        (
            v2.schema_id,
            change_event(
                v2,
                "UPDATE",
                ["001A", "001B"],
                {"Tier__c": "Gold", "ShippingAddress": {"City": "Lyon"}},
                changed=["Tier__c", "ShippingAddress.City"],
            ),
        ),
        ("", change_event(v2, "CREATE", ["001Q"])),
        (v2.schema_id, b"\x02\x03"),
    ]
    parts = [
        bronze_batch(account_batch_0(), batch_id=0),
        bronze_batch(later, batch_id=1),
        bronze_batch([(v2.schema_id, change_event(v2, "DELETE", ["001A"]))], batch_id=2),
    ]
    return pa.concat_tables(parts).select(list(BRONZE_COLUMNS))


def direct(function: BatchFunction, data: pa.Table) -> pa.Table:
    batches = list(function(iter(data.to_batches())))
    return pa.Table.from_batches(batches) if batches else data.schema.empty_table()


def totals(counts: pa.Table) -> dict[str, tuple[int, int]]:
    """Rows and highest batch id per schema id, from SchemaCounts rows."""
    out: dict[str, tuple[int, int]] = {}
    for row in counts.to_pylist():
        n, top = out.get(row["schema_id"], (0, -1))
        out[row["schema_id"]] = (n + row["rows"], max(top, row["max_batch_id"]))
    return out


def content(table: pa.Table) -> tuple[list[tuple[str, pa.DataType]], list[dict[str, Any]]]:
    """Columns and rows, in a canonical row order."""
    columns = [(f.name, f.type) for f in table.schema]
    return columns, sorted(table.to_pylist(), key=repr)


def test_both_engines_run_the_silver_functions_as_they_are_defined(
    lake_engine: LakeEngine,
) -> None:
    engine = lake_engine
    data = bronze()
    rows = engine.persist(engine.rows(data))

    def check(
        function: BatchFunction, source: Rows, expected: pa.Table, schema: T.StructType
    ) -> None:
        got = engine.to_arrow(engine.map_batches(source, function, schema))
        name = type(function).__name__
        assert got.column_names == schema.names, name
        assert content(got) == content(expected), name

    layout = build_layout("Account", [ACCOUNT_V1, ACCOUNT_V2])
    plan = DecodePlan(layout, {s.schema_id: s.json for s in (ACCOUNT_V1, ACCOUNT_V2)})
    shaped = direct(SilverRows(plan), data)
    assert shaped.num_rows == 16
    decoded = engine.persist(engine.map_batches(rows, SilverRows(plan), shaped_struct(layout)))
    check(SilverRows(plan), rows, shaped, shaped_struct(layout))

    silver_schema = layout.silver_schema()
    silver = direct(SilverPart(silver_schema.names), shaped)
    assert silver.num_rows == 14
    check(SilverPart(silver_schema.names), decoded, silver, silver_schema)

    part = QuarantinePart(
        bronze_table="account_change_event", topic="/data/AccountChangeEvent", at=AT, entity="X"
    )
    bad = direct(part, shaped)
    assert sorted(bad.column("reason_kind").to_pylist()) == ["corrupt_payload", "corrupt_payload"]
    check(part, decoded, bad, QUARANTINE_SCHEMA)

    others = Undecodable(
        decodable=set(plan.schemas),
        reasons={},
        registry="bronze.sfcdc_schemas",
        bronze_table="account_change_event",
        topic="/data/AccountChangeEvent",
        at=AT,
    )
    unknown = direct(others, data)
    assert sorted(unknown.column("bronze_batch_seq").to_pylist()) == [2, 9, 10]
    check(others, rows, unknown, QUARANTINE_SCHEMA)

    seen = {("account_change_event", 0, 9)}
    check(
        WithoutKeys(seen),
        engine.rows(unknown),
        direct(WithoutKeys(seen), unknown),
        QUARANTINE_SCHEMA,
    )
    check(AfterBatch(0), rows, direct(AfterBatch(0), data), arrow_schema_to_spark(data.schema))
    # Counts are per batch, and each engine cuts its own batches: their sums agree.
    counts = engine.to_arrow(engine.map_batches(rows, SchemaCounts(), COUNTS_SCHEMA))
    assert (
        totals(counts)
        == totals(direct(SchemaCounts(), data))
        == {
            "": (1, 1),
            ACCOUNT_V1.schema_id: (10, 1),
            ACCOUNT_V2.schema_id: (3, 2),
            CONTACT.schema_id: (1, 0),
            "not-registered": (1, 0),
        }
    )
    engine.release(decoded)
    engine.release(rows)
