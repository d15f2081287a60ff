"""The Streaming API messages Salesforce documents (``tests/fixtures/streaming_api``) read by
the client as the text of a connect reply and decoded by silver against the emulator's
describes of the same objects: every one becomes a notification and a silver row, none is
quarantined."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

from ingest.cometd import Notification, parse_notification, split_messages
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.cometd.fields import ObjectFields
from pipelines.silver.cometd import STREAM_BRONZE_COLUMNS, CometdRows, StreamPlan, stream_plan
from pipelines.spec.cometd import ChannelKind
from tests.cometd_helpers import DOCUMENTED_KINDS, documented_messages, documented_text

pytestmark = pytest.mark.streaming_api

RECEIVED = datetime(2025, 3, 4, 10, 30, tzinfo=timezone.utc)
INVOICE_QUERY = "SELECT Id, Name, Status__c, Amount__c, Due_Date__c FROM Invoice__c"
INVOICE_1, INVOICE_2 = "a015g00000XyZ12AAB", "a015g00000XyZ13AAB"
ACCOUNT = "0015g00000TnJqZAAV"
CHANNELS: dict[str, tuple[str, ChannelKind, str | None]] = {
    "pushtopic": ("/topic/InvoiceUpdates", "pushtopic", "Invoice__c"),
    "generic": ("/u/Alerts", "generic", None),
    "platform_event": ("/event/Order_Shipped__e", "platform_event", "Order_Shipped__e"),
    "change_event": ("/data/AccountChangeEvent", "change_event", "Account"),
}


def _describe(entity: str) -> dict[str, Any]:
    for topic in default_catalogue():
        schema = topic.current_schema
        if schema is not None and schema.entity_name == entity:
            return ObjectFields.of_schema(schema).describe("v62.0")
    raise AssertionError(f"the emulator has no {entity}")


def _plan(kind: str) -> StreamPlan:
    channel, channel_kind, entity = CHANNELS[kind]
    describes = [] if entity is None else [(_describe(entity), INVOICE_QUERY)]
    return stream_plan(
        key=f"streaming:{channel}",
        channel=channel,
        kind=channel_kind,
        entity=entity,
        describes=describes,
    )


def _notifications(kind: str) -> list[Notification]:
    """The client's reading of the fixture as a connect reply's body."""
    out = []
    for raw, message in split_messages(documented_text(kind)):
        item = parse_notification(raw, message, received_at=RECEIVED.timestamp())
        assert isinstance(item, Notification), item
        out.append(item)
    return out


def _silver(kind: str) -> list[dict[str, Any]]:
    rows = [
        {
            "replay_id": n.replay_id,
            "channel": n.channel,
            "event_type": n.event_type,
            "created_date": n.created_date,
            "event_uuid": n.event_uuid,
            "raw": n.raw,
            "malformed": None,
            "received_at": RECEIVED,
            "batch_id": 1,
            "batch_seq": i,
        }
        for i, n in enumerate(_notifications(kind))
    ]
    batch = pa.RecordBatch.from_pylist([{c: r[c] for c in STREAM_BRONZE_COLUMNS} for r in rows])
    decoded = pa.Table.from_batches(list(CometdRows(_plan(kind))(iter([batch])))).to_pylist()
    errors = [(r["_cdc_replay_number"], r["_cdc_error"]) for r in decoded if r["_cdc_error"]]
    assert errors == []
    return decoded


@pytest.mark.parametrize("kind", DOCUMENTED_KINDS)
def test_the_client_reads_every_documented_message(kind: str) -> None:
    documented = documented_messages(kind)
    got = _notifications(kind)
    assert [n.channel for n in got] == [m["channel"] for m in documented]
    assert [n.replay_id for n in got] == [m["data"]["event"]["replayId"] for m in documented]
    assert [n.created_date for n in got] == [
        m["data"]["event"].get("createdDate") for m in documented
    ]
    assert [n.event_type for n in got] == [m["data"]["event"].get("type") for m in documented]
    assert [n.event_uuid for n in got] == [m["data"]["event"].get("EventUuid") for m in documented]


def test_pushtopic_notifications_decode_from_data_sobject() -> None:
    rows = _silver("pushtopic")
    assert [(r["Id"], r["_cdc_change_type"], r["_cdc_event_type"]) for r in rows] == [
        (INVOICE_1, "CREATE", "created"),
        (INVOICE_2, "CREATE", "created"),
        (INVOICE_1, "UPDATE", "updated"),
        (INVOICE_1, "DELETE", "deleted"),
        (INVOICE_2, "DELETE", "deleted"),
        (INVOICE_1, "UNDELETE", "undeleted"),
    ]
    first, second, update = rows[:3]
    assert (first["Name"], first["Status__c"], first["Amount__c"]) == ("INV-0001", "Open", 1250.5)
    assert first["Due_Date__c"] == date(2025, 4, 3)
    assert first["_cdc_commit_timestamp"] == datetime(
        2025, 3, 4, 10, 15, 30, 125000, tzinfo=timezone.utc
    )
    assert second["Due_Date__c"] is None and second["_cdc_nulled_fields"] == ["Due_Date__c"]
    assert (update["Status__c"], update["Amount__c"]) == ("Negotiating", 1300.0)
    assert sorted(update["_cdc_changed_fields"]) == sorted(
        ["Amount__c", "Status__c", "Due_Date__c", "Name"]
    )
    assert [r["_cdc_replay_number"] for r in rows] == [11, 12, 15, 16, 19, 23]


def test_generic_payloads_are_kept_as_sent() -> None:
    rows = _silver("generic")
    assert [r["payload"] for r in rows] == [
        "Warehouse 7 closes at noon",
        '{"level": "high", "site": 7}',
    ]
    assert rows[0]["_cdc_created_date"] == datetime(
        2025, 3, 4, 10, 18, 0, 219000, tzinfo=timezone.utc
    )


def test_platform_events_keep_their_event_uuid_and_typed_fields() -> None:
    (row,) = _silver("platform_event")
    assert row["_cdc_event_id"] == "8b5bd3b5-77e1-4c6d-b2a3-5e8f0e9ac1d4"
    assert row["_cdc_schema_id"] == "kPzJ5nPGB1MaJMA8xKEtyA"
    assert (row["Order_Number__c"], row["Carrier__c"], row["Express__c"]) == (
        "ORD-10042",
        "DHL",
        True,
    )
    assert row["Weight_Kg__c"] == 12.5
    assert row["Shipped_At__c"] == datetime(2025, 3, 4, 10, 19, tzinfo=timezone.utc)
    assert row["Delivery_Date__c"] == date(2025, 3, 6)
    assert row["_cdc_replay_number"] == 2041


def test_change_events_over_cometd_derive_what_pubsub_headers_carry() -> None:
    create, update, delete = _silver("change_event")
    assert [r["_cdc_change_type"] for r in (create, update, delete)] == [
        "CREATE",
        "UPDATE",
        "DELETE",
    ]
    assert {r["Id"] for r in (create, update, delete)} == {ACCOUNT}
    billing: Mapping[str, Any] = create["BillingAddress"]
    assert (billing["City"], billing["PostalCode"]) == ("San Francisco", "94105")
    assert create["_cdc_commit_timestamp"] == datetime(2025, 3, 4, 10, 20, 27, tzinfo=timezone.utc)
    assert create["_cdc_commit_number"] == 1082990428293
    # The header names the changed fields; a CometD header has no nulledFields, so a changed
    # field that comes as null is the nulled one.
    assert update["_cdc_changed_fields"] == [
        "Industry",
        "Phone",
        "BillingAddress.City",
        "LastModifiedDate",
    ]
    assert update["_cdc_nulled_fields"] == ["Phone"]
    assert update["Industry"] == "Banking" and update["BillingAddress"]["City"] == "Oakland"
    assert delete["_cdc_changed_fields"] == [] and delete["_cdc_nulled_fields"] == []
