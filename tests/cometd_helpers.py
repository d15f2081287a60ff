"""Test support for the Streaming API: an emulator with sub-second long polls and a fake clock,
hand-made change events on the shipped objects, a raw Bayeux client over httpx and a token
manager logging in against the emulator."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pytest

from ingest.auth import ClientCredentials, Secret, TokenManager
from ingest.emulator.bitmaps import encode_field_names
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.cometd import CometdSettings
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.topics import EmittedEvent
from ingest.schema import EventSchema
from tests.emulator_helpers import FakeClock

ACCOUNT_TOPIC = "/data/AccountChangeEvent"
FAST = CometdSettings(poll_timeout=0.3)
_HEADER_DEFAULTS: dict[str, Any] = {
    "changeOrigin": "",
    "sequenceNumber": 1,
    "commitNumber": 1_000_000,
    "commitUser": "005000000000001AAA",
}


def start_emulator(clock: FakeClock, **settings: Any) -> Emulator:
    streaming = CometdSettings(**{"poll_timeout": 0.3, **settings})
    return Emulator(default_catalogue(), EmulatorConfig(streaming=streaming), clock=clock).start()


def token_manager(emu: Emulator) -> TokenManager:
    provider = ClientCredentials(
        emu.http_url,
        client_id=DEFAULT_CLIENT.client_id,
        client_secret=Secret(DEFAULT_CLIENT.client_secret),
        ca_file=emu.ca_cert_path,
    )
    return TokenManager(provider)


def schema_of(emu: Emulator, entity: str) -> EventSchema:
    schema = emu.catalogue.topic_for_entity(entity).current_schema
    assert schema is not None
    return schema


def change_event(
    emu: Emulator,
    entity: str,
    change_type: str,
    record_ids: Sequence[str],
    values: Mapping[str, Any] | None = None,
    *,
    changed: Sequence[str] = (),
    nulled: Sequence[str] = (),
    diffed: Sequence[str] = (),
    commit_ms: int = 1_735_689_600_000,
) -> EmittedEvent:
    """A change event on a shipped object, written with its current schema (``diffed``: the
    fields whose values are diffs)."""
    schema = schema_of(emu, entity)
    body = dict(values or {})
    if change_type == "UPDATE":
        changed = tuple(dict.fromkeys([*changed, *nulled, *diffed, "LastModifiedDate"]))
        body.setdefault("LastModifiedDate", commit_ms)
    header = {
        **_HEADER_DEFAULTS,
        "entityName": entity,
        "recordIds": list(record_ids),
        "changeType": change_type,
        "transactionKey": str(uuid.uuid4()),
        "commitTimestamp": commit_ms,
        "nulledFields": encode_field_names(schema, nulled),
        "diffFields": encode_field_names(schema, diffed),
        "changedFields": encode_field_names(schema, changed),
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, {"ChangeEventHeader": header, **body})
    topic = emu.catalogue.topic_for_entity(entity).name
    return EmittedEvent(topic, schema.schema_id, buf.getvalue(), str(uuid.uuid4()))


class Bayeux:
    """A raw Bayeux client over httpx, for testing the emulator's replies one by one."""

    def __init__(self, emu: Emulator, *, token: str | None = None, version: str = "62.0") -> None:
        self.token = token if token is not None else emu.issue_token().access_token
        self.http = httpx.Client(base_url=emu.http_url, verify=False, timeout=10)
        self.path = f"/cometd/{version}" if version else "/cometd"
        self.client_id = ""
        self._n = 0

    def post(self, *messages: Mapping[str, Any], token: str | None = None) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        use = self.token if token is None else token
        if use:
            headers["Authorization"] = f"Bearer {use}"
        return self.http.post(self.path, json=list(messages), headers=headers)

    def send(self, *messages: Mapping[str, Any], token: str | None = None) -> list[Any]:
        answer = self.post(*messages, token=token).json()
        assert isinstance(answer, list)
        return answer

    def _id(self) -> str:
        self._n += 1
        return str(self._n)

    def handshake(self) -> dict[str, Any]:
        reply: dict[str, Any] = self.send(
            {
                "channel": "/meta/handshake",
                "version": "1.0",
                "supportedConnectionTypes": ["long-polling"],
                "id": self._id(),
            }
        )[0]
        self.client_id = reply.get("clientId", "")
        return reply

    def subscribe(self, channel: str, replay: int | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "channel": "/meta/subscribe",
            "clientId": self.client_id,
            "subscription": channel,
            "id": self._id(),
        }
        if replay is not None:
            message["ext"] = {"replay": {channel: replay}}
        reply: dict[str, Any] = self.send(message)[0]
        return reply

    def connect(self) -> list[Any]:
        return self.send(
            {
                "channel": "/meta/connect",
                "clientId": self.client_id,
                "connectionType": "long-polling",
                "id": self._id(),
            }
        )

    def events(self, *, connects: int = 3) -> list[dict[str, Any]]:
        """The event messages of up to ``connects`` connects, until one brings nothing."""
        out: list[dict[str, Any]] = []
        for _ in range(connects):
            got = [m for m in self.connect() if not m["channel"].startswith("/meta/")]
            out.extend(got)
            if not got and out:
                break
        return out

    def disconnect(self) -> list[Any]:
        return self.send({"channel": "/meta/disconnect", "clientId": self.client_id, "id": "x"})

    def close(self) -> None:
        """Disconnect the session (if one was made) and close the HTTP client."""
        if self.client_id:
            self.disconnect()
        self.http.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_735_689_600.0)


def assert_sessions_closed(request: pytest.FixtureRequest, emulator: Emulator) -> None:
    """Fail the test when it left CometD sessions open on ``emulator``: sfcdc's client sends
    ``/meta/disconnect`` when it stops and before it handshakes again (an org allows only so
    many concurrent clients). Tests that leave sessions on purpose (raw protocol exchanges,
    SIGKILLed landings) are marked ``leaves_sessions``."""
    if request.node.get_closest_marker("leaves_sessions") is not None:
        return
    left = emulator.streaming.sessions_left_open()
    assert left == 0, (
        f"{left} CometD session(s) left open: the client must send /meta/disconnect when it "
        "stops and before a new handshake"
    )


@pytest.fixture
def emu(clock: FakeClock, request: pytest.FixtureRequest) -> Iterator[Emulator]:
    emulator = start_emulator(clock)
    try:
        yield emulator
        assert_sessions_closed(request, emulator)
    finally:
        emulator.close()


@pytest.fixture
def bayeux(emu: Emulator) -> Iterator[Bayeux]:
    client = Bayeux(emu)
    yield client
    client.close()


DOCUMENTED = Path(__file__).parent / "fixtures" / "streaming_api"
DOCUMENTED_KINDS = ("pushtopic", "generic", "platform_event", "change_event")


def documented_text(kind: str) -> str:
    """The documented messages of one channel kind (``tests/fixtures/streaming_api``) as the
    text of a connect reply's array."""
    return (DOCUMENTED / f"{kind}.json").read_text()


def documented_messages(kind: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(documented_text(kind))
    return messages
