"""Test support for the emulator server: a small inline catalogue, Avro payloads, a fake clock,
a driver for bidirectional streams, and assertions on Salesforce-shaped gRPC errors."""

from __future__ import annotations

import io
import json
import queue
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fastavro
import grpc

from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef
from ingest.pubsub import pb2
from ingest.schema import EventSchema, parse_event_schema

ACCOUNT_TOPIC = "/data/AccountChangeEvent"
WIDGET_TOPIC = "/data/Widget__ChangeEvent"
ORDER_TOPIC = "/event/Order_Event__e"
CHANNEL = "/data/ChangeEvents"
RPC_ID = re.compile(r" rpcId: [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _opt(name: str, avro_type: object, doc: str) -> dict[str, object]:
    return {"name": name, "type": ["null", avro_type], "doc": doc, "default": None}


def change_event_schema(entity: str, *, extra_field: bool = False) -> EventSchema:
    """A small change event schema in Salesforce's shape (header first, nullable body)."""
    record = f"{entity.removesuffix('__c')}__ChangeEvent" if entity.endswith("__c") else entity
    name = record if entity.endswith("__c") else f"{entity}ChangeEvent"
    fields: list[dict[str, object]] = [
        {
            "name": "ChangeEventHeader",
            "doc": "Data:ComplexValueType",
            "type": {
                "type": "record",
                "name": "ChangeEventHeader",
                "fields": [
                    {"name": "entityName", "type": "string"},
                    {"name": "recordIds", "type": {"type": "array", "items": "string"}},
                    {
                        "name": "changeType",
                        "type": {
                            "type": "enum",
                            "name": "ChangeType",
                            "symbols": ["CREATE", "UPDATE", "DELETE", "UNDELETE"],
                        },
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
            },
        },
        _opt("Name", "string", "Data:Text"),
        _opt("LastModifiedDate", "long", "Data:DateTime"),
    ]
    if extra_field:
        fields.append(_opt("Rating", "string", "Data:DynamicEnum"))
    schema = {
        "type": "record",
        "name": name,
        "namespace": "com.sforce.eventbus",
        "fields": fields,
    }
    return parse_event_schema(json.dumps(schema))


def platform_event_schema() -> EventSchema:
    schema = {
        "type": "record",
        "name": "Order_Event__e",
        "namespace": "com.sforce.eventbus",
        "fields": [
            {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
            {"name": "CreatedById", "type": "string", "doc": "CreatedBy:EntityId"},
            _opt("Order_Number__c", "string", "Data:Text:00N000000000001"),
        ],
    }
    return parse_event_schema(json.dumps(schema))


ACCOUNT = change_event_schema("Account")
WIDGET = change_event_schema("Widget__c")
ORDER = platform_event_schema()


def catalogue() -> Catalogue:
    """Account and Widget__c change events, the ChangeEvents channel, one platform event."""
    return Catalogue.of(
        [
            TopicDef(ACCOUNT_TOPIC, "change_events", "Account", (ACCOUNT,)),
            TopicDef(WIDGET_TOPIC, "change_events", "Widget__c", (WIDGET,)),
            TopicDef(ORDER_TOPIC, "platform_event", "Order_Event__e", (ORDER,)),
        ]
    )


def change_payload(schema: EventSchema, record_id: str, name: str, n: int = 0) -> bytes:
    entity = schema.entity_name
    value: dict[str, Any] = {
        "ChangeEventHeader": {
            "entityName": entity,
            "recordIds": [record_id],
            "changeType": "UPDATE",
            "changeOrigin": "",
            "transactionKey": f"tx-{n}",
            "sequenceNumber": 1,
            "commitTimestamp": 1_700_000_000_000 + n * 1000,
            "commitNumber": 1_000_000 + n,
            "commitUser": "005000000000001AAA",
            "nulledFields": [],
            "diffFields": [],
            "changedFields": ["0x06"],
        },
        "Name": name,
        "LastModifiedDate": 1_700_000_000_000 + n * 1000,
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, value)
    return buf.getvalue()


def order_payload(number: str) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        ORDER.parsed,
        {
            "CreatedDate": 1_700_000_000_000,
            "CreatedById": "005000000000001AAA",
            "Order_Number__c": number,
        },
    )
    return buf.getvalue()


def account_events(count: int, start: int = 0) -> list[EmittedEvent]:
    return [
        EmittedEvent(
            ACCOUNT_TOPIC,
            ACCOUNT.schema_id,
            change_payload(ACCOUNT, "001000000000001AAA", f"Acme {i}", i),
            f"acct-{i}",
        )
        for i in range(start, start + count)
    ]


def widget_events(count: int, start: int = 0) -> list[EmittedEvent]:
    return [
        EmittedEvent(
            WIDGET_TOPIC,
            WIDGET.schema_id,
            change_payload(WIDGET, "a01000000000001AAA", f"Widget {i}", i),
            f"widget-{i}",
        )
        for i in range(start, start + count)
    ]


def order_events(count: int, start: int = 0) -> list[EmittedEvent]:
    return [
        EmittedEvent(ORDER_TOPIC, ORDER.schema_id, order_payload(f"O-{i}"), f"order-{i}")
        for i in range(start, start + count)
    ]


class FakeClock:
    """Epoch seconds that only move when a test says so."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


_END = object()


class StreamDriver:
    """Drives a bidirectional call: ``send`` requests, ``next`` responses with a timeout, and
    ``error`` for how the call ended."""

    def __init__(self, method: Any, metadata: Any) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.call = method(self._iter(), metadata=metadata)
        self.ended: grpc.RpcError | None = None
        self.finished = False
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _iter(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item

    def _pump(self) -> None:
        try:
            for response in self.call:
                self._responses.put(response)
        except grpc.RpcError as exc:
            self.ended = exc
        self.finished = True
        self._responses.put(_END)

    def send(self, request: Any) -> StreamDriver:
        self._requests.put(request)
        return self

    def next(self, timeout: float = 5.0) -> Any:
        """The next response; raises ``AssertionError`` when the stream ended instead."""
        item = self._responses.get(timeout=timeout)
        if item is _END:
            self._responses.put(_END)
            raise AssertionError(f"stream ended: {self.ended!r}")
        return item

    def assert_quiet(self, seconds: float) -> None:
        """Nothing arrives (and the stream stays open) for ``seconds``."""
        try:
            item = self._responses.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"expected no response, got {item!r} (ended: {self.ended!r})")

    def events(self, count: int, timeout: float = 5.0) -> list[Any]:
        """Collect ``count`` events across responses (keepalives are skipped)."""
        out: list[Any] = []
        while len(out) < count:
            out.extend(self.next(timeout).events)
        return out

    def wait_end(self, timeout: float = 5.0) -> grpc.RpcError | None:
        """Wait until the call ended; return its error (``None`` for a clean close). Responses
        still queued are discarded."""
        while True:
            item = self._responses.get(timeout=timeout)
            if item is _END:
                self._responses.put(_END)
                return self.ended

    def close(self) -> None:
        self._requests.put(_END)
        self.call.cancel()
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class SfError:
    status: grpc.StatusCode
    details: str
    error_code: str
    rpc_id: str


def sf_error(exc: BaseException | None) -> SfError:
    """The status, description and Salesforce trailers of a failed call."""
    assert isinstance(exc, grpc.RpcError), f"expected a gRPC error, got {exc!r}"
    call: Any = exc
    trailers = dict(call.trailing_metadata() or ())
    return SfError(
        call.code(), call.details(), trailers.get("error-code", ""), trailers.get("rpc-id", "")
    )


def assert_sf_error(
    exc: BaseException | None, status: grpc.StatusCode, code: str, message: str | None = None
) -> SfError:
    """Check the full Salesforce error shape: status, ``rpcId`` suffix matching the ``rpc-id``
    trailer, and the ``error-code`` trailer."""
    err = sf_error(exc)
    assert err.status == status, f"expected {status}, got {err.status}: {err.details}"
    assert err.error_code == "sfdc.platform.eventbus.grpc." + code, err
    assert RPC_ID.search(err.details), f"description must end with ' rpcId: <uuid>': {err.details}"
    assert err.details.endswith(f" rpcId: {err.rpc_id}"), err
    if message is not None:
        assert err.details.startswith(message), f"{err.details!r} does not start with {message!r}"
    return err


def fetch(topic: str = "", n: int = 0, preset: int = pb2.LATEST, replay_id: bytes = b"") -> Any:
    return pb2.FetchRequest(
        topic_name=topic, num_requested=n, replay_preset=preset, replay_id=replay_id
    )
