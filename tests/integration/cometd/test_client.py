"""The Streaming API client against the emulator over a real socket: notifications, idle
connects, advice, re-handshake from the caller's durable position, re-authentication, replay
gaps and the guide's errors as named exceptions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.client.retry import RetryPolicy
from ingest.cometd import (
    REPLAY_ALL,
    CometdSubscription,
    IdleConnect,
    NotificationBatch,
    Reconnected,
    ReplayGap,
)
from ingest.emulator.server import Emulator
from ingest.errors import (
    ChannelError,
    HandshakeDeniedError,
    RequestTooLargeError,
    StreamingLimitError,
    StreamingReplayError,
)
from tests.cometd_helpers import change_event, token_manager
from tests.emulator_helpers import FakeClock

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

TOPIC = "/topic/Accts"


class Sleeps:
    """Records waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def accounts(emu: Emulator, *names: str, start: int = 1) -> None:
    emu.append(
        [
            change_event(
                emu,
                "Account",
                "CREATE",
                [f"0010000000000{i:02d}AAA"],
                {"Name": n},
                changed=["Name"],
            )
            for i, n in enumerate(names, start)
        ]
    )


def subscription(emu: Emulator, channels: Any = None, **options: Any) -> CometdSubscription:
    options.setdefault("sleep", Sleeps())
    options.setdefault("retry", RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.01))
    return CometdSubscription(token_manager(emu), channels or {TOPIC: REPLAY_ALL}, **options)


def take(items: Iterator[Any], n: int) -> list[Any]:
    return [next(items) for _ in range(n)]


@pytest.fixture
def topic(emu: Emulator) -> str:
    emu.streaming.create_push_topic("Accts", "SELECT Id, Name FROM Account")
    return TOPIC


def test_notifications_keep_the_raw_message(emu: Emulator, topic: str) -> None:
    accounts(emu, "Acme", "Globex")
    with subscription(emu) as sub:
        items = iter(sub)
        batch = next(items)
        assert isinstance(batch, NotificationBatch)
        first, second = batch.notifications
        assert (first.channel, first.replay_id, first.event_type) == (TOPIC, 1, "created")
        assert first.created_date and first.created_date.endswith("Z")
        assert json.loads(first.raw)["data"]["sobject"]["Name"] == "Acme"
        assert first.data["sobject"]["Name"] == "Acme"
        assert first.kind == "pushtopic" and second.replay_id == 2
        assert batch.latest == {TOPIC: 2}
        assert isinstance(next(items), IdleConnect)
        accounts(emu, "Initech", start=3)
        batch = next(items)
        assert [n.replay_id for n in batch.notifications] == [3]


def test_advice_interval_is_capped_by_the_reconnect_deadlines(emu: Emulator, topic: str) -> None:
    emu.streaming.bayeux.settings = type(emu.streaming.bayeux.settings)(
        poll_timeout=0.2, interval_ms=300_000
    )
    accounts(emu, "Acme")
    sleeps = Sleeps()
    with subscription(emu, sleep=sleeps) as sub:
        items = iter(sub)
        assert isinstance(next(items), NotificationBatch)
        assert isinstance(next(items), IdleConnect)
        assert isinstance(next(items), IdleConnect)
    # After events: within 40 s; idle: within 110 s; each less a safety margin.
    assert sleeps.waits[0] <= 30.0
    assert max(sleeps.waits) <= 100.0


def test_unknown_client_rehandshakes_from_the_durable_position(emu: Emulator, topic: str) -> None:
    accounts(emu, "A", "B", "C")
    stored: dict[str, int] = {}
    with subscription(emu, durable_position=lambda ch: stored.get(ch, REPLAY_ALL)) as sub:
        items = iter(sub)
        batch = next(items)
        assert [n.replay_id for n in batch.notifications] == [1, 2, 3]
        stored[TOPIC] = 2  # the caller landed only the first two
        emu.streaming.expire_session()
        again = next(items)
        assert isinstance(again, Reconnected)
        assert again.positions == {TOPIC: 2}
        assert "Unknown client" in again.reason
        batch = next(items)
        assert [n.replay_id for n in batch.notifications] == [3]
        assert sub.handshakes == 2


def test_a_dropped_long_poll_reconnects_after_a_backoff(emu: Emulator, topic: str) -> None:
    sleeps = Sleeps()
    with subscription(emu, sleep=sleeps) as sub:
        items = iter(sub)
        assert isinstance(next(items), IdleConnect)
        emu.faults.drop_polls(1)
        again = next(items)
        assert isinstance(again, Reconnected) and again.attempt == 1
        assert sleeps.waits  # a backoff came first
        accounts(emu, "After")
        assert isinstance(next(items), NotificationBatch)


def test_revoked_token_logs_in_again(emu: Emulator, topic: str) -> None:
    tokens = token_manager(emu)
    with CometdSubscription(tokens, {TOPIC: REPLAY_ALL}, sleep=Sleeps()) as sub:
        items = iter(sub)
        assert isinstance(next(items), IdleConnect)
        emu.faults.expire_tokens()
        again = next(items)
        assert isinstance(again, Reconnected)
        assert "authentication" in again.reason
        assert tokens.refreshes == 2
        accounts(emu, "Fresh")
        assert isinstance(next(items), NotificationBatch)


@pytest.mark.parametrize(
    ("policy", "resumed", "names"), [("earliest", -2, ["Old", "New"]), ("latest", -1, ["New"])]
)
def test_invalid_replay_id_follows_on_corrupted(
    emu: Emulator, topic: str, policy: str, resumed: int, names: list[str]
) -> None:
    accounts(emu, "Old")
    with subscription(emu, {TOPIC: 77}, on_corrupted=policy) as sub:
        items = iter(sub)
        gap = next(items)
        assert isinstance(gap, ReplayGap)
        assert (gap.channel, gap.rejected, gap.resumed) == (TOPIC, 77, resumed)
        got: list[str] = []
        appended = False
        while len(got) < len(names):
            item = next(items)
            if isinstance(item, NotificationBatch):
                got.extend(n.data["sobject"]["Name"] for n in item.notifications)
            elif isinstance(item, IdleConnect) and not appended:
                accounts(emu, "New", start=2)  # once the channel is subscribed again
                appended = True
        assert got == names


def test_invalid_replay_id_fails_by_default(emu: Emulator, topic: str) -> None:
    with subscription(emu, {TOPIC: 77}) as sub, pytest.raises(StreamingReplayError, match="77"):
        next(iter(sub))


def test_handshake_denied_surfaces_the_failure_reason(emu: Emulator, topic: str) -> None:
    emu.faults.deny_handshakes("403::Organization concurrent user limit exceeded")
    with subscription(emu) as sub, pytest.raises(HandshakeDeniedError) as caught:
        next(iter(sub))
    assert caught.value.failure_reason == "403::Organization concurrent user limit exceeded"
    assert caught.value.error == "403::Handshake denied"


def test_channel_and_limit_errors_are_named(emu: Emulator, topic: str) -> None:
    with subscription(emu, {"/topic/Missing": -1}) as sub, pytest.raises(ChannelError):
        next(iter(sub))
    emu.faults.deny_subscribes("403::Organization total events daily limit exceeded")
    with subscription(emu) as sub, pytest.raises(StreamingLimitError):
        next(iter(sub))


def test_requests_stay_under_32768_bytes(emu: Emulator) -> None:
    names = [f"/u/{'c' * 70}{i:03d}" for i in range(400)]
    for name in names:
        emu.streaming.create_channel(name)
    before = emu.streaming.bayeux.requests
    with subscription(emu, dict.fromkeys(names, -1)) as sub:
        assert isinstance(next(iter(sub)), IdleConnect)
    subscribes = emu.streaming.bayeux.requests - before - 2  # handshake, connect
    assert subscribes >= 2  # 400 subscriptions do not fit one request
    with subscription(emu, {"/u/" + "x" * 33_000: -1}) as sub, pytest.raises(RequestTooLargeError):
        next(iter(sub))


def test_sessions_survive_a_fake_clock(emu: Emulator, topic: str, clock: FakeClock) -> None:
    accounts(emu, "A")
    with subscription(emu, clock=clock) as sub:
        batch = next(iter(sub))
        assert isinstance(batch, NotificationBatch)
        assert batch.received_at == clock()
