"""Several topics at once, including the /data/ChangeEvents channel, through one loop."""

from __future__ import annotations

import threading

import grpc
import pytest

from ingest.client.managed import ManagedSubscription
from ingest.client.multi import MultiSubscription
from ingest.client.retry import RetryPolicy
from ingest.client.schemas import SchemaCache
from ingest.client.stream import EventBatch, Keepalive, Resubscribed
from ingest.client.subscriber import Subscription
from ingest.emulator.server import Emulator
from ingest.errors import PermanentError
from ingest.replay import After, Earliest, ReplayId, StartPosition
from tests.integration.client.conftest import (
    ACCOUNT,
    CHANNEL,
    CONTACT,
    MANAGED,
    fill,
    wait_answered,
)

pytestmark = pytest.mark.integration

FAST_RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.0, max_backoff=0.001)


class TopicStore:
    """Per-topic storage that commits every second batch, like bronze."""

    def __init__(self) -> None:
        self.stored: list[tuple[bytes, str, bytes]] = []
        self.pending: list[tuple[bytes, str, bytes]] = []
        self.position: StartPosition = Earliest()
        self.pending_position: StartPosition | None = None
        self.batches = 0

    def durable(self) -> StartPosition:
        return self.position

    def handle(self, item: object) -> None:
        if isinstance(item, Resubscribed):
            assert item.position == self.position
            self.pending.clear()
            self.pending_position = None
        elif isinstance(item, EventBatch):
            self.pending.extend((e.replay_id.value, e.schema_id, e.payload) for e in item.events)
            self.pending_position = After(item.latest_replay_id)
            self.batches += 1
            if self.batches % 2 == 0:
                self.commit()
        elif isinstance(item, Keepalive):
            self.commit()

    def commit(self) -> None:
        self.stored.extend(self.pending)
        self.pending.clear()
        if self.pending_position is not None:
            self.position = self.pending_position


def test_three_topics_with_cuts_land_exactly_their_logs(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    fill(emulator, 60, ACCOUNT)
    fill(emulator, 45, CONTACT)
    emulator.faults.cut_streams(17, repeat=True)
    stores = {t: TopicStore() for t in (ACCOUNT, CONTACT, CHANNEL)}
    subs = [
        Subscription(
            channel,
            topic,
            start=Earliest(),
            durable_position=store.durable,
            num_requested=10,
            retry=FAST_RETRY,
        )
        for topic, store in stores.items()
    ]
    expected = {ACCOUNT: 60, CONTACT: 45, CHANNEL: 105}
    resubscribed = 0
    with MultiSubscription(subs, items_per_topic=2) as multi:
        for item in multi:
            resubscribed += isinstance(item, Resubscribed)
            stores[item.topic].handle(item)
            for topic, store in stores.items():
                if len(store.stored) + len(store.pending) >= expected[topic]:
                    store.commit()
            if all(len(s.stored) >= expected[t] for t, s in stores.items()):
                break
    for topic in (ACCOUNT, CONTACT, CHANNEL):
        assert [r for r, _, _ in stores[topic].stored] == [e.replay_id for e in emulator.log(topic)]
    assert resubscribed >= 5
    # the channel carries both objects' events with the replay ids of their own topics
    channel_ids = {r for r, _, _ in stores[CHANNEL].stored}
    assert channel_ids == {r for r, _, _ in stores[ACCOUNT].stored + stores[CONTACT].stored}


def test_channel_events_decode_with_their_own_schema_ids(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    fill(emulator, 3, ACCOUNT)
    fill(emulator, 3, CONTACT)
    cache = SchemaCache(channel)
    assert cache.topic_info(CHANNEL).schema_id == ""
    decoders = cache.decoders()
    entities = []
    with Subscription(channel, CHANNEL, start=Earliest()) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                for e in item.events:
                    event = decoders.decoder(e.schema_id).decode_event(e.payload)
                    entities.append(event.entity)
            if len(entities) >= 6:
                break
    assert sorted(entities) == ["Account"] * 3 + ["Contact"] * 3
    assert cache.get_schema_calls == 2


def test_a_permanent_failure_on_one_topic_stops_the_loop(channel: grpc.Channel) -> None:
    subs = [
        Subscription(channel, ACCOUNT, start=Earliest(), retry=FAST_RETRY),
        Subscription(channel, "/data/NoSuchChangeEvent", retry=FAST_RETRY),
    ]
    multi = MultiSubscription(subs)
    with pytest.raises(PermanentError, match="NoSuchChangeEvent"):
        for _ in multi:
            pass
    assert all(s.closed for s in subs)


def test_duplicate_topics_are_refused(channel: grpc.Channel) -> None:
    with pytest.raises(ValueError, match="subscribed once"):
        MultiSubscription([Subscription(channel, ACCOUNT), Subscription(channel, ACCOUNT)])


def test_managed_and_plain_subscriptions_share_one_loop(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    orders = fill(emulator, 30)
    accounts = fill(emulator, 20, ACCOUNT)
    managed = ManagedSubscription(channel, developer_name=MANAGED, num_requested=10)
    plain = Subscription(channel, ACCOUNT, start=Earliest())
    got: dict[str, list[bytes]] = {managed.topic: [], ACCOUNT: []}
    with MultiSubscription([managed, plain]) as multi:
        for item in multi:
            if isinstance(item, EventBatch):
                got[item.topic].extend(e.replay_id.value for e in item.events)
                if item.topic == managed.topic:
                    managed.commit(item.latest_replay_id)
            if len(got[managed.topic]) >= 30 and len(got[ACCOUNT]) >= 20:
                # leaving the loop closes the streams: let the server answer the commits first
                wait_answered(managed)
                break
    assert got[managed.topic] == orders
    assert got[ACCOUNT] == accounts
    assert managed.last_committed == ReplayId(orders[-1])


def test_on_idle_runs_in_the_consuming_thread_and_can_end_the_loop(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    accounts = fill(emulator, 5, ACCOUNT)
    consumer = threading.get_ident()
    calls: list[int] = []
    got: list[bytes] = []

    def idle() -> bool:
        calls.append(threading.get_ident())
        # Once everything arrived and the stream went quiet, stop without another item.
        return len(got) == len(accounts)

    sub = Subscription(channel, ACCOUNT, start=Earliest())
    multi = MultiSubscription([sub], on_idle=idle, idle_interval=0.02)
    for item in multi:
        if isinstance(item, EventBatch):
            got.extend(e.replay_id.value for e in item.events)
    assert got == accounts
    assert calls and set(calls) == {consumer}
    assert sub.closed


def test_idle_interval_must_be_positive(channel: grpc.Channel) -> None:
    with pytest.raises(ValueError, match="idle_interval"):
        MultiSubscription([Subscription(channel, ACCOUNT)], idle_interval=0)
