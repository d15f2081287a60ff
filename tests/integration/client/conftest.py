"""Fixtures for client tests: the emulator on a loopback socket, real logins against its OAuth
endpoint, and a channel whose requests a recording interceptor observes on the wire."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fastavro
import grpc
import pytest

from ingest.auth import ClientCredentials, Secret, TokenManager
from ingest.client.channel import TlsSettings, connect
from ingest.client.managed import ManagedSubscription
from ingest.emulator.managed import ManagedSubscriptionConfig
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef
from ingest.schema import EventSchema, parse_event_schema

TOPIC = "/event/Order_Shipped__e"
ACCOUNT = "/data/AccountChangeEvent"
CONTACT = "/data/ContactChangeEvent"
CHANNEL = "/data/ChangeEvents"
MANAGED = "Orders_Managed"

ORDER_SCHEMA: dict[str, Any] = {
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


def order_schema(extra_field: str | None = None) -> EventSchema:
    raw = json.loads(json.dumps(ORDER_SCHEMA))
    if extra_field:
        raw["fields"].append(
            {"name": extra_field, "type": ["null", "string"], "default": None, "doc": "Data:Text"}
        )
    return parse_event_schema(json.dumps(raw))


def change_schema(entity: str) -> EventSchema:
    header = {
        "type": "record",
        "name": "ChangeEventHeader",
        "fields": [
            {"name": "entityName", "type": "string"},
            {"name": "recordIds", "type": {"type": "array", "items": "string"}},
            {
                "name": "changeType",
                "type": {"type": "enum", "name": "ChangeType", "symbols": ["CREATE", "UPDATE"]},
            },
            {"name": "changeOrigin", "type": "string"},
            {"name": "transactionKey", "type": "string"},
            {"name": "sequenceNumber", "type": "int"},
            {"name": "commitTimestamp", "type": "long"},
            {"name": "commitNumber", "type": "long"},
            {"name": "commitUser", "type": "string"},
            {"name": "nulledFields", "type": {"type": "array", "items": "string"}},
            {"name": "diffFields", "type": {"type": "array", "items": "string"}},
            {"name": "changedFields", "type": {"type": "array", "items": "string"}},
        ],
    }
    raw = {
        "type": "record",
        "name": f"{entity}ChangeEvent",
        "namespace": "com.sforce.eventbus",
        "fields": [
            {"name": "ChangeEventHeader", "type": header, "doc": "Data:ComplexValueType"},
            {"name": "Name", "type": ["null", "string"], "default": None, "doc": "Data:Text"},
        ],
    }
    return parse_event_schema(json.dumps(raw))


def encode(schema: EventSchema, record: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


def order(i: int, note: str | None = None) -> dict[str, object]:
    return {
        "CreatedDate": 1_700_000_000_000 + i,
        "CreatedById": "005000000000001AAA",
        "Order_Number__c": f"O-{i}",
        "Note__c": note,
    }


def change(entity: str, i: int) -> dict[str, object]:
    return {
        "ChangeEventHeader": {
            "entityName": entity,
            "recordIds": [f"001{i:015d}"],
            "changeType": "CREATE",
            "changeOrigin": "",
            "transactionKey": str(uuid.uuid4()),
            "sequenceNumber": 1,
            "commitTimestamp": 1_700_000_000_000,
            "commitNumber": 10 + i,
            "commitUser": "005000000000001AAA",
            "nulledFields": [],
            "diffFields": [],
            "changedFields": [],
        },
        "Name": f"{entity} {i}",
    }


def fill(emulator: Emulator, n: int, topic: str = TOPIC, start: int = 0) -> list[bytes]:
    """Append ``n`` events to ``topic`` with its current schema; returns their replay ids."""
    schema = emulator.catalogue.topic(topic).current_schema
    assert schema is not None
    if topic == TOPIC:
        payloads = [encode(schema, order(start + i)) for i in range(n)]
    else:
        entity = emulator.catalogue.topic(topic).entity or "Account"
        payloads = [encode(schema, change(entity, start + i)) for i in range(n)]
    return emulator.append(
        EmittedEvent(topic, schema.schema_id, p, str(uuid.uuid4())) for p in payloads
    )


def wait_answered(sub: ManagedSubscription) -> None:
    """Wait (up to 30 s) until the server has answered every commit ``sub`` sent: answers
    arrive on the stream's reader thread, after ``commit`` returns."""
    deadline = time.monotonic() + 30
    while sub.outstanding_commits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sub.outstanding_commits == ()


def make_catalogue() -> Catalogue:
    return Catalogue.of(
        [
            TopicDef(TOPIC, "platform_event", None, (order_schema(),)),
            TopicDef(ACCOUNT, "change_events", "Account", (change_schema("Account"),)),
            TopicDef(CONTACT, "change_events", "Contact", (change_schema("Contact"),)),
        ]
    )


FAST = {
    "keepalive_interval": 0.2,
    "idle_timeout": 3.0,
    "managed_subscriptions": (
        ManagedSubscriptionConfig(MANAGED, TOPIC, default_replay="EARLIEST"),
    ),
}


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., Emulator]]:
    started: list[Emulator] = []

    def make(*, clock: Callable[[], float] = time.time, **overrides: Any) -> Emulator:
        emulator = Emulator(make_catalogue(), EmulatorConfig(**{**FAST, **overrides}), clock=clock)
        emulator.start()
        started.append(emulator)
        return emulator

    yield make
    for emulator in started:
        emulator.close()


@pytest.fixture
def emulator(make_emulator: Callable[..., Emulator]) -> Emulator:
    return make_emulator()


def login(emulator: Emulator, **kwargs: Any) -> TokenManager:
    provider = ClientCredentials(
        emulator.http_url,
        client_id=DEFAULT_CLIENT.client_id,
        client_secret=Secret(DEFAULT_CLIENT.client_secret),
        ca_file=emulator.ca_cert_path,
    )
    return TokenManager(provider, **kwargs)


@pytest.fixture
def tokens(emulator: Emulator) -> TokenManager:
    return login(emulator)


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Watches what the client puts on the wire: every request of every call. (Events
    outstanding are the server's to count, :attr:`Emulator.peak_requested`: a Subscribe
    stream asks for more as soon as gRPC has parsed a response, before the call hands that
    response on, so an interceptor would see the request first.)"""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first_requests: list[Any] = []
        self.requests: list[Any] = []
        self.unary: list[str] = []
        self.unary_requests: list[Any] = []
        self.streams = 0
        self.fetch_sizes: list[int] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        with self.lock:
            self.unary.append(details.method.rsplit("/", 1)[-1])
            self.unary_requests.append(request)
        return continuation(details, request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        state = {"first": True}
        with self.lock:
            self.streams += 1

        def watch_requests() -> Iterator[Any]:
            for request in requests:
                with self.lock:
                    if state["first"]:
                        self.first_requests.append(request)
                        state["first"] = False
                    self.requests.append(request)
                    n = getattr(request, "num_requested", 0)
                    if n:
                        self.fetch_sizes.append(n)
                yield request

        return continuation(details, watch_requests())


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def channel(emulator: Emulator, tokens: TokenManager, recorder: Recorder) -> Iterator[grpc.Channel]:
    ch = connect(emulator.grpc_target, tokens=tokens, tls=TlsSettings(enabled=False))
    yield grpc.intercept_channel(ch, recorder)
    ch.close()


class FakeClock:
    """Epoch seconds that tests move forward instead of waiting."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now
