"""An unmodified third-party Streaming API client (aiosfstream-ng, on aiocometd-ng) against
the emulator: it logs in with the OAuth password flow, handshakes, subscribes to a PushTopic
with replay -2 and receives the expected notifications.

Only the client's own extension points are used: an authenticator subclass names the
emulator's token URL (the library hard-codes Salesforce's login hosts) and trusts the
emulator's CA; the client's ``ssl`` setting carries the same CA for the Bayeux requests. The
emulator listens on ``localhost`` because aiohttp's cookie jar ignores cookies of bare IP
addresses, and the Streaming API requires the session cookie back.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.cometd import CometdSettings
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from tests.cometd_helpers import change_event
from tests.emulator_helpers import FakeClock

aiosfstream = pytest.importorskip("aiosfstream_ng")
aiohttp = pytest.importorskip("aiohttp")

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]


@pytest.fixture
def tls_emulator() -> Iterator[Emulator]:
    config = EmulatorConfig(host="localhost", tls=True, streaming=CometdSettings(poll_timeout=1.0))
    emu = Emulator(default_catalogue(), config, clock=FakeClock(1_735_689_600.0)).start()
    yield emu
    emu.close()


def _authenticator(emu: Emulator, context: ssl.SSLContext) -> Any:
    class EmulatorPasswordAuthenticator(aiosfstream.PasswordAuthenticator):  # type: ignore[misc]
        @property
        def _token_url(self) -> str:
            return f"{emu.http_url}/services/oauth2/token"

        async def _authenticate(self) -> tuple[int, Any]:
            async with aiohttp.ClientSession() as session:
                data = {
                    "grant_type": "password",
                    "client_id": self.client_id,
                    "client_secret": self.client_secret,
                    "username": self.username,
                    "password": self.password,
                }
                response = await session.post(self._token_url, data=data, ssl=context)
                return response.status, await response.json()

    return EmulatorPasswordAuthenticator(
        consumer_key=DEFAULT_CLIENT.client_id,
        consumer_secret=DEFAULT_CLIENT.client_secret,
        username=DEFAULT_CLIENT.username,
        password=DEFAULT_CLIENT.password,
    )


async def _receive(emu: Emulator, channel: str, count: int) -> list[dict[str, Any]]:
    assert emu.ca_cert_path is not None
    context = ssl.create_default_context(cafile=str(emu.ca_cert_path))
    client = aiosfstream.Client(
        _authenticator(emu, context), replay=aiosfstream.ReplayOption.ALL_EVENTS
    )
    client.ssl = context
    got: list[dict[str, Any]] = []
    async with client:
        await client.subscribe(channel)
        async for message in client:
            got.append(message)
            if len(got) == count:
                break
    return got


def test_aiosfstream_receives_pushtopic_notifications(tls_emulator: Emulator) -> None:
    emu = tls_emulator
    emu.streaming.create_push_topic("Accts", "SELECT Id, Name, Industry FROM Account")
    ids = ["001000000000001AAA", "001000000000002AAA"]
    emu.append(
        [
            change_event(
                emu,
                "Account",
                "CREATE",
                [rid],
                {"Name": f"Acme {i}", "Industry": "Energy"},
                changed=["Name", "Industry"],
            )
            for i, rid in enumerate(ids)
        ]
    )
    emu.append(
        [
            change_event(
                emu, "Account", "UPDATE", [ids[0]], {"Industry": "Banking"}, changed=["Industry"]
            )
        ]
    )
    messages = asyncio.run(asyncio.wait_for(_receive(emu, "/topic/Accts", 3), timeout=30))
    assert [m["channel"] for m in messages] == ["/topic/Accts"] * 3
    assert [m["data"]["event"]["replayId"] for m in messages] == [1, 2, 3]
    assert [m["data"]["event"]["type"] for m in messages] == ["created", "created", "updated"]
    assert messages[2]["data"]["sobject"] == {"Id": ids[0], "Name": "Acme 0", "Industry": "Banking"}
