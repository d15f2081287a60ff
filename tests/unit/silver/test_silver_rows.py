"""An object's silver step (:class:`SilverRows`: its bronze rows decoded and shaped) and the
parts the job takes its output apart into, called directly on Arrow batches (no JVM)."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timezone

import pyarrow as pa
import pytest

from ingest.schema import EventSchema
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.silver.columns import CompoundMode, build_layout
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, SilverRows
from pipelines.silver.quarantine import QUARANTINE_SCHEMA, QuarantinePart, SilverPart
from pipelines.silver.shape import shaped_schema
from tests.unit.silver.support import (
    ACCOUNT_V1,
    ACCOUNT_V2,
    CONTACT,
    ORDER_SHIPPED,
    bronze_batch,
    change_event,
    encode,
)

UTC = timezone.utc
AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DAY = 86_400_000


def plan_for(schemas: list[EventSchema], compounds: CompoundMode = "struct") -> DecodePlan:
    layout = build_layout(schemas[0].entity_name, schemas, compounds=compounds)
    return DecodePlan(layout, {s.schema_id: s.json for s in schemas})


def silver_rows(plan: DecodePlan, events: list[tuple[str, bytes]], batch_id: int = 4) -> pa.Table:
    """The step's output over bronze rows of ``events`` (one batch)."""
    table = bronze_batch(events, batch_id=batch_id).select(list(BRONZE_COLUMNS))
    target = shaped_schema(plan.layout)
    batches = list(SilverRows(plan)(iter(table.to_batches())))
    for batch in batches:
        assert batch.schema.equals(target)
    return pa.Table.from_batches(batches, target)


def account_events(s: EventSchema) -> list[tuple[str, bytes]]:
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
def test_change_events_of_two_versions(compounds: CompoundMode) -> None:
    plan = plan_for([ACCOUNT_V1, ACCOUNT_V2], compounds)
    events = account_events(ACCOUNT_V1) + account_events(ACCOUNT_V2)
    table = silver_rows(plan, events)
    got = table.to_pylist()
    # 3 + 1 + 1 + 1 + 1 rows per version: fanned out, the corrupt payload kept for the
    # quarantine, the GAP_OVERFLOW event kept without an id.
    assert len(got) == 14
    # A batch's undecodable rows come after its decoded ones.
    for first, version, rows in ((0, ACCOUNT_V1, got[:7]), (5, ACCOUNT_V2, got[7:])):
        assert {r["_cdc_schema_id"] for r in rows} == {version.schema_id}
        assert [r["Id"] for r in rows] == ["001A", "001B", "001C", "001*", None, "001D", None]
        assert [r["_cdc_is_wildcard"] for r in rows] == [False] * 3 + [True] + [False] * 3
        assert [r["_cdc_record_count"] for r in rows] == [3, 3, 3, 1, 0, 1, 0]
        assert [r["_cdc_bronze_batch_seq"] - first for r in rows] == [0, 0, 0, 2, 3, 4, 1]
        assert [r["_cdc_error_kind"] for r in rows] == [None] * 6 + ["corrupt_payload"]
        assert rows[6]["_cdc_payload"] == b"\x00" and rows[6]["_cdc_change_type"] is None
        assert rows[0]["Open_At__c"] == "09:01:01.001"
        assert rows[3]["Open_At__c"] == "00:00:00.000"
        assert rows[0]["SLA_Date__c"] == date(2025, 1, 1)
        # Floored: a millisecond before a day's midnight UTC is still the day before.
        assert rows[3]["SLA_Date__c"] == date(1969, 12, 28)
        assert rows[0]["LastModifiedDate"] == datetime(2025, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)
        assert rows[5]["LastModifiedDate"] is None
        assert rows[3]["_cdc_commit_timestamp"] == datetime(
            1969, 12, 31, 23, 59, 58, 500_000, tzinfo=UTC
        )
        assert rows[0]["_cdc_changed_fields"] == ["Name", "BillingAddress.City"]
        assert rows[3]["_cdc_nulled_fields"] == ["Phone"]
        assert rows[3]["Name"] == "Acme"
        if compounds == "struct":
            assert rows[0]["Name_PersonName"] == {
                "Salutation": None,
                "FirstName": "Ada",
                "LastName": "Lovelace",
            }
            assert rows[0]["BillingAddress"]["City"] == "London"
            assert rows[3]["Name_PersonName"] is None
        else:
            assert (rows[0]["Name_FirstName"], rows[0]["Name_LastName"]) == ("Ada", "Lovelace")
            assert (rows[0]["BillingAddress_City"], rows[0]["BillingAddress_Latitude"]) == (
                "London",
                51.5,
            )
            assert rows[3]["Name_FirstName"] is None
    assert table.schema.field("_cdc_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    # Columns of v2 only are null on v1's rows.
    assert all(r["Tier__c"] is None for r in got)


def test_platform_events() -> None:
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
    got = silver_rows(plan_for([s]), events).to_pylist()
    assert len(got) == 3
    keys = ("CreatedDate", "CreatedById", "Weight__c", "Delivery_Date__c", "_cdc_error_kind")
    assert [tuple(r[k] for k in keys) for r in got] == [
        (datetime(2025, 1, 1, tzinfo=UTC), "005A", 2.5, date(2025, 1, 12), None),
        (datetime(1970, 1, 1, tzinfo=UTC), "005B", None, None, None),
        (None, None, None, None, "corrupt_payload"),
    ]
    assert [r["_cdc_bronze_batch_seq"] for r in got] == [0, 2, 1]
    assert "Id" not in got[0] and "_cdc_change_type" not in got[0]


def test_rows_of_other_schemas_are_left_out() -> None:
    s = ACCOUNT_V1
    events = [
        (s.schema_id, change_event(s, "CREATE", ["001A"])),
        (CONTACT.schema_id, change_event(CONTACT, "CREATE", ["003A"])),
        ("not-registered", change_event(s, "CREATE", ["001B"])),
        (s.schema_id, change_event(s, "CREATE", ["001C"])),
    ]
    got = silver_rows(plan_for([s]), events).to_pylist()
    assert [(r["Id"], r["_cdc_bronze_batch_seq"]) for r in got] == [("001A", 0), ("001C", 3)]
    assert silver_rows(plan_for([s]), events[1:3]).num_rows == 0


def test_rows_of_a_schema_the_plan_names_as_failed_are_kept_as_errors() -> None:
    s = ACCOUNT_V2
    refused = ACCOUNT_V1
    events = [
        (s.schema_id, change_event(s, "CREATE", ["001A"])),
        (refused.schema_id, change_event(refused, "UPDATE", ["001A", "001B"])),
        (CONTACT.schema_id, change_event(CONTACT, "CREATE", ["003A"])),
        (refused.schema_id, b"\x00\x01"),
    ]
    reason = f"GetSchema {refused.schema_id}: INVALID_ARGUMENT schema.meta.permission"
    plan = replace(plan_for([s]), failures={refused.schema_id: ("schema_unavailable", reason)})
    got = silver_rows(plan, events).to_pylist()
    assert [(r["_cdc_bronze_batch_seq"], r["Id"], r["_cdc_error_kind"]) for r in got] == [
        (0, "001A", None),
        (1, None, "schema_unavailable"),
        (3, None, "schema_unavailable"),
    ]
    for row, (_, payload) in zip(got[1:], (events[1], events[3]), strict=True):
        assert row["_cdc_error"] == reason
        assert row["_cdc_payload"] == payload
        assert row["_cdc_replay_id"] is not None


def test_the_step_composes_decoding_shaping_and_the_two_parts() -> None:
    s = ACCOUNT_V1
    plan = plan_for([s], "flattened")
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
    shaped = silver_rows(plan, events, batch_id=3)
    schema = plan.layout.silver_schema()
    silver = pa.Table.from_batches(list(SilverPart(schema.names)(iter(shaped.to_batches()))))
    assert silver.schema.equals(spark_schema_to_arrow(schema))
    rows = sorted(silver.to_pylist(), key=lambda r: r["Id"])
    assert [r["Id"] for r in rows] == ["001A", "001B"]
    row = rows[0]
    assert (row["Name"], row["Name_FirstName"], row["BillingAddress_City"]) == (
        None,
        "Ada",
        "London",
    )
    assert (row["SLA_Date__c"], row["Open_At__c"]) == (date(2025, 1, 1), "09:00:00.000")
    assert row["LastModifiedDate"] == datetime(2025, 1, 1, tzinfo=UTC)
    assert (row["_cdc_record_count"], row["_cdc_bronze_batch_id"]) == (2, 3)

    function = QuarantinePart(bronze_table="account_change_event", topic="/t", at=AT, entity="X")
    bad = pa.Table.from_batches(list(function(iter(shaped.to_batches()))))
    assert bad.schema.equals(spark_schema_to_arrow(QUARANTINE_SCHEMA))
    (quarantined,) = bad.to_pylist()
    assert (
        quarantined["bronze_batch_seq"],
        quarantined["reason_kind"],
        quarantined["payload"],
        quarantined["event_id"],
        quarantined["schema_id"],
    ) == (1, "corrupt_payload", b"\x00", "evt-3-1", s.schema_id)
    assert quarantined["reason"]
