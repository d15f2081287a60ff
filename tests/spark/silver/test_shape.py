"""The Arrow shaping the local engine runs in its workers gives, row for row, what the
DataFrame transforms give on the same decoded rows."""

from __future__ import annotations

from datetime import date
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from ingest.schema import EventSchema
from pipelines.engines.arrow import dataframe_to_arrow
from pipelines.silver.columns import CompoundMode, build_layout
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, decode_batches, decoded_schema
from pipelines.silver.shape import shape_batch, shaped_schema
from pipelines.silver.transforms import to_silver_and_quarantine
from tests.unit.silver.support import (
    ACCOUNT_V1,
    ACCOUNT_V2,
    ORDER_SHIPPED,
    bronze_batch,
    change_event,
    encode,
)

pytestmark = pytest.mark.spark

DAY = 86_400_000


def _both(
    spark: SparkSession,
    schemas: list[EventSchema],
    events: list[tuple[str, bytes]],
    compounds: CompoundMode,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], pa.Schema]:
    entity = schemas[0].entity_name
    layout = build_layout(entity, schemas, compounds=compounds)
    plan = DecodePlan(layout, {s.schema_id: s.json for s in schemas})
    table = bronze_batch(events, batch_id=4).select(list(BRONZE_COLUMNS))
    decoded = list(decode_batches(plan, iter(table.to_batches())))
    target = shaped_schema(layout)
    shaped = pa.Table.from_batches([shape_batch(layout, b, target) for b in decoded], target)
    # Straight from Arrow: through pandas a BIGINT column with nulls would pass as doubles.
    frame = spark.createDataFrame(
        pa.Table.from_batches(decoded), schema=decoded_schema(plan)
    ).transform(to_silver_and_quarantine(layout))
    expected = dataframe_to_arrow(frame)
    assert expected.column_names == shaped.column_names
    return expected.to_pylist(), shaped.to_pylist(), shaped.schema


def _account_events(s: EventSchema) -> list[tuple[str, bytes]]:
    return [
        (
            s.schema_id,
            change_event(
                s,
                "CREATE",
                ["001A", "001B", "001C"],
                {
                    "Name": {"FirstName": "Ada", "LastName": "Lovelace"},
                    "BillingAddress": {"City": "London", "Latitude": 51.5},
                    "SLA_Date__c": 20_089 * DAY,
                    "Open_At__c": 9 * 3_600_000 + 61_001,
                    "LastModifiedDate": 1_735_689_600_123,
                },
                changed=["Name", "BillingAddress.City"],
            ),
        ),
        (s.schema_id, b"\x00"),
        (
            s.schema_id,
            change_event(
                s,
                "UPDATE",
                ["001*"],
                {"Name": "Acme", "SLA_Date__c": -3 * DAY - 1, "Open_At__c": 0},
                nulled=["Phone"],
                commit_timestamp=-1_500,
            ),
        ),
        (s.schema_id, change_event(s, "GAP_OVERFLOW", [])),
        (s.schema_id, change_event(s, "DELETE", ["001D"], {"LastModifiedDate": None})),
    ]


@pytest.mark.parametrize("compounds", ["struct", "flattened"])
def test_change_events_shape_like_the_transforms(
    spark: SparkSession, compounds: CompoundMode
) -> None:
    events = _account_events(ACCOUNT_V1) + _account_events(ACCOUNT_V2)
    expected, got, schema = _both(spark, [ACCOUNT_V1, ACCOUNT_V2], events, compounds)
    # 3 + 1 + 1 + 1 + 1 rows per version: fanned out, the corrupt payload kept for the
    # quarantine, the GAP_OVERFLOW event kept without an id.
    assert len(got) == 14
    assert got == expected
    # A batch's undecodable rows come after its decoded ones.
    assert [r["Id"] for r in got[:7]] == ["001A", "001B", "001C", "001*", None, "001D", None]
    assert [r["_cdc_is_wildcard"] for r in got[:7]] == [False] * 3 + [True] + [False] * 3
    assert [r["_cdc_record_count"] for r in got[:7]] == [3, 3, 3, 1, 0, 1, 0]
    assert got[6]["_cdc_error_kind"] == "corrupt_payload"
    assert got[3]["Open_At__c"] == "00:00:00.000"
    assert got[0]["Open_At__c"] == "09:01:01.001"
    # Floored: a millisecond before a day's midnight UTC is still the day before.
    assert got[3]["SLA_Date__c"] == date(1969, 12, 28)
    assert schema.field("_cdc_commit_timestamp").type == pa.timestamp("us", tz="UTC")


def test_platform_events_shape_like_the_transforms(spark: SparkSession) -> None:
    s = ORDER_SHIPPED
    events = [
        (
            s.schema_id,
            encode(
                s,
                {
                    "CreatedDate": 1_735_689_600_000,
                    "CreatedById": "005A",
                    "Weight__c": 2.5,
                    "Delivery_Date__c": 20_100 * DAY,
                },
            ),
        ),
        (s.schema_id, b"\x01\x02"),
        (s.schema_id, encode(s, {"CreatedDate": 0, "CreatedById": "005B"})),
    ]
    expected, got, _ = _both(spark, [s], events, "struct")
    assert len(got) == 3
    assert got == expected
