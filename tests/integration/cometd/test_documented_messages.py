"""Salesforce's documented Streaming API messages (``tests/fixtures/streaming_api``) as the
judge of the emulator and of the pipeline:

- the emulator's own messages of every channel kind have the documented shapes (the same keys
  at every level and the same kinds of values), so the emulator and the fixtures cannot drift
  apart again;
- the documented messages, delivered over the wire in a ``/meta/connect`` reply, land in
  bronze, decode into silver without quarantine and merge into gold."""

from __future__ import annotations

import io
import json
import re
import ssl
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pytest

from ingest.emulator.server import Emulator
from ingest.emulator.topics import EmittedEvent
from pipelines.bronze.cometd import CometdLanding
from pipelines.cometd_pipeline import run_cometd_pass
from pipelines.engines import TableRef
from pipelines.engines.local import LocalEngine
from pipelines.spec import load_conf
from tests.cometd_helpers import (
    DOCUMENTED_KINDS,
    Bayeux,
    change_event,
    documented_messages,
    token_manager,
)
from tests.emulator_helpers import FakeClock
from tests.integration.cometd.lake import write_conf

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

INVOICE_QUERY = "SELECT Id, Name, Status__c, Amount__c, Due_Date__c FROM Invoice__c"
INVOICE_1, INVOICE_2 = "a015g00000XyZ12AAB", "a015g00000XyZ13AAB"
ACCOUNT = "0015g00000TnJqZAAV"
ISO_DATETIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ISO_DATE = re.compile(r"^\d{4}-\d\d-\d\d$")
OBJECTS = {
    "invoices": f"""\
        kind: streaming_api
        channel: /topic/InvoiceUpdates
        pushtopic:
          manage: create_or_update
          query: {INVOICE_QUERY}
        """,
    "alerts": "kind: streaming_api\nchannel: /u/Alerts\n",
    "orders_shipped": "kind: streaming_api\nchannel: /event/Order_Shipped__e\n",
    "account_changes": "kind: streaming_api\nchannel: /data/AccountChangeEvent\n",
}


# -- shapes ---------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        if ISO_DATETIME.match(value):
            return "datetime"
        return "date" if ISO_DATE.match(value) else "string"
    if isinstance(value, list):
        return "list"
    return "object"


def shape(value: Any) -> Any:
    """The keys at every level with the kind of each value (numbers are numbers, ISO texts
    are dates or datetimes); a list by the kind of its first element."""
    if isinstance(value, Mapping):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return _kind(value)


def _record_kinds(record: Mapping[str, Any]) -> dict[str, str]:
    # Values the fixture holds as null say nothing about the kind the other side sends.
    return {k: _kind(v) for k, v in record.items() if v is not None}


def _compare_records(emulated: Mapping[str, Any], documented: Mapping[str, Any]) -> None:
    common = set(emulated) & set(documented)
    mine, theirs = _record_kinds(emulated), _record_kinds(documented)
    assert {k: mine.get(k) for k in common if k in theirs} == {
        k: theirs[k] for k in common if k in theirs
    }


def _platform_event(emu: Emulator, values: Mapping[str, Any]) -> EmittedEvent:
    topic = next(t for t in emu.catalogue if t.name == "/event/Order_Shipped__e")
    schema = topic.current_schema
    assert schema is not None
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, dict(values))
    return EmittedEvent(topic.name, schema.schema_id, buf.getvalue(), str(uuid.uuid4()))


def _emulated(emu: Emulator) -> dict[str, list[dict[str, Any]]]:
    """The emulator's messages of each kind, made from the same kinds of changes as the
    fixtures and read with a raw Bayeux client."""
    emu.streaming.create_push_topic("InvoiceUpdates", INVOICE_QUERY)
    channel_id = emu.streaming.create_channel("/u/Alerts")
    invoice = {"Name": "INV-0001", "Status__c": "Open", "Amount__c": 1250.5, "Due_Date__c": 0}
    emu.append(
        [
            change_event(emu, "Invoice__c", "CREATE", [INVOICE_1], invoice),
            change_event(
                emu,
                "Invoice__c",
                "UPDATE",
                [INVOICE_1],
                {"Status__c": "Negotiating"},
                changed=["Status__c"],
            ),
            change_event(emu, "Invoice__c", "DELETE", [INVOICE_1]),
            change_event(emu, "Invoice__c", "UNDELETE", [INVOICE_1], invoice),
        ]
    )
    emu.streaming.push(channel_id, "Warehouse 7 closes at noon")
    emu.append(
        [
            _platform_event(
                emu,
                {
                    "CreatedDate": 1_741_083_552_517,
                    "CreatedById": "0055g00000AbCdEAAY",
                    "Order_Number__c": "ORD-10042",
                    "Carrier__c": "DHL",
                    "Weight_Kg__c": 12.5,
                    "Express__c": True,
                    "Shipped_At__c": 1_741_083_540_000,
                    "Delivery_Date__c": 1_741_219_200_000,
                },
            )
        ]
    )
    account = {
        "Name": "Acme Corp",
        "Industry": "Energy",
        "Phone": "(415) 555-0100",
        "Description": "A customer since 2019.",
        "BillingAddress": {"Street": "1 Market St", "City": "San Francisco"},
        "OwnerId": "0055g00000AbCdEAAY",
        "CreatedDate": 1_741_083_627_000,
    }
    emu.append(
        [
            change_event(emu, "Account", "CREATE", [ACCOUNT], account),
            change_event(
                emu,
                "Account",
                "UPDATE",
                [ACCOUNT],
                {"Industry": "Banking"},
                changed=["Industry"],
                nulled=["Phone"],
            ),
            change_event(emu, "Account", "DELETE", [ACCOUNT]),
        ]
    )
    client = Bayeux(emu)
    try:
        client.handshake()
        channels = {
            "pushtopic": "/topic/InvoiceUpdates",
            "generic": "/u/Alerts",
            "platform_event": "/event/Order_Shipped__e",
            "change_event": "/data/AccountChangeEvent",
        }
        for channel in channels.values():
            assert client.subscribe(channel, -2)["successful"]
        got = client.events(connects=4)
    finally:
        client.close()
    return {kind: [m for m in got if m["channel"] == ch] for kind, ch in channels.items()}


@pytest.fixture
def emulated(emu: Emulator, clock: FakeClock) -> dict[str, list[dict[str, Any]]]:
    return _emulated(emu)


def test_pushtopic_notifications_have_the_documented_shape(
    emulated: dict[str, list[dict[str, Any]]],
) -> None:
    documented = documented_messages("pushtopic")
    by_type = {m["data"]["event"]["type"]: m for m in documented}
    got = emulated["pushtopic"]
    assert [m["data"]["event"]["type"] for m in got] == [
        "created",
        "updated",
        "deleted",
        "undeleted",
    ]
    for message in got:
        expected = by_type[message["data"]["event"]["type"]]
        assert set(message) == set(expected)
        assert shape(message["data"]["event"]) == shape(expected["data"]["event"])
        assert set(message["data"]) == {"event", "sobject"}
        # The record: the query's fields (only Id for a deletion), with the kinds of values
        # the documented one has.
        assert set(message["data"]["sobject"]) == set(expected["data"]["sobject"])
        _compare_records(message["data"]["sobject"], expected["data"]["sobject"])


def test_generic_events_have_the_documented_shape(
    emulated: dict[str, list[dict[str, Any]]],
) -> None:
    (message,) = emulated["generic"]
    assert shape(message) == shape(documented_messages("generic")[0])


def test_platform_events_have_the_documented_shape(
    emulated: dict[str, list[dict[str, Any]]],
) -> None:
    (message,) = emulated["platform_event"]
    (expected,) = documented_messages("platform_event")
    assert set(message) == set(expected)
    assert set(message["data"]) == {"schema", "payload", "event"}
    assert shape(message["data"]["event"]) == shape(expected["data"]["event"])
    assert shape(message["data"]["payload"]) == shape(expected["data"]["payload"])


def test_change_events_have_the_documented_shape(
    emulated: dict[str, list[dict[str, Any]]],
) -> None:
    got = emulated["change_event"]
    documented = documented_messages("change_event")
    assert [m["data"]["payload"]["ChangeEventHeader"]["changeType"] for m in got] == [
        "CREATE",
        "UPDATE",
        "DELETE",
    ]
    for message, expected in zip(got, documented, strict=True):
        assert set(message) == set(expected)
        assert set(message["data"]) == {"schema", "payload", "event"}
        assert shape(message["data"]["event"]) == shape(expected["data"]["event"])
        header = message["data"]["payload"]["ChangeEventHeader"]
        documented_header = expected["data"]["payload"]["ChangeEventHeader"]
        # No nulledFields or diffFields over CometD: those are Pub/Sub's.
        assert shape(header) == shape(documented_header) or (
            not header["changedFields"]
            and {k: v for k, v in shape(header).items() if k != "changedFields"}
            == {k: v for k, v in shape(documented_header).items() if k != "changedFields"}
        )
        _compare_records(message["data"]["payload"], expected["data"]["payload"])
    create, update, delete = got
    # An update holds its changed fields only, a nulled one as null; a delete no field.
    assert set(update["data"]["payload"]) == {
        "ChangeEventHeader",
        "Industry",
        "Phone",
        "LastModifiedDate",
    }
    assert update["data"]["payload"]["Phone"] is None
    assert set(delete["data"]["payload"]) == {"ChangeEventHeader"}
    assert create["data"]["payload"]["BillingAddress"] == {
        "Street": "1 Market St",
        "City": "San Francisco",
    }


# -- the documented messages through bronze, silver and gold --------------------------------


class DeliverDocumented(httpx.BaseTransport):
    """Real HTTPS to the emulator, except that the first ``/meta/connect`` reply also carries
    the documented messages, as Salesforce would have sent them."""

    def __init__(self, ca_file: Path) -> None:
        self._inner = httpx.HTTPTransport(verify=ssl.create_default_context(cafile=str(ca_file)))
        self.delivered = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        if self.delivered or b'"/meta/connect"' not in request.content:
            return response
        replies = json.loads(response.read())
        messages = [m for kind in DOCUMENTED_KINDS for m in documented_messages(kind)]
        self.delivered = len(messages)
        body = json.dumps([*messages, *replies])
        return httpx.Response(200, headers={"Content-Type": "application/json"}, content=body)

    def close(self) -> None:
        self._inner.close()


def test_documented_messages_reach_bronze_silver_and_gold(
    tmp_path: Path, tls_emulator: Emulator
) -> None:
    emu = tls_emulator
    emu.streaming.create_channel("/u/Alerts")
    conf = load_conf(write_conf(tmp_path, emu, OBJECTS))
    engine = LocalEngine(location=tmp_path / "lake")
    transport = DeliverDocumented(emu.ca_cert_path)
    with httpx.Client(transport=transport, timeout=30) as http:
        landing = CometdLanding(
            engine,
            conf.enabled_streams(),
            tokens=token_manager(emu),
            ca_file=emu.ca_cert_path,
            streaming=conf.pipeline.streaming_api,
            ingest=conf.pipeline.ingest,
            http=http,
        )
        result = landing.run(once=True)
    assert transport.delivered == 12
    assert {t.topic: t.events for t in result.topics} == {
        "streaming:/topic/InvoiceUpdates": 6,
        "streaming:/u/Alerts": 2,
        "streaming:/event/Order_Shipped__e": 1,
        "streaming:/data/AccountChangeEvent": 3,
    }

    passed = run_cometd_pass(engine, conf)
    assert {s.stream: s.quarantined for s in passed.silver.streams} == {
        "streaming:/topic/InvoiceUpdates": 0,
        "streaming:/u/Alerts": 0,
        "streaming:/event/Order_Shipped__e": 0,
        "streaming:/data/AccountChangeEvent": 0,
    }

    tables = {s.channel: s.tables for s in conf.enabled_streams()}
    gold_invoices = TableRef("gold", tables["/topic/InvoiceUpdates"].gold)
    invoices = {r["Id"]: r for r in engine.read_arrow(gold_invoices).to_pylist()}
    assert set(invoices) == {INVOICE_1, INVOICE_2}
    first, second = invoices[INVOICE_1], invoices[INVOICE_2]
    assert (first["Status__c"], first["Amount__c"], first["_cdc_is_deleted"]) == (
        "Negotiating",
        1300.0,
        False,
    )
    assert first["_cdc_last_change_type"] == "UNDELETE"
    assert (second["Name"], second["_cdc_is_deleted"]) == ("INV-0002", True)

    gold_accounts = TableRef("gold", tables["/data/AccountChangeEvent"].gold)
    (account,) = engine.read_arrow(gold_accounts).to_pylist()
    assert account["Id"] == ACCOUNT and account["_cdc_is_deleted"] is True
    assert (account["Industry"], account["Phone"], account["Name"]) == (
        "Banking",
        None,
        "Acme Corp",
    )
    assert account["BillingAddress"]["City"] == "Oakland"
    assert account["BillingAddress"]["PostalCode"] == "94105"

    silver_orders = TableRef("silver", tables["/event/Order_Shipped__e"].silver)
    (order,) = engine.read_arrow(silver_orders).to_pylist()
    assert order["_cdc_event_id"] == "8b5bd3b5-77e1-4c6d-b2a3-5e8f0e9ac1d4"
    assert order["Order_Number__c"] == "ORD-10042"
    silver_alerts = TableRef("silver", tables["/u/Alerts"].silver)
    alerts = engine.read_arrow(silver_alerts).column("payload").to_pylist()
    assert sorted(alerts) == sorted(["Warehouse 7 closes at noon", '{"level": "high", "site": 7}'])
