"""Each silver transform on small explicit DataFrames (chispa)."""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from pipelines.engines.arrow import same_type
from pipelines.silver.columns import FieldLayout, LeafLayout, SilverLayout, build_layout
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, decode_batches, decoded_schema
from pipelines.silver.transforms import (
    QUARANTINE_SCHEMA,
    convert_epoch_columns,
    decoded_events,
    fan_out_record_ids,
    quarantined_rows,
    shape_compounds,
    silver_columns,
    silver_rows,
    to_silver,
    to_silver_and_quarantine,
    undecodable_rows,
)
from tests.unit.silver.support import ACCOUNT_V1, bronze_batch, change_event

pytestmark = pytest.mark.spark

UTC = timezone.utc
AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DAY = 86_400_000
S, L, INT, B, D = T.StringType(), T.LongType(), T.IntegerType(), T.BooleanType(), T.DoubleType()
STRINGS = T.ArrayType(S)

# A small object: every shape the transforms care about.
LAYOUT = SilverLayout(
    "Widget__c",
    True,
    (
        FieldLayout(
            "Name",
            "switchable",
            "string",
            (LeafLayout("FirstName", "string"), LeafLayout("LastName", "string")),
        ),
        FieldLayout(
            "Where__c",
            "struct",
            children=(LeafLayout("City", "string"), LeafLayout("Lat", "double")),
        ),
        FieldLayout("Due__c", "leaf", "date"),
        FieldLayout("Opens__c", "leaf", "time"),
        FieldLayout("Seen__c", "leaf", "timestamp"),
        FieldLayout("Note__c", "leaf", "string"),
    ),
)
FLAT = SilverLayout(LAYOUT.entity, True, LAYOUT.fields, "flattened")


def frame(
    spark: SparkSession, fields: list[tuple[str, T.DataType]], rows: list[tuple[Any, ...]]
) -> DataFrame:
    schema = T.StructType([T.StructField(n, t) for n, t in fields])
    return spark.createDataFrame(rows, schema)


def test_fan_out_one_row_per_record_id(spark: SparkSession) -> None:
    df = frame(
        spark,
        [("_cdc_record_ids", STRINGS), ("_cdc_change_type", S)],
        [
            (["001A"], "UPDATE"),
            (["001B", "001C", "001D"], "DELETE"),
            (["001*"], "UPDATE"),
            ([], "GAP_OVERFLOW"),
            (None, None),  # an undecodable row: kept for the quarantine
        ],
    )
    expected = frame(
        spark,
        [("Id", S), ("_cdc_is_wildcard", B), ("_cdc_record_count", INT), ("_cdc_change_type", S)],
        [
            ("001A", False, 1, "UPDATE"),
            ("001B", False, 3, "DELETE"),
            ("001C", False, 3, "DELETE"),
            ("001D", False, 3, "DELETE"),
            ("001*", True, 1, "UPDATE"),
            (None, False, 0, "GAP_OVERFLOW"),
            (None, False, 0, None),
        ],
    )
    assert_df_equality(
        df.transform(fan_out_record_ids), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_convert_epoch_columns(spark: SparkSession) -> None:
    # A pre-1970 date stays on its day; times are text computed from the number.
    df = frame(
        spark,
        [
            ("_cdc_commit_timestamp", L),
            ("Due__c", L),
            ("Opens__c", L),
            ("Seen__c", L),
            ("Note__c", S),
        ],
        [
            (
                1_735_689_600_000,
                20_089 * DAY,
                8 * 3_600_000 + 30 * 60_000 + 5,
                1_735_689_600_123,
                "x",
            ),
            (0, -1 * DAY, 86_399_999, 0, None),
            (None, None, None, None, None),
        ],
    )
    expected = frame(
        spark,
        [
            ("_cdc_commit_timestamp", T.TimestampType()),
            ("Due__c", T.DateType()),
            ("Opens__c", S),
            ("Seen__c", T.TimestampType()),
            ("Note__c", S),
        ],
        [
            (
                datetime(2025, 1, 1, tzinfo=UTC),
                date(2025, 1, 1),
                "08:30:00.005",
                datetime(2025, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC),
                "x",
            ),
            (
                datetime(1970, 1, 1, tzinfo=UTC),
                date(1969, 12, 31),
                "23:59:59.999",
                datetime(1970, 1, 1, tzinfo=UTC),
                None,
            ),
            (None, None, None, None, None),
        ],
    )
    assert_df_equality(
        df.transform(convert_epoch_columns(LAYOUT)),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )


PERSON = T.StructType([T.StructField("FirstName", S), T.StructField("LastName", S)])
WHERE = T.StructType([T.StructField("City", S), T.StructField("Lat", D)])


def test_shape_compounds_keeps_structs_or_flattens(spark: SparkSession) -> None:
    df = frame(
        spark,
        [("Name", S), ("Name_PersonName", PERSON), ("Where__c", WHERE), ("Note__c", S)],
        [
            ("Acme", None, ("Paris", 48.85), "a"),
            (None, ("Ada", "Lovelace"), None, "b"),
        ],
    )
    assert_df_equality(df.transform(shape_compounds(LAYOUT)), df)
    expected = frame(
        spark,
        [
            ("Name", S),
            ("Name_FirstName", S),
            ("Name_LastName", S),
            ("Where__c_City", S),
            ("Where__c_Lat", D),
            ("Note__c", S),
        ],
        [("Acme", None, None, "Paris", 48.85, "a"), (None, "Ada", "Lovelace", None, None, "b")],
    )
    assert_df_equality(df.transform(shape_compounds(FLAT)), expected, ignore_row_order=True)


def test_silver_columns_fixes_order_and_types(spark: SparkSession) -> None:
    layout = SilverLayout("Thing__e", False, (FieldLayout("Count__c", "leaf", "int"),))
    df = frame(
        spark,
        [
            ("Count__c", L),
            ("_cdc_bronze_batch_seq", INT),
            ("_cdc_bronze_batch_id", L),
            ("_cdc_schema_id", S),
            ("_cdc_replay_id", T.BinaryType()),
            ("_cdc_event_id", S),
            ("_cdc_change_type", S),  # not a platform event column: dropped
        ],
        [(3, 1, 2, "sid", b"\x01", "e1", None)],
    )
    out = df.transform(silver_columns(layout))
    assert same_type(out.schema, layout.silver_schema())
    assert [tuple(r) for r in out.collect()] == [("e1", b"\x01", "sid", 2, 1, 3)]
    with pytest.raises(ValueError, match=r"silver columns \['Count__c'\] are missing"):
        df.drop("Count__c").transform(silver_columns(layout))


ERRORS = [
    ("_cdc_bronze_batch_id", L),
    ("_cdc_bronze_batch_seq", INT),
    ("_cdc_event_id", S),
    ("_cdc_replay_id", T.BinaryType()),
    ("_cdc_schema_id", S),
    ("_cdc_entity", S),
    ("_cdc_error", S),
    ("_cdc_error_kind", S),
    ("_cdc_payload", T.BinaryType()),
    ("Note__c", S),
]


def test_splitting_silver_and_quarantine_rows(spark: SparkSession) -> None:
    df = frame(
        spark,
        ERRORS,
        [
            (4, 0, "e0", b"\x00", "sid", "Widget__c", None, None, None, "ok"),
            (
                4,
                1,
                "e1",
                b"\x01",
                "sid",
                "Widget__c",
                "truncated",
                "corrupt_payload",
                b"\xff",
                None,
            ),
        ],
    )
    decoded = df.where("_cdc_error IS NULL").drop("_cdc_error", "_cdc_error_kind", "_cdc_payload")
    assert_df_equality(df.transform(silver_rows), decoded, ignore_nullable=True)
    expected_quarantine = spark.createDataFrame(
        [
            (
                "widget__change_event",
                "/data/W",
                4,
                1,
                b"\x01",
                "e1",
                "sid",
                "Widget__c",
                "corrupt_payload",
                "truncated",
                b"\xff",
                AT,
            )
        ],
        QUARANTINE_SCHEMA,
    )
    quarantine = quarantined_rows(bronze_table="widget__change_event", topic="/data/W", at=AT)
    assert_df_equality(df.transform(quarantine), expected_quarantine, ignore_nullable=True)
    # The entity can also be given (platform event rows have no _cdc_entity column).
    named = quarantined_rows(
        bronze_table="widget__change_event", topic="/data/W", at=AT, entity="Gadget__c"
    )
    (row,) = df.drop("_cdc_entity").transform(named).collect()
    assert row["entity"] == "Gadget__c"
    assert_df_equality(df.transform(decoded_events), decoded)


def test_undecodable_rows_from_bronze(spark: SparkSession) -> None:
    bronze = spark.createDataFrame(
        bronze_batch(
            [
                ("good", b"a"),
                ("other-object", b"b"),
                ("broken", b"c"),
                ("stranger", b"d"),
                ("", b"e"),
            ],
            batch_id=9,
        )
        .select(list(BRONZE_COLUMNS))
        .to_pandas()
    )
    out = bronze.transform(
        undecodable_rows(
            decodable={"good", "other-object"},
            reasons={
                "broken": ("invalid_schema", "schema broken does not parse"),
                "wrongly": ("wrong_entity", "not ours"),
            },
            registry="bronze.sfcdc_schemas",
            bronze_table="account_change_event",
            topic="/data/AccountChangeEvent",
            at=AT,
        )
    )
    assert out.schema.names == QUARANTINE_SCHEMA.names
    rows = {r["bronze_batch_seq"]: r for r in out.collect()}
    assert sorted(rows) == [2, 3, 4]
    assert (rows[2]["reason_kind"], rows[2]["reason"]) == (
        "invalid_schema",
        "schema broken does not parse",
    )
    assert rows[3]["reason_kind"] == "unknown_schema"
    assert rows[3]["reason"].startswith("unknown schema id 'stranger': not in bronze.sfcdc_schemas")
    assert rows[4]["reason"] == "the bronze row has no schema id"
    # Spark returns TIMESTAMP values as naive datetimes in the session time zone (UTC).
    assert (rows[3]["bronze_batch_id"], rows[3]["payload"], rows[3]["quarantined_at"]) == (
        9,
        b"d",
        AT.replace(tzinfo=None),
    )


def _decoded(
    spark: SparkSession, events: list[tuple[str, bytes]], layout: SilverLayout
) -> DataFrame:
    plan = DecodePlan(layout, {ACCOUNT_V1.schema_id: ACCOUNT_V1.json})
    table = bronze_batch(events, batch_id=3).select(list(BRONZE_COLUMNS))
    batches = list(decode_batches(plan, iter(table.to_batches())))
    arrow = pa.Table.from_batches(batches)
    return spark.createDataFrame(arrow.to_pandas(), decoded_schema(plan))


def test_to_silver_composes_the_steps(spark: SparkSession) -> None:
    s = ACCOUNT_V1
    layout = build_layout("Account", [s], compounds="flattened")
    events = [
        (
            s.schema_id,
            change_event(
                s,
                "CREATE",
                ["001A", "001B"],
                {
                    "Name": {"FirstName": "Ada", "LastName": "Lovelace"},
                    "BillingAddress": {"City": "London"},
                    "SLA_Date__c": 20_089 * DAY,
                    "Open_At__c": 9 * 3_600_000,
                    "LastModifiedDate": 1_735_689_600_000,
                },
            ),
        ),
        (s.schema_id, b"\x00"),
    ]
    decoded = _decoded(spark, events, layout)
    silver = decoded.transform(to_silver(layout))
    assert same_type(silver.schema, layout.silver_schema())
    rows = sorted(silver.collect(), key=lambda r: r["Id"])
    assert [r["Id"] for r in rows] == ["001A", "001B"]
    row = rows[0]
    assert (row["Name"], row["Name_FirstName"], row["BillingAddress_City"]) == (
        None,
        "Ada",
        "London",
    )
    assert (row["SLA_Date__c"], row["Open_At__c"]) == (date(2025, 1, 1), "09:00:00.000")
    assert row["LastModifiedDate"] == datetime(2025, 1, 1)
    assert (row["_cdc_record_count"], row["_cdc_bronze_batch_id"]) == (2, 3)

    both = decoded.transform(to_silver_and_quarantine(layout))
    assert same_type(both.transform(silver_rows).schema, layout.silver_schema())
    assert both.transform(silver_rows).count() == 2
    quarantine = quarantined_rows(bronze_table="account_change_event", topic="/t", at=AT)
    (bad,) = both.transform(quarantine).collect()
    assert (bad["bronze_batch_seq"], bad["reason_kind"], bad["payload"]) == (
        1,
        "corrupt_payload",
        b"\x00",
    )


def test_undecodable_rows_without_known_reasons(spark: SparkSession) -> None:
    bronze = spark.createDataFrame(
        bronze_batch([("good", b"a"), ("stranger", b"b")]).select(list(BRONZE_COLUMNS)).to_pandas()
    )
    out = bronze.transform(
        undecodable_rows(
            decodable={"good"},
            reasons={},
            registry="bronze.sfcdc_schemas",
            bronze_table="t",
            topic="/data/T",
            at=AT,
        )
    )
    assert [(r["schema_id"], r["reason_kind"]) for r in out.collect()] == [
        ("stranger", "unknown_schema")
    ]
