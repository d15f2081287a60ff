"""Fixtures for client tests: a Pub/Sub API server on a loopback socket and a channel to it."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

import fastavro
import grpc
import pytest

from ingest.auth import Credentials, Secret, TokenManager
from ingest.client.channel import TlsSettings, connect
from ingest.schema import EventSchema, parse_event_schema
from tests.integration.client.fakebus import FakeBus

TENANT = "00D000000000001AAA"
ORDER_SCHEMA = {
    "type": "record",
    "name": "Order_Shipped__e",
    "namespace": "com.sforce.eventbus",
    "fields": [
        {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
        {"name": "CreatedById", "type": "string", "doc": "CreatedBy:EntityId"},
        {
            "name": "Order_Number__c",
            "type": ["null", "string"],
            "default": None,
            "doc": "Data:Text",
        },
        {"name": "Note__c", "type": ["null", "string"], "default": None, "doc": "Data:Text"},
    ],
}
TOPIC = "/event/Order_Shipped__e"


def order_schema(extra_field: str | None = None) -> EventSchema:
    raw = json.loads(json.dumps(ORDER_SCHEMA))
    if extra_field:
        raw["fields"].append(
            {"name": extra_field, "type": ["null", "string"], "default": None, "doc": "Data:Text"}
        )
    return parse_event_schema(json.dumps(raw))


def encode(schema: EventSchema, record: dict[str, object]) -> bytes:
    import io

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


class BusLogin:
    """A token provider that logs in to the FakeBus: each fetch issues a new token."""

    name = "bus_login"

    def __init__(self, bus: FakeBus) -> None:
        self._bus = bus
        self._n = itertools.count(1)
        self.issued: list[str] = []

    def fetch(self) -> Credentials:
        token = f"00D000000000001!tok-{next(self._n)}-s3cr3t"
        self._bus.tokens[token] = TENANT
        self.issued.append(token)
        return Credentials(
            Secret(token), "https://fake.my.salesforce.com", TENANT, None, time.time()
        )


@pytest.fixture
def bus() -> Iterator[FakeBus]:
    server = FakeBus(tokens={})
    server.add_topic(TOPIC, order_schema())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def tokens(bus: FakeBus) -> TokenManager:
    return TokenManager(BusLogin(bus))


@pytest.fixture
def channel(bus: FakeBus, tokens: TokenManager) -> Iterator[grpc.Channel]:
    ch = connect(f"127.0.0.1:{bus.port}", tokens=tokens, tls=TlsSettings(enabled=False))
    yield ch
    ch.close()
