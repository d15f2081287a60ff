"""The mapInArrow decoding function, called directly on Arrow batches (no JVM)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pyarrow as pa
import pytest

from ingest.errors import DecodeError
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.silver import decode
from pipelines.silver.columnar import ColumnarDecoder
from pipelines.silver.columns import build_layout
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, decode_batches, decoded_schema
from tests.unit.silver.support import (
    ACCOUNT_V1,
    ACCOUNT_V2,
    CONTACT,
    ORDER_SHIPPED,
    bronze_batch,
    change_event,
    encode,
)

ADDRESS = {"Street": "1 Market St", "City": "San Francisco", "PostalCode": "94105"}
DAY = 86_400_000


def plan_for(*schemas: Any, compounds: str = "struct") -> DecodePlan:
    layout = build_layout(schemas[0].entity_name, list(schemas), compounds=compounds)  # type: ignore[arg-type]
    return DecodePlan(layout, {s.schema_id: s.json for s in schemas}, registry="bronze.schemas")


def run(plan: DecodePlan, events: list[tuple[str, bytes]], **options: Any) -> list[dict[str, Any]]:
    table = bronze_batch(events, **options)
    batches = list(decode_batches(plan, iter(table.select(list(BRONZE_COLUMNS)).to_batches())))
    expected = spark_schema_to_arrow(decoded_schema(plan))
    for batch in batches:
        assert batch.schema.equals(expected), batch.schema
    rows = pa.Table.from_batches(batches, schema=expected).to_pylist()
    return sorted(rows, key=lambda r: r["_cdc_bronze_batch_seq"])


def test_decodes_header_fields_and_bitmaps() -> None:
    s = ACCOUNT_V1
    payload = change_event(
        s,
        "UPDATE",
        ["001000000000001AAA"],
        {"Phone": "+1 555 0100", "BillingAddress": {"City": "Paris"}, "LastModifiedDate": 1},
        changed=["Phone", "Description", "BillingAddress.City", "LastModifiedDate"],
        nulled=["Description"],
        commit_number=2**62 + 3,
    )
    (row,) = run(plan_for(s), [(s.schema_id, payload)], batch_id=7, first_seq=3)
    assert row["_cdc_error"] is None and row["_cdc_payload"] is None
    assert row["_cdc_entity"] == "Account"
    assert row["_cdc_record_ids"] == ["001000000000001AAA"]
    assert row["_cdc_change_type"] == "UPDATE"
    assert row["_cdc_commit_number"] == 2**62 + 3  # exact, beyond 2**53
    assert row["_cdc_commit_timestamp"] == 1_735_689_600_000
    assert row["_cdc_sequence_number"] == 1
    assert row["_cdc_changed_fields"] == [
        "BillingAddress.City",
        "Phone",
        "Description",
        "LastModifiedDate",
    ]
    assert row["_cdc_nulled_fields"] == ["Description"]
    assert row["_cdc_diff_fields"] == []
    assert (row["_cdc_bronze_batch_id"], row["_cdc_bronze_batch_seq"]) == (7, 3)
    assert row["_cdc_event_id"] == "evt-7-3"
    assert row["Phone"] == "+1 555 0100"
    assert row["BillingAddress"] == {
        "Street": None,
        "City": "Paris",
        "PostalCode": None,
        "Latitude": None,
        "Longitude": None,
    }
    assert row["Description"] is None and row["Name"] is None


def test_each_event_decodes_with_its_own_schema_version() -> None:
    # v2 inserts Tier__c before Phone: the same bit means another field in each version.
    v1 = change_event(ACCOUNT_V1, "UPDATE", ["001A"], {"Phone": "1"}, changed=["Phone"])
    v2 = change_event(
        ACCOUNT_V2, "UPDATE", ["001B"], {"Tier__c": "Gold", "Phone": "2"}, changed=["Tier__c"]
    )
    assert ACCOUNT_V1.field("Phone").index == ACCOUNT_V2.field("Tier__c").index
    rows = run(
        plan_for(ACCOUNT_V1, ACCOUNT_V2),
        [(ACCOUNT_V1.schema_id, v1), (ACCOUNT_V2.schema_id, v2)],
    )
    assert [r["_cdc_changed_fields"] for r in rows] == [["Phone"], ["Tier__c"]]
    assert [(r["Phone"], r["Tier__c"]) for r in rows] == [("1", None), ("2", "Gold")]
    assert rows[0]["ShippingAddress"] is None  # a v2 field, absent from v1


def test_switchable_name_keeps_both_branches() -> None:
    s = ACCOUNT_V1
    business = change_event(s, "CREATE", ["001A"], {"Name": "Acme Ltd"})
    person = change_event(
        s, "CREATE", ["001B"], {"Name": {"FirstName": "Ada", "LastName": "Lovelace"}}
    )
    rows = run(plan_for(s), [(s.schema_id, business), (s.schema_id, person)])
    assert (rows[0]["Name"], rows[0]["Name_PersonName"]) == ("Acme Ltd", None)
    assert rows[1]["Name"] is None
    assert rows[1]["Name_PersonName"] == {
        "Salutation": None,
        "FirstName": "Ada",
        "LastName": "Lovelace",
    }


def test_multi_record_wildcard_and_overflow_ids_are_kept_as_arrays() -> None:
    s = ACCOUNT_V1
    events = [
        (s.schema_id, change_event(s, "DELETE", ["001A", "001B", "001C"])),
        (s.schema_id, change_event(s, "UPDATE", ["001*"], changed=["IsActive__c"])),
        (s.schema_id, change_event(s, "GAP_OVERFLOW", [])),
    ]
    rows = run(plan_for(s), events)
    assert [r["_cdc_record_ids"] for r in rows] == [["001A", "001B", "001C"], ["001*"], []]
    assert [r["_cdc_change_type"] for r in rows] == ["DELETE", "UPDATE", "GAP_OVERFLOW"]


def test_dates_and_times_stay_epoch_milliseconds() -> None:
    s = ACCOUNT_V1
    values = {"SLA_Date__c": 20_000 * DAY, "Open_At__c": 8 * 3_600_000 + 1, "LastModifiedDate": 5}
    (row,) = run(plan_for(s), [(s.schema_id, change_event(s, "CREATE", ["001A"], values))])
    assert (row["SLA_Date__c"], row["Open_At__c"], row["LastModifiedDate"]) == (
        20_000 * DAY,
        8 * 3_600_000 + 1,
        5,
    )


def test_platform_events_have_no_header() -> None:
    s = ORDER_SHIPPED
    payload = encode(
        s,
        {"CreatedDate": 1_735_689_600_123, "CreatedById": "005A", "Weight__c": 1.5},
    )
    (row,) = run(plan_for(s), [(s.schema_id, payload)], topic="/event/Order_Shipped__e")
    assert row["_cdc_entity"] == "Order_Shipped__e" and row["_cdc_error"] is None
    assert row["_cdc_record_ids"] is None and row["_cdc_change_type"] is None
    assert (row["CreatedDate"], row["CreatedById"], row["Weight__c"]) == (
        1_735_689_600_123,
        "005A",
        1.5,
    )


def test_undecodable_rows_carry_reason_and_payload_while_the_rest_decodes() -> None:
    s = ACCOUNT_V1
    good = change_event(s, "CREATE", ["001A"], {"Phone": "1"})
    truncated = good[:-3]
    past_schema = change_event(s, "UPDATE", ["001B"], changed=["Phone"])
    # Rewrite the changedFields bitmap to name field 12 of an 11-field schema (0..10).
    assert len(ACCOUNT_V1.fields) == 11
    bad_bitmap = past_schema.replace(b"\x080x08", b"\x0c0x1000")
    assert bad_bitmap != past_schema
    other = change_event(CONTACT, "CREATE", ["003A"], {"LastName": "X"})
    events = [
        (s.schema_id, good),
        (s.schema_id, truncated),
        (s.schema_id, bad_bitmap),
        (s.schema_id, other),  # a Contact payload written under an Account schema id
        ("unknown-id", good),
        (s.schema_id, b"\xff" * 5),
    ]
    rows = run(plan_for(s), events)
    assert rows[0]["_cdc_error"] is None and rows[0]["Phone"] == "1"
    kinds = [(r["_cdc_error_kind"], r["_cdc_bronze_batch_seq"]) for r in rows[1:]]
    assert kinds == [
        ("corrupt_payload", 1),
        ("bad_bitmap", 2),
        ("corrupt_payload", 3),
        ("unknown_schema", 4),
        ("corrupt_payload", 5),
    ]
    for row, (_, payload) in zip(rows[1:], events[1:], strict=True):
        assert row["_cdc_payload"] == payload
        assert row["_cdc_event_id"] and row["_cdc_replay_id"]
        assert row["Phone"] is None and row["_cdc_record_ids"] is None
    assert "truncated" in rows[1]["_cdc_error"]
    assert "bit 12 is past the last field" in rows[2]["_cdc_error"]
    assert "'unknown-id' is not a Account schema in bronze.schemas" in rows[4]["_cdc_error"]


def test_a_header_naming_another_object_is_quarantined() -> None:
    s = ACCOUNT_V1
    good = change_event(s, "CREATE", ["001A"])
    wrong = good.replace(b"\x0eAccount", b"\x0eContact", 1)
    rows = run(plan_for(s), [(s.schema_id, good), (s.schema_id, wrong)])
    assert rows[0]["_cdc_error"] is None
    assert rows[1]["_cdc_error_kind"] == "wrong_entity"
    assert "entityName is 'Contact'" in rows[1]["_cdc_error"]


def test_a_field_that_changed_type_is_written_as_text() -> None:
    from tests.unit.silver.support import HEADER, change_schema, opt

    head = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}
    v1 = change_schema("Widget__c", [head, opt("Flag__c", "boolean", "Data:Boolean")])
    v2 = change_schema("Widget__c", [head, opt("Flag__c", "string", "Data:DynamicEnum")])
    rows = run(
        plan_for(v1, v2),
        [
            (v1.schema_id, change_event(v1, "CREATE", ["a01A"], {"Flag__c": True})),
            (v2.schema_id, change_event(v2, "CREATE", ["a01B"], {"Flag__c": "Maybe"})),
        ],
    )
    assert [r["Flag__c"] for r in rows] == ["true", "Maybe"]


def test_a_field_that_is_a_record_in_one_version_and_a_value_in_another_is_json_text() -> None:
    # Both versions land in one JSON text column: the record as its JSON, the value as it is.
    from tests.unit.silver.support import ADDRESS, HEADER, change_schema, opt

    head = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}
    v1 = change_schema("Widget__c", [head, opt("Spot__c", ADDRESS, "Data:Address")])
    v2 = change_schema("Widget__c", [head, opt("Spot__c", "string", "Data:Text")])
    events = [
        (v1.schema_id, change_event(v1, "CREATE", ["a01A"], {"Spot__c": {"City": "Paris"}})),
        (v2.schema_id, change_event(v2, "CREATE", ["a01B"], {"Spot__c": "here"})),
        (v1.schema_id, change_event(v1, "CREATE", ["a01C"])),
    ]
    rows = run(plan_for(v1, v2), events)
    assert [r["_cdc_error"] for r in rows] == [None, None, None]
    assert [r["Spot__c"] for r in rows] == [
        '{"City": "Paris", "Latitude": null, "Longitude": null, "PostalCode": null, '
        '"Street": null}',
        "here",
        None,
    ]


def test_a_record_inside_a_compound_is_json_text() -> None:
    from tests.unit.silver.support import HEADER, change_schema, opt

    head = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}
    inner = {
        "type": "record",
        "name": "Inner",
        "fields": [{"name": "X", "type": ["null", "long"], "default": None}],
    }
    outer = {
        "type": "record",
        "name": "Outer",
        "fields": [
            {"name": "Street", "type": ["null", "string"], "default": None},
            {"name": "Geo", "type": ["null", inner], "default": None},
        ],
    }
    s = change_schema("Widget__c", [head, opt("Spot__c", outer, "Data:Address")])
    values = {"Spot__c": {"Street": "1 Main", "Geo": {"X": 5}}}
    (row,) = run(plan_for(s), [(s.schema_id, change_event(s, "CREATE", ["a01A"], values))])
    assert row["_cdc_error"] is None
    assert row["Spot__c"] == {"Street": "1 Main", "Geo": '{"X": 5}'}


def test_an_integer_widened_to_a_double_rounds_to_the_nearest_one() -> None:
    # A field that is a double in one version and a long in another is a DOUBLE column;
    # a long that no double holds exactly (2**53 + 1) rounds, on the row path as on the
    # columnar one, top-level and inside a compound.
    from tests.unit.silver.support import HEADER, change_schema, opt

    head = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}

    def spot(kind: str) -> dict[str, Any]:
        return {
            "type": "record",
            "name": "Spot",
            "fields": [{"name": "N", "type": ["null", kind], "default": None}],
        }

    v1 = change_schema(
        "Widget__c",
        [
            head,
            opt("Amount__c", "double", "Data:Double"),
            opt("Spot__c", spot("double"), "Data:Address"),
        ],
    )
    v2 = change_schema(
        "Widget__c",
        [head, opt("Amount__c", "long", "Data:Long"), opt("Spot__c", spot("long"), "Data:Address")],
    )
    values = {"Amount__c": 2**53 + 1, "Spot__c": {"N": 2**53 + 1}}
    event = change_event(v2, "CREATE", ["a01B"], values)
    plan = plan_for(v1, v2)
    (row,) = run(plan, [(v2.schema_id, event)])
    assert row["_cdc_error"] is None
    assert row["Amount__c"] == float(2**53) and row["Spot__c"] == {"N": float(2**53)}
    with mock.patch.object(decode._Builder, "build", decode._Builder._rows):
        assert run(plan, [(v2.schema_id, event)]) == [row]


def test_decoders_are_built_once_per_worker() -> None:
    s = ACCOUNT_V1
    plan = plan_for(s)
    run(plan, [(s.schema_id, change_event(s, "CREATE", ["001A"]))])
    _schema, decoder = decode._DECODERS.get(s.schema_id)
    run(plan_for(s), [(s.schema_id, change_event(s, "CREATE", ["001B"]))])
    assert decode._DECODERS.get(s.schema_id)[1] is decoder
    assert decoder.specialised


def test_a_batch_without_the_bronze_columns_is_refused() -> None:
    s = ACCOUNT_V1
    table = bronze_batch([(s.schema_id, change_event(s, "CREATE", ["001A"]))]).drop_columns(
        ["batch_seq"]
    )
    with pytest.raises(DecodeError, match="lacks batch_seq"):
        list(decode_batches(plan_for(s), iter(table.to_batches())))


def test_a_large_batch_decodes_as_its_rows_do_in_small_batches() -> None:
    # A batch of a megabyte and more decoded at once and in small slices: the same rows.
    s = ACCOUNT_V2
    events = []
    for i in range(400):
        values = {
            "Name": "Acme" if i % 3 else {"FirstName": "Ada", "LastName": f"L{i}"},
            "BillingAddress": ADDRESS if i % 2 else None,
            "Tier__c": "Gold",
            "Phone": f"+1 555 {i:04d}",
            "AnnualRevenue": i * 1.5,
            "NumberOfEmployees": i,
            "IsActive__c": bool(i % 2),
            "Description": "é" * 1500,
            "SLA_Date__c": i * DAY,
            "Open_At__c": i * 60_000,
            "LastModifiedDate": i,
        }
        payload = change_event(s, "UPDATE", [f"001{i:015d}"], values, changed=["Phone"])
        events.append((s.schema_id, payload))
    assert sum(len(p) for _, p in events) > 1 << 20
    plan = plan_for(ACCOUNT_V1, ACCOUNT_V2)
    table = bronze_batch(events).select(list(BRONZE_COLUMNS))
    columnar = ColumnarDecoder.for_schema(s)
    assert columnar is not None
    assert not columnar.decode(table.column("payload").combine_chunks()).errors
    whole = list(decode_batches(plan, iter(table.to_batches())))
    sliced = list(decode_batches(plan, iter(table.to_batches(max_chunksize=20))))
    assert len(whole) == 1 and len(sliced) == 20
    expected = pa.Table.from_batches(sliced)
    assert pa.Table.from_batches(whole).equals(expected)
    assert expected.column("_cdc_error").null_count == 400


def test_the_batches_spark_hands_a_worker_are_joined_up_to_a_bound_in_order() -> None:
    batches = [pa.record_batch({"replay_id": list(range(n * 3, n * 3 + 3))}) for n in range(5)]
    empty = batches[0].slice(0, 0)
    joined = list(decode._joined(iter([*batches, empty]), 7, 1 << 30))
    # Up to 7 rows: three batches of three make nine, then the rest (and an empty one) together.
    assert [b.num_rows for b in joined] == [9, 6]
    assert [v for b in joined for v in b.column(0).to_pylist()] == list(range(15))
    # A byte bound ends a joined batch too; a lone batch passes as it is.
    assert [b.num_rows for b in decode._joined(iter(batches), 100, 1)] == [3] * 5
    assert [b.num_rows for b in decode._joined(iter([empty, empty]), 7, 1 << 30)] == [0]
