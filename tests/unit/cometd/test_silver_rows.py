"""Silver's decoding of Streaming API bronze rows, on small explicit Arrow batches: PushTopic
fields typed from the stored describe with the event type kept, generic payloads as strings,
and what is quarantined (with its reason kind, reason and replay id)."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

from pipelines.silver.cometd import STREAM_BRONZE_COLUMNS, CometdRows, stream_plan

pytestmark = pytest.mark.streaming_api

RECEIVED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
QUERY = "SELECT Id, Name, NumberOfEmployees, AnnualRevenue, IsActive__c, Since__c FROM Account"
DESCRIBE = {
    "name": "Account",
    "fields": [
        {"name": "Id", "type": "id"},
        {"name": "Name", "type": "string"},
        {"name": "NumberOfEmployees", "type": "int"},
        {"name": "AnnualRevenue", "type": "currency"},
        {"name": "IsActive__c", "type": "boolean"},
        {"name": "Since__c", "type": "date"},
        {"name": "Industry", "type": "picklist"},
    ],
}
PUSHTOPIC = stream_plan(
    key="streaming:/topic/Accts",
    channel="/topic/Accts",
    kind="pushtopic",
    entity="Account",
    describes=[(DESCRIBE, QUERY)],
)
GENERIC = stream_plan(
    key="streaming:/u/News", channel="/u/News", kind="generic", entity=None, describes=[]
)


def _message(channel: str, replay_id: int, **data: Any) -> str:
    event = {"createdDate": "2026-01-02T03:04:00.000Z", "replayId": replay_id, **data.pop("e", {})}
    return json.dumps({"channel": channel, "data": {"event": event, **data}})


def _bronze(*rows: dict[str, Any]) -> pa.RecordBatch:
    full = [
        {
            "replay_id": None,
            "channel": None,
            "event_type": None,
            "created_date": None,
            "event_uuid": None,
            "malformed": None,
            "received_at": RECEIVED,
            "batch_id": 1,
            "batch_seq": i,
            **row,
        }
        for i, row in enumerate(rows)
    ]
    return pa.RecordBatch.from_pylist([{c: r.get(c) for c in STREAM_BRONZE_COLUMNS} for r in full])


def _decode(plan: Any, batch: pa.RecordBatch) -> list[dict[str, Any]]:
    out = list(CometdRows(plan)(iter([batch])))
    return pa.Table.from_batches(out).to_pylist()


def _notification(replay_id: int, event_type: str, sobject: dict[str, Any]) -> dict[str, Any]:
    return {
        "replay_id": replay_id,
        "channel": "/topic/Accts",
        "event_type": event_type,
        "raw": _message("/topic/Accts", replay_id, e={"type": event_type}, sobject=sobject),
    }


def test_pushtopic_fields_are_typed_from_the_describe_and_keep_the_event_type() -> None:
    schema = PUSHTOPIC.decoded_schema()
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    assert (types["NumberOfEmployees"], types["AnnualRevenue"]) == ("int", "double")
    assert (types["IsActive__c"], types["Since__c"]) == ("boolean", "date")
    assert "Industry" not in types  # only the query's fields are columns

    sobject = {
        "Id": "001A",
        "Name": "Acme",
        "NumberOfEmployees": 12,
        "AnnualRevenue": 1500,
        "IsActive__c": True,
        "Since__c": "2020-05-06",
    }
    rows = _decode(
        PUSHTOPIC,
        _bronze(_notification(7, "created", sobject), _notification(9, "deleted", {"Id": "001A"})),
    )
    created, deleted = rows
    assert created["_cdc_error"] is None
    assert (created["Id"], created["_cdc_change_type"], created["_cdc_event_type"]) == (
        "001A",
        "CREATE",
        "created",
    )
    assert created["NumberOfEmployees"] == 12
    assert created["AnnualRevenue"] == 1500.0
    assert created["Since__c"] == date(2020, 5, 6)
    assert created["_cdc_replay_number"] == 7
    assert created["_cdc_replay_id"] == b"7"
    assert created["_cdc_commit_timestamp"] == datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc)
    assert created["_cdc_changed_fields"] == [k for k in sobject if k != "Id"]
    assert (deleted["_cdc_change_type"], deleted["_cdc_event_type"]) == ("DELETE", "deleted")
    assert deleted["_cdc_changed_fields"] == []


def test_generic_payloads_stay_strings_with_their_metadata() -> None:
    rows = _decode(
        GENERIC,
        _bronze(
            {"replay_id": 1, "channel": "/u/News", "raw": _message("/u/News", 1, payload="hi")},
            {
                "replay_id": 2,
                "channel": "/u/News",
                "raw": _message("/u/News", 2, payload='{"not": "parsed"}'),
            },
        ),
    )
    assert [r["payload"] for r in rows] == ["hi", '{"not": "parsed"}']
    assert [r["_cdc_replay_number"] for r in rows] == [1, 2]
    assert all(r["_cdc_channel"] == "/u/News" and r["_cdc_received_at"] for r in rows)
    assert rows[0]["_cdc_created_date"] == datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc)


def test_bad_messages_carry_reason_and_replay_id_and_the_good_ones_decode() -> None:
    rows = _decode(
        PUSHTOPIC,
        _bronze(
            _notification(1, "updated", {"Id": "001A", "Bogus__c": 3}),
            {"replay_id": None, "raw": "<html>502</html>", "malformed": "not JSON at all"},
            {
                "replay_id": 3,
                "channel": "/topic/Accts",
                "raw": _message("/topic/Accts", 3, e={"type": "updated"}),
                "malformed": None,
                "event_type": "updated",
            },
            _notification(4, "updated", {"Id": "001A", "NumberOfEmployees": "many"}),
            _notification(5, "merged", {"Id": "001A"}),
            _notification(6, "updated", {"Id": "001A", "Name": "Still here"}),
        ),
    )
    got = [(r["_cdc_error_kind"], r["_cdc_replay_id"]) for r in rows]
    assert got == [
        ("unknown_field", b"1"),
        ("not_json", None),
        ("malformed_message", b"3"),
        ("bad_value", b"4"),
        ("bad_event_type", b"5"),
        (None, b"6"),
    ]
    assert "'Bogus__c' is not in the describe of" in rows[0]["_cdc_error"]
    assert rows[1]["_cdc_payload"] == b"<html>502</html>"
    assert "expected a int value" in rows[3]["_cdc_error"]
    assert rows[-1]["Name"] == "Still here"


def test_without_a_stored_describe_every_row_is_quarantined_with_the_cause() -> None:
    plan = stream_plan(
        key="streaming:/topic/Accts",
        channel="/topic/Accts",
        kind="pushtopic",
        entity="Account",
        describes=[],
    )
    (row,) = _decode(plan, _bronze(_notification(1, "created", {"Id": "001A"})))
    assert row["_cdc_error_kind"] == "no_describe"
    assert "bronze.sfcdc_describes" in row["_cdc_error"]
