"""Silver's row shaping (:func:`shape_batch`) on small explicit Arrow batches: record ids
fanned out, epoch milliseconds converted, compounds kept or flattened, columns in table order
and types."""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

from pipelines.engines.arrow import spark_schema_to_arrow, spark_type_to_arrow
from pipelines.silver.columns import FieldLayout, LeafLayout, SilverLayout
from pipelines.silver.decode import DecodePlan, decoded_schema
from pipelines.silver.quarantine import ERROR_COLUMNS
from pipelines.silver.shape import ERROR_TYPES, shape_batch, shaped_schema, shaped_struct

UTC = timezone.utc
DAY = 86_400_000

# A small object: every shape the shaping cares about.
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


def decoded(layout: SilverLayout, rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Decoded rows (what :func:`decode_batches` yields for ``layout``); the columns a row
    does not name are null."""
    schema = spark_schema_to_arrow(decoded_schema(DecodePlan(layout, {})))
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def shaped(layout: SilverLayout, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    target = shaped_schema(layout)
    batch = shape_batch(layout, decoded(layout, rows), target)
    assert batch.schema.equals(target)
    return batch.to_pylist()


def pick(rows: list[dict[str, Any]], *names: str) -> list[tuple[Any, ...]]:
    return [tuple(r[n] for n in names) for r in rows]


def test_fan_out_one_row_per_record_id() -> None:
    rows = shaped(
        LAYOUT,
        [
            {"_cdc_record_ids": ["001A"], "_cdc_change_type": "UPDATE", "_cdc_event_id": "e0"},
            {
                "_cdc_record_ids": ["001B", "001C", "001D"],
                "_cdc_change_type": "DELETE",
                "_cdc_event_id": "e1",
            },
            {"_cdc_record_ids": ["001*"], "_cdc_change_type": "UPDATE", "_cdc_event_id": "e2"},
            {"_cdc_record_ids": [], "_cdc_change_type": "GAP_OVERFLOW", "_cdc_event_id": "e3"},
            # An undecodable row: kept, as one row without an Id, for the quarantine.
            {
                "_cdc_event_id": "e4",
                "_cdc_error": "truncated",
                "_cdc_error_kind": "corrupt_payload",
                "_cdc_payload": b"\xff",
            },
        ],
    )
    assert pick(rows, "Id", "_cdc_is_wildcard", "_cdc_record_count", "_cdc_change_type") == [
        ("001A", False, 1, "UPDATE"),
        ("001B", False, 3, "DELETE"),
        ("001C", False, 3, "DELETE"),
        ("001D", False, 3, "DELETE"),
        ("001*", True, 1, "UPDATE"),
        (None, False, 0, "GAP_OVERFLOW"),
        (None, False, 0, None),
    ]
    # The other columns are repeated for each id of their event.
    assert [r["_cdc_event_id"] for r in rows] == ["e0", "e1", "e1", "e1", "e2", "e3", "e4"]
    assert pick(rows[-1:], *ERROR_COLUMNS) == [("truncated", "corrupt_payload", b"\xff")]
    assert all(r["_cdc_error"] is None for r in rows[:-1])


def test_one_id_per_row_keeps_the_rows_as_they_are() -> None:
    rows = shaped(
        LAYOUT,
        [
            {"_cdc_record_ids": ["001A"], "Note__c": "a"},
            {"_cdc_record_ids": ["001B"], "Note__c": "b"},
        ],
    )
    assert pick(rows, "Id", "_cdc_record_count", "_cdc_is_wildcard", "Note__c") == [
        ("001A", 1, False, "a"),
        ("001B", 1, False, "b"),
    ]


def test_convert_epoch_columns() -> None:
    # A date before 1970 stays on its UTC day (floored); times are text computed from the
    # number, so no time zone can shift them.
    rows = shaped(
        LAYOUT,
        [
            {
                "_cdc_record_ids": ["a01"],
                "_cdc_commit_timestamp": 1_735_689_600_000,
                "Due__c": 20_089 * DAY,
                "Opens__c": 8 * 3_600_000 + 30 * 60_000 + 5,
                "Seen__c": 1_735_689_600_123,
                "Note__c": "x",
            },
            {
                "_cdc_record_ids": ["a02"],
                "_cdc_commit_timestamp": 0,
                "Due__c": -1 * DAY,
                "Opens__c": 86_399_999,
                "Seen__c": 0,
            },
            {"_cdc_record_ids": ["a03"]},
            {
                "_cdc_record_ids": ["a04"],
                "_cdc_commit_timestamp": -1_500,
                "Due__c": -3 * DAY - 1,
                "Opens__c": 0,
            },
            {"_cdc_record_ids": ["a05"], "Due__c": -1},
        ],
    )
    names = ("_cdc_commit_timestamp", "Due__c", "Opens__c", "Seen__c", "Note__c")
    assert pick(rows, *names) == [
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
        (
            datetime(1969, 12, 31, 23, 59, 58, 500_000, tzinfo=UTC),
            # Floored: a millisecond before a day's midnight UTC is still the day before.
            date(1969, 12, 28),
            "00:00:00.000",
            None,
            None,
        ),
        (None, date(1969, 12, 31), None, None, None),
    ]


def test_dates_and_times_inside_compounds_are_converted() -> None:
    layout = SilverLayout(
        "Visit__c",
        False,
        (
            FieldLayout(
                "Slot__c",
                "struct",
                children=(LeafLayout("Day", "date"), LeafLayout("At", "time")),
            ),
        ),
    )
    rows = shaped(
        layout,
        [{"Slot__c": {"Day": -1, "At": 61_001}}, {"Slot__c": None}],
    )
    assert [r["Slot__c"] for r in rows] == [{"Day": date(1969, 12, 31), "At": "00:01:01.001"}, None]


PERSON = {"FirstName": "Ada", "LastName": "Lovelace"}
PARIS = {"City": "Paris", "Lat": 48.85}
COMPOUNDS = [
    {"_cdc_record_ids": ["a01"], "Name": "Acme", "Where__c": PARIS, "Note__c": "a"},
    {"_cdc_record_ids": ["a02"], "Name_PersonName": PERSON, "Note__c": "b"},
]


def test_compounds_stay_structs() -> None:
    rows = shaped(LAYOUT, COMPOUNDS)
    assert pick(rows, "Name", "Name_PersonName", "Where__c", "Note__c") == [
        ("Acme", None, PARIS, "a"),
        (None, PERSON, None, "b"),
    ]


def test_compounds_are_flattened_when_the_object_asks() -> None:
    rows = shaped(FLAT, COMPOUNDS)
    names = (
        "Name",
        "Name_FirstName",
        "Name_LastName",
        "Where__c_City",
        "Where__c_Lat",
        "Note__c",
    )
    assert pick(rows, *names) == [
        ("Acme", None, None, "Paris", 48.85, "a"),
        (None, "Ada", "Lovelace", None, None, "b"),
    ]
    assert "Where__c" not in rows[0] and "Name_PersonName" not in rows[0]


def test_silver_columns_fix_order_and_types() -> None:
    layout = SilverLayout("Thing__e", False, (FieldLayout("Count__c", "leaf", "int"),))
    columns = {
        "Count__c": pa.array([3], pa.int64()),
        "_cdc_bronze_batch_seq": pa.array([1], pa.int32()),
        "_cdc_bronze_batch_id": pa.array([2], pa.int64()),
        "_cdc_schema_id": pa.array(["sid"]),
        "_cdc_replay_id": pa.array([b"\x01"]),
        "_cdc_event_id": pa.array(["e1"]),
        "_cdc_change_type": pa.array([None], pa.string()),  # no platform event column: dropped
        **{name: pa.nulls(1, spark_type_to_arrow(t)) for name, t in ERROR_TYPES},
    }
    batch = pa.RecordBatch.from_pydict(columns)
    target = shaped_schema(layout)
    out = shape_batch(layout, batch, target)
    assert out.schema.equals(target)
    assert target.names == [*layout.silver_schema().names, *ERROR_COLUMNS]
    assert [tuple(r.values()) for r in out.to_pylist()] == [
        ("e1", b"\x01", "sid", 2, 1, 3, None, None, None)
    ]
    with pytest.raises(ValueError, match=r"silver columns \['Count__c'\] are missing"):
        shape_batch(layout, batch.drop_columns(["Count__c"]), target)


def test_the_error_columns_follow_the_silver_columns() -> None:
    assert [name for name, _ in ERROR_TYPES] == list(ERROR_COLUMNS)
    names = shaped_struct(LAYOUT).names
    assert names[: -len(ERROR_COLUMNS)] == LAYOUT.silver_schema().names
    assert names[-len(ERROR_COLUMNS) :] == list(ERROR_COLUMNS)
