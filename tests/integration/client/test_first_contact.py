"""A subscription that never reaches its server fails within ``RetryPolicy.first_contact``,
naming the address and the cause; one that has reached it retries outages as its attempts
allow, each warning naming the address and the cause."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from ingest.client.channel import TlsSettings, connect
from ingest.client.retry import RetryPolicy
from ingest.client.stream import Keepalive
from ingest.client.subscriber import Subscription
from ingest.emulator.server import Emulator
from ingest.errors import TransientError
from ingest.replay import Earliest
from tests.integration.client.conftest import TOPIC, login

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_never_reached_fails_within_the_first_contact_time() -> None:
    port = _closed_port()
    channel = connect(f"127.0.0.1:{port}", tls=TlsSettings(enabled=False), tokens=None)
    policy = RetryPolicy(max_attempts=100, initial_backoff=0.1, max_backoff=0.4, first_contact=1.5)
    started = time.monotonic()
    with (
        Subscription(channel, TOPIC, start=Earliest(), retry=policy) as sub,
        pytest.raises(TransientError) as caught,
    ):
        for _item in sub:  # Resubscribed after each failed attempt
            pass
    assert time.monotonic() - started < 5.0
    message = str(caught.value)
    assert "the first connection failed" in message
    assert f"127.0.0.1:{port}" in message and "refused" in message.lower(), message
    channel.close()


def test_once_reached_outages_are_retried_and_warned_about_with_their_cause(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = login(emulator)
    channel = connect(emulator.grpc_target, tls=TlsSettings(enabled=False), tokens=tokens)
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.1, first_contact=0)
    caplog.set_level(logging.WARNING)
    with (
        Subscription(channel, TOPIC, start=Earliest(), retry=policy, tokens=tokens) as sub,
        pytest.raises(TransientError, match="gave up after 3") as caught,
    ):
        for item in sub:
            if isinstance(item, Keepalive):
                emulator.stop()  # reached once; now the server is gone
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) >= 3
    assert all(emulator.grpc_target in w for w in warnings[-3:]), warnings
    assert "the first connection" not in str(caught.value)
    channel.close()
