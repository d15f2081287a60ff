"""Subscribe against a Pub/Sub API server over a socket: flow control, keepalives, faults."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pytest

from ingest.auth import TokenManager
from ingest.client.channel import TlsSettings, connect
from ingest.client.retry import RetryPolicy
from ingest.client.stream import EventBatch, Keepalive, ReplayGap, Resubscribed
from ingest.client.subscriber import Subscription
from ingest.emulator.server import Emulator
from ingest.errors import PermanentError, ReplayIdError
from ingest.replay import After, Earliest, Latest, ReplayId, StartPosition
from tests.integration.client.conftest import TOPIC, FakeClock, Recorder, fill, login

pytestmark = pytest.mark.integration

FAST_RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.0, max_backoff=0.0)


def test_reads_everything_in_order_within_the_window(
    emulator: Emulator, channel: grpc.Channel, recorder: Recorder
) -> None:
    fill(emulator, 450)
    got: list[bytes] = []
    with Subscription(channel, TOPIC, start=Earliest(), retry=FAST_RETRY) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got.extend(e.replay_id.value for e in item.events)
                assert item.latest_replay_id == item.events[-1].replay_id
            if len(got) >= 450:
                break
    assert got == [e.replay_id for e in emulator.log(TOPIC)]
    assert emulator.peak_requested <= 100
    assert recorder.first_requests[0].replay_preset == 1  # EARLIEST


class StoringConsumer:
    """Stores events in a list every ``commit_every`` batches, like bronze commits to Delta.

    Events handed out but not yet stored are dropped on ``Resubscribed``; the durable
    position is after the last stored event (or keepalive).
    """

    def __init__(self, start: StartPosition, commit_every: int = 3) -> None:
        self.start = start
        self.commit_every = commit_every
        self.stored: list[bytes] = []
        self.stored_ids: list[str] = []
        self.pending: list[tuple[bytes, str]] = []
        self.position: StartPosition = start
        self.pending_position: StartPosition | None = None
        self.batches = 0
        self.resubscribed: list[Resubscribed] = []
        self.gap_resumed: StartPosition | None = None

    def durable_position(self) -> StartPosition:
        return self.position

    def handle(self, item: object) -> None:
        if isinstance(item, ReplayGap):
            self.gap_resumed = item.resumed
            return
        if isinstance(item, Resubscribed):
            self.resubscribed.append(item)
            assert item.position in (self.position, self.gap_resumed)
            self.pending.clear()
            self.pending_position = None
            return
        if isinstance(item, EventBatch):
            self.pending.extend((e.replay_id.value, e.event_id) for e in item.events)
            self.pending_position = After(item.latest_replay_id)
            self.batches += 1
            if self.batches % self.commit_every == 0:
                self.commit()
        elif isinstance(item, Keepalive):
            self.pending_position = After(item.latest_replay_id)

    def commit(self) -> None:
        self.stored.extend(r for r, _ in self.pending)
        self.stored_ids.extend(i for _, i in self.pending)
        self.pending.clear()
        if self.pending_position is not None:
            self.position = self.pending_position


def _consume(sub: Subscription, consumer: StoringConsumer, total: int) -> None:
    for item in sub:
        consumer.handle(item)
        if len(consumer.stored) + len(consumer.pending) >= total and isinstance(item, EventBatch):
            consumer.commit()
            if len(consumer.stored) >= total:
                break


def test_hundred_stream_failures_lose_and_duplicate_nothing(
    emulator: Emulator, channel: grpc.Channel, recorder: Recorder
) -> None:
    fill(emulator, 1010)
    emulator.faults.cut_streams(10, repeat=True)
    consumer = StoringConsumer(Earliest())
    sleeps: list[float] = []
    sub = Subscription(
        channel,
        TOPIC,
        start=Earliest(),
        durable_position=consumer.durable_position,
        retry=RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.004),
        sleep=sleeps.append,
    )
    with sub:
        _consume(sub, consumer, 1010)
    log = [e.replay_id for e in emulator.log(TOPIC)]
    assert consumer.stored == log
    assert len(set(consumer.stored_ids)) == len(log)
    assert len(consumer.resubscribed) >= 100
    assert sub.stats().streams >= 101 and recorder.streams == sub.stats().streams
    # every resubscription started after the durable position, and waited a jittered backoff
    assert sum(isinstance(r.position, After) for r in consumer.resubscribed) >= 90
    assert len(sleeps) >= 100 and all(0 <= s <= 0.004 for s in sleeps)
    assert emulator.peak_requested <= 100


def test_without_durable_callback_resumes_after_the_last_item_handed_out(
    emulator: Emulator, channel: grpc.Channel, recorder: Recorder
) -> None:
    fill(emulator, 95)
    emulator.faults.cut_streams(30, repeat=True)
    got: list[bytes] = []
    with Subscription(
        channel, TOPIC, start=Earliest(), retry=FAST_RETRY, sleep=lambda s: None
    ) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got.extend(e.replay_id.value for e in item.events)
            if len(got) >= 95:
                break
    assert got == [e.replay_id for e in emulator.log(TOPIC)]
    customs = [r for r in recorder.first_requests if r.replay_preset == 2]
    assert customs and all(r.replay_id for r in customs)


@pytest.mark.timeout(60)  # without keepalives the loop would wait for one forever
def test_without_durable_callback_resumes_after_the_newest_keepalive_position(
    make_emulator: Callable[..., Emulator], recorder: Recorder
) -> None:
    # Keepalives on a quiet topic carry a latest_replay_id past its last event (the bus moves
    # on); resuming there, not after the last event, is what keeps an idle topic's position
    # inside the retention window.
    emulator = make_emulator(keepalive_interval=0.05)
    channel = grpc.intercept_channel(
        connect(emulator.grpc_target, tokens=login(emulator), tls=TlsSettings(enabled=False)),
        recorder,
    )
    events = fill(emulator, 5)
    got: list[bytes] = []
    keepalive: Keepalive | None = None
    resubscribed: Resubscribed | None = None
    with Subscription(
        channel, TOPIC, start=Earliest(), retry=FAST_RETRY, sleep=lambda s: None
    ) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got.extend(e.replay_id.value for e in item.events)
            elif isinstance(item, Keepalive) and len(got) == 5 and keepalive is None:
                assert item.latest_replay_id.value[:8] > events[-1][:8]
                keepalive = item
                emulator.restart()  # the stream ends with UNAVAILABLE; the client resumes
            elif isinstance(item, Resubscribed):
                resubscribed = item
                later = fill(emulator, 1, start=5)
            if resubscribed is not None and len(got) == 6:
                break
    channel.close()
    assert keepalive is not None and resubscribed is not None
    assert got == [*events, *later]
    assert resubscribed.position == After(keepalive.latest_replay_id)
    resumed = recorder.first_requests[-1]
    assert resumed.replay_preset == 2  # CUSTOM
    assert resumed.replay_id == keepalive.latest_replay_id.value


def test_token_expiry_mid_stream_is_recovered_without_losing_position(
    emulator: Emulator, channel: grpc.Channel, tokens: TokenManager
) -> None:
    fill(emulator, 40)
    consumer = StoringConsumer(Earliest(), commit_every=1)
    expired = threading.Event()
    with Subscription(
        channel,
        TOPIC,
        start=Earliest(),
        durable_position=consumer.durable_position,
        tokens=tokens,
        retry=FAST_RETRY,
        sleep=lambda s: None,
    ) as sub:
        for item in sub:
            consumer.handle(item)
            if len(consumer.stored) >= 40 and not expired.is_set():
                # Tokens are checked when a call starts: the stream carries on until it is
                # cut, and the reconnect then meets the expired token.
                emulator.faults.expire_tokens()
                emulator.faults.cut_streams(5)
                expired.set()
                fill(emulator, 40)
            if len(consumer.stored) >= 80:
                break
    assert consumer.stored == [e.replay_id for e in emulator.log(TOPIC)]
    assert tokens.refreshes == 2
    assert any("credentials rejected" in r.reason for r in consumer.resubscribed)


def test_corrupted_replay_id_fails_by_default_naming_the_position_and_the_ways_out(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    fill(emulator, 10)
    gone = ReplayId(emulator.log(TOPIC)[2].replay_id)
    emulator.faults.purge(through=emulator.log(TOPIC)[4].replay_id)
    sub = Subscription(channel, TOPIC, start=After(gone), retry=FAST_RETRY)
    with pytest.raises(ReplayIdError) as info, sub:
        next(iter(sub))
    message = str(info.value)
    assert gone.hex() in message
    assert "on_corrupted='earliest'" in message and "on_corrupted='latest'" in message
    assert info.value.error_code.endswith("replayid.corrupted")
    assert info.value.rpc_id


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_corrupted_replay_id_under_a_policy_yields_the_gap(
    emulator: Emulator, channel: grpc.Channel, policy: str
) -> None:
    fill(emulator, 10)
    gone = ReplayId(emulator.log(TOPIC)[2].replay_id)
    emulator.faults.purge(through=emulator.log(TOPIC)[4].replay_id)
    retained = [e.replay_id for e in emulator.log(TOPIC)]
    consumer = StoringConsumer(After(gone), commit_every=1)
    items: list[object] = []
    filled = False
    with Subscription(
        channel,
        TOPIC,
        start=After(gone),
        durable_position=consumer.durable_position,
        on_corrupted=policy,  # type: ignore[arg-type]
        retry=FAST_RETRY,
    ) as sub:
        for item in sub:
            items.append(item)
            consumer.handle(item)
            if isinstance(item, Keepalive) and policy == "latest" and not filled:
                # the stream at LATEST is open now: these are new events
                fill(emulator, 3)
                filled = True
            if policy == "earliest" and len(consumer.stored) >= 5:
                break
            if policy == "latest" and len(consumer.stored) >= 3:
                break
    gaps = [i for i in items if isinstance(i, ReplayGap)]
    assert len(gaps) == 1
    assert gaps[0].requested == After(gone)
    assert gaps[0].resumed == (Earliest() if policy == "earliest" else Latest())
    assert gone.hex() in gaps[0].reason
    if policy == "earliest":
        assert consumer.stored == retained
    else:
        assert consumer.stored == [e.replay_id for e in emulator.log(TOPIC)][-3:]


def test_unknown_topic_fails_fast_with_what_to_fix(channel: grpc.Channel) -> None:
    sleeps: list[float] = []
    sub = Subscription(channel, "/data/NoSuchChangeEvent", retry=FAST_RETRY, sleep=sleeps.append)
    with pytest.raises(PermanentError) as info, sub:
        next(iter(sub))
    assert "topic.not.found" in str(info.value)
    assert "check the name" in str(info.value)
    assert info.value.status == "NOT_FOUND"
    assert sleeps == []


def test_keepalives_surface_with_the_latest_replay_id(
    make_emulator: Callable[..., Emulator],
) -> None:
    emulator = make_emulator(keepalive_interval=0.05)
    channel = connect(emulator.grpc_target, tokens=login(emulator), tls=TlsSettings(enabled=False))
    seen: list[Keepalive] = []
    with Subscription(channel, TOPIC, start=Latest()) as sub:
        for item in sub:
            assert isinstance(item, Keepalive)
            seen.append(item)
            if len(seen) == 3:
                break
    assert all(k.latest_replay_id.value for k in seen)
    assert seen[0].pending_num_requested == 100


def test_a_stalled_consumer_keeps_the_stream_open_with_a_one_event_request(
    make_emulator: Callable[..., Emulator],
) -> None:
    emulator = make_emulator(idle_timeout=0.4)
    channel = connect(emulator.grpc_target, tokens=login(emulator), tls=TlsSettings(enabled=False))
    fill(emulator, 150)
    got = 0
    with Subscription(
        channel,
        TOPIC,
        start=Earliest(),
        buffer_events=100,
        idle_fetch_after=0.1,
        retry=FAST_RETRY,
    ) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got += len(item.events)
                if got == 100:
                    # the whole window is buffered and nothing is outstanding: stall
                    threading.Event().wait(1.0)
                    assert sub.stats().buffered + sub.stats().outstanding <= 101
            if got >= 150:
                break
        assert sub.stats().streams == 1
    assert got == 150


def test_slow_consumer_bounds_the_buffer(
    emulator: Emulator, channel: grpc.Channel, recorder: Recorder
) -> None:
    fill(emulator, 600)
    seen = 0
    with Subscription(channel, TOPIC, start=Earliest(), num_requested=50, buffer_events=120) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                seen += len(item.events)
                stats = sub.stats()
                assert stats.outstanding <= 50
                assert stats.outstanding + stats.buffered <= 120
                threading.Event().wait(0.002)
            if seen >= 600:
                break
    assert emulator.peak_requested <= 50


def test_a_busy_consumer_finds_the_next_events_already_received(
    emulator: Emulator, channel: grpc.Channel, recorder: Recorder
) -> None:
    fill(emulator, 400)
    with Subscription(channel, TOPIC, start=Earliest(), buffer_events=300) as sub:
        for item in sub:
            assert isinstance(item, EventBatch)
            # a slow commit: meanwhile the reader keeps receiving, within the buffer bound
            threading.Event().wait(0.3)
            stats = sub.stats()
            assert stats.buffered >= 200
            assert stats.buffered + stats.outstanding <= 300
            break
    assert emulator.peak_requested <= 100


def test_the_byte_bound_stops_requests(emulator: Emulator, channel: grpc.Channel) -> None:
    fill(emulator, 400)
    with Subscription(
        channel, TOPIC, start=Earliest(), buffer_events=400, buffer_bytes=20_000
    ) as sub:
        for _item in sub:
            threading.Event().wait(0.3)
            # events are ~100 bytes each: one window of 100 fills the byte budget
            assert sub.stats().buffered <= 200
            break


def test_a_subscription_is_iterated_once(emulator: Emulator, channel: grpc.Channel) -> None:
    fill(emulator, 3)
    with Subscription(channel, TOPIC, start=Earliest()) as sub:
        for _item in sub:
            break
        with pytest.raises(RuntimeError, match="iterated once"):
            next(iter(sub))


def test_survives_an_emulator_restart(emulator: Emulator, channel: grpc.Channel) -> None:
    fill(emulator, 50)
    consumer = StoringConsumer(Earliest(), commit_every=1)
    restarted = False
    with Subscription(
        channel,
        TOPIC,
        start=Earliest(),
        durable_position=consumer.durable_position,
        retry=RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.2),
    ) as sub:
        for item in sub:
            consumer.handle(item)
            if len(consumer.stored) >= 20 and not restarted:
                emulator.restart()  # every stream ends with UNAVAILABLE; same ports after
                fill(emulator, 30, start=50)
                restarted = True
            if len(consumer.stored) >= 80:
                break
    assert consumer.stored == [e.replay_id for e in emulator.log(TOPIC)]
    assert consumer.resubscribed


def test_tokens_are_refreshed_before_the_server_expires_them(
    make_emulator: Callable[..., Emulator],
) -> None:
    clock = FakeClock()
    emulator = make_emulator(token_ttl=600.0, clock=clock)
    tokens = login(emulator, clock=clock, session_lifetime=600.0, refresh_margin=60.0)
    channel = connect(emulator.grpc_target, tokens=tokens, tls=TlsSettings(enabled=False))
    fill(emulator, 10)
    consumer = StoringConsumer(Earliest(), commit_every=1)
    emulator.faults.cut_streams(5)
    with Subscription(
        channel,
        TOPIC,
        start=Earliest(),
        durable_position=consumer.durable_position,
        tokens=tokens,
        retry=FAST_RETRY,
        sleep=lambda s: None,
    ) as sub:
        for item in sub:
            consumer.handle(item)
            if len(consumer.stored) == 5:
                # past the server's expiry of the first token: the reconnect after the cut
                # is accepted only because the manager logs in again ahead of time
                clock.now += 610
            if len(consumer.stored) >= 10:
                break
    assert consumer.stored == [e.replay_id for e in emulator.log(TOPIC)]
    assert tokens.refreshes == 2
    assert not any("credentials rejected" in r.reason for r in consumer.resubscribed)
    channel.close()


def test_received_at_is_the_arrival_time_not_the_take_time(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    fill(emulator, 200)
    with Subscription(channel, TOPIC, start=Earliest(), num_requested=50) as sub:
        batches = []
        for item in sub:
            if isinstance(item, EventBatch):
                batches.append(item)
                if len(batches) == 1:
                    threading.Event().wait(0.3)  # the rest arrives while the consumer is busy
                if sum(len(b.events) for b in batches) >= 200:
                    break
    # later batches were received during the pause, long before they were taken
    assert batches[1].received_at - batches[0].received_at < 0.2
