"""Subscribe over a socket: replay presets, replay id validity, flow control, batching,
keepalives, idle close, the multi-entity channel and every Subscribe error."""

from __future__ import annotations

import itertools
import time

import grpc
import pytest

from ingest.emulator.eventlog import decode_replay_id, encode_replay_id
from ingest.pubsub import pb2
from tests.emulator_helpers import (
    ACCOUNT_TOPIC,
    CHANNEL,
    ORDER_TOPIC,
    WIDGET_TOPIC,
    StreamDriver,
    account_events,
    assert_sf_error,
    fetch,
    order_events,
    widget_events,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def subscribe(stub, md):
    drivers: list[StreamDriver] = []

    def open_(*requests, metadata=None):
        driver = StreamDriver(stub.Subscribe, metadata or md)
        for r in requests:
            driver.send(r)
        drivers.append(driver)
        return driver

    yield open_
    for d in drivers:
        d.close()


def test_latest_is_default_and_delivers_only_new_events(emulator, subscribe):
    emulator.append(account_events(3))
    s = subscribe(fetch(ACCOUNT_TOPIC, 10))
    first = s.next()  # nothing old: a keepalive comes first
    assert list(first.events) == []
    ids = emulator.append(account_events(2, start=3))
    events = s.events(2)
    assert [e.replay_id for e in events] == ids
    assert [e.event.id for e in events] == ["acct-3", "acct-4"]


def test_earliest_delivers_everything_retained_in_order(emulator, subscribe):
    ids = emulator.append(account_events(5))
    s = subscribe(fetch(ACCOUNT_TOPIC, 10, pb2.EARLIEST))
    response = s.next()
    assert [e.replay_id for e in response.events] == ids
    assert response.latest_replay_id == ids[-1]
    assert response.pending_num_requested == 5
    assert response.rpc_id
    logged = emulator.log(ACCOUNT_TOPIC)
    assert [e.event.payload for e in response.events] == [e.payload for e in logged]
    assert all(e.event.schema_id == logged[0].schema_id for e in response.events)


def test_custom_starts_strictly_after_the_replay_id(emulator, subscribe):
    ids = emulator.append(account_events(5))
    s = subscribe(fetch(ACCOUNT_TOPIC, 10, pb2.CUSTOM, ids[1]))
    assert [e.replay_id for e in s.next().events] == ids[2:]


def test_replay_ids_are_ten_bytes_increasing_with_gaps(emulator):
    ids = emulator.append(account_events(50))
    positions = [decode_replay_id(i) for i in ids]
    assert all(len(i) == 10 and i.endswith(b"\x00\x00") for i in ids)
    assert positions == sorted(positions) and len(set(positions)) == 50
    gaps = {b - a for a, b in itertools.pairwise(positions)}
    assert len(gaps) > 1, "positions should not be contiguous"


def test_the_eight_byte_form_of_a_replay_id_names_the_same_position(emulator, subscribe):
    # Clients that read a replay id as its big-endian counter store that number and send it
    # back as 8 bytes (the npm salesforce-pubsub-api-client does, against real orgs).
    ids = emulator.append(account_events(5))
    counter = int.from_bytes(ids[1][:8], "big")
    s = subscribe(fetch(ACCOUNT_TOPIC, 10, pb2.CUSTOM, counter.to_bytes(8, "big")))
    assert [e.replay_id for e in s.next().events] == ids[2:]


def test_the_eight_byte_form_beyond_the_current_position_is_corrupted(emulator, subscribe):
    ids = emulator.append(account_events(1))
    future = (int.from_bytes(ids[0][:8], "big") + 1000).to_bytes(8, "big")
    s = subscribe(fetch(ACCOUNT_TOPIC, 1, pb2.CUSTOM, future))
    assert_sf_error(
        s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "subscription.fetch.replayid.corrupted"
    )


def test_custom_without_replay_id_fails_validation(subscribe):
    s = subscribe(fetch(ACCOUNT_TOPIC, 1, pb2.CUSTOM))
    assert_sf_error(
        s.wait_end(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "subscription.fetch.replayid.validation.failed",
        "The Replay ID validation failed. Provide a Replay ID in the custom preset.",
    )


@pytest.mark.parametrize(
    "replay_id",
    [
        b"487259",  # decimal text sent as bytes: a classic client bug
        b"\x00" * 8,  # the 8-byte form of a position before anything retained
        b"\x00\x00\x00\x00\x00\x0f\x42\x40\x00\x01",  # trailing bytes not zero
    ],
)
def test_malformed_replay_id_is_corrupted(subscribe, replay_id):
    s = subscribe(fetch(ACCOUNT_TOPIC, 1, pb2.CUSTOM, replay_id))
    assert_sf_error(
        s.wait_end(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "subscription.fetch.replayid.corrupted",
        "The Replay ID validation failed. Ensure that the Replay ID is valid.",
    )


def test_replay_id_beyond_the_current_position_is_corrupted(emulator, subscribe):
    ids = emulator.append(account_events(1))
    future = encode_replay_id(decode_replay_id(ids[0]) + 1000)
    s = subscribe(fetch(ACCOUNT_TOPIC, 1, pb2.CUSTOM, future))
    assert_sf_error(
        s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "subscription.fetch.replayid.corrupted"
    )


def test_replay_id_older_than_retention_is_corrupted(emulator, subscribe, clock):
    old = emulator.append(account_events(2))
    clock.advance(72 * 3600 + 1)
    fresh = emulator.append(account_events(1, start=2))
    assert [e.replay_id for e in emulator.log(ACCOUNT_TOPIC)] == fresh
    md = emulator.issue_token().metadata()  # the first token expired meanwhile
    s = subscribe(fetch(ACCOUNT_TOPIC, 1, pb2.CUSTOM, old[0]), metadata=md)
    assert_sf_error(
        s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "subscription.fetch.replayid.corrupted"
    )
    earliest = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.EARLIEST), metadata=md)
    assert [e.replay_id for e in earliest.next().events] == fresh


def test_another_topics_position_is_a_valid_start(emulator, subscribe):
    # Replay ids are positions on the org's shared bus, valid on every topic.
    widget = emulator.append(widget_events(1))
    account = emulator.append(account_events(2))
    s = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.CUSTOM, widget[0]))
    assert [e.replay_id for e in s.next().events] == account


def test_flow_control_pending_accumulates_and_caps_at_100(emulator, subscribe):
    s = subscribe(fetch(ACCOUNT_TOPIC, 30))
    keepalive = s.next()
    assert keepalive.pending_num_requested == 30
    s.send(fetch(n=50))
    assert s.next().pending_num_requested == 80
    assert emulator.peak_requested == 80
    s.send(fetch(n=500))  # over-asking counts as the cap
    assert s.next().pending_num_requested == 100
    assert emulator.peak_requested == 580  # what the client asked for, for tests to check
    emulator.append(account_events(130))
    got = s.events(100)
    assert len(got) == 100
    s.assert_quiet(0.6)  # pending is 0: nothing more arrives, not even keepalives
    s.send(fetch(n=10))
    response = s.next()
    assert len(response.events) == 10 and response.pending_num_requested == 0


def test_partial_batches_then_pushed_as_events_arrive(emulator, subscribe):
    ids = emulator.append(account_events(3))
    s = subscribe(fetch(ACCOUNT_TOPIC, 10, pb2.CUSTOM, ids[0]))
    first = s.next()
    assert len(first.events) == 2 and first.pending_num_requested == 8
    more = emulator.append(account_events(3, start=3))
    pushed = s.next()
    assert [e.replay_id for e in pushed.events] == more
    assert pushed.pending_num_requested == 5
    assert pushed.latest_replay_id == more[-1]


def test_responses_are_split_to_stay_under_3_mb(make_emulator):
    emulator = make_emulator()
    big = [
        e.__class__(e.topic, e.schema_id, e.payload + b"\x00" * 900_000, e.event_id)
        for e in account_events(8)
    ]
    ids = emulator.append(big)
    channel = emulator.channel()
    from ingest.pubsub import pb2_grpc

    s = StreamDriver(pb2_grpc.PubSubStub(channel).Subscribe, emulator.issue_token().metadata())
    s.send(fetch(ACCOUNT_TOPIC, 8, pb2.EARLIEST))
    sizes, counts, got = [], [], []
    while len(got) < 8:
        r = s.next()
        sizes.append(r.ByteSize())
        counts.append(len(r.events))
        got.extend(e.replay_id for e in r.events)
    s.close()
    channel.close()
    assert got == ids
    assert counts == [3, 3, 2]
    assert max(sizes) <= 3 * 1024 * 1024


def test_keepalive_reports_an_advanced_position(emulator, subscribe):
    ids = emulator.append(account_events(1))
    s = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.CUSTOM, ids[0]))
    started = time.monotonic()
    first, second = s.next(), s.next()
    assert time.monotonic() - started >= 0.2
    for keepalive in (first, second):
        assert list(keepalive.events) == []
        assert keepalive.pending_num_requested == 5
        assert keepalive.rpc_id
    assert decode_replay_id(first.latest_replay_id) > decode_replay_id(ids[0])
    assert decode_replay_id(second.latest_replay_id) > decode_replay_id(first.latest_replay_id)
    # A keepalive position is a valid CUSTOM start, and later events follow it.
    later = emulator.append(account_events(1, start=1))
    resumed = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.CUSTOM, second.latest_replay_id))
    assert [e.replay_id for e in resumed.events(1)] == later


def test_idle_stream_is_closed_after_idle_timeout(make_emulator):
    emulator = make_emulator(idle_timeout=0.4)
    emulator.append(account_events(1))
    channel = emulator.channel()
    from ingest.pubsub import pb2_grpc

    s = StreamDriver(pb2_grpc.PubSubStub(channel).Subscribe, emulator.issue_token().metadata())
    s.send(fetch(ACCOUNT_TOPIC, 1, pb2.EARLIEST))
    last = s.next()
    assert last.pending_num_requested == 0
    started = time.monotonic()
    assert s.wait_end(timeout=3) is None  # a clean end of stream
    assert time.monotonic() - started >= 0.3
    s.close()
    channel.close()


def test_a_fetch_request_before_the_idle_timeout_keeps_the_stream(make_emulator):
    emulator = make_emulator(idle_timeout=0.6, keepalive_interval=5)
    emulator.append(account_events(3))
    channel = emulator.channel()
    from ingest.pubsub import pb2_grpc

    s = StreamDriver(pb2_grpc.PubSubStub(channel).Subscribe, emulator.issue_token().metadata())
    s.send(fetch(ACCOUNT_TOPIC, 1, pb2.EARLIEST))
    for _ in range(2):
        assert len(s.next().events) == 1
        time.sleep(0.3)
        s.send(fetch(n=1))
    assert len(s.next().events) == 1
    assert not s.finished
    s.close()
    channel.close()


def test_num_requested_must_be_positive(subscribe):
    s = subscribe(fetch(ACCOUNT_TOPIC, 0))
    assert_sf_error(
        s.wait_end(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "subscription.fetch.requested.events.invalid",
        "The requested number of events in a fetch request must be greater than zero.",
    )


def test_later_request_with_non_positive_count_fails(subscribe):
    s = subscribe(fetch(ACCOUNT_TOPIC, 1))
    s.next()
    s.send(fetch(n=-3))
    assert_sf_error(
        s.wait_end(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "subscription.fetch.requested.events.invalid",
    )


def test_topic_mismatch_on_a_later_request(subscribe):
    s = subscribe(fetch(ACCOUNT_TOPIC, 1))
    s.next()
    s.send(fetch(WIDGET_TOPIC, 1))
    err = assert_sf_error(
        s.wait_end(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "subscription.fetch.topic.mismatch",
        "There is a mismatch of topic names between requests.",
    )
    assert WIDGET_TOPIC in err.details


def test_later_replay_options_are_ignored(emulator, subscribe):
    ids = emulator.append(account_events(4))
    s = subscribe(fetch(ACCOUNT_TOPIC, 1, pb2.CUSTOM, ids[1]))
    assert [e.replay_id for e in s.next().events] == [ids[2]]
    s.send(fetch(ACCOUNT_TOPIC, 1, pb2.EARLIEST))
    assert [e.replay_id for e in s.next().events] == [ids[3]]


@pytest.mark.parametrize(
    ("topic", "status", "code"),
    [
        ("/data/NoSuchChangeEvent", grpc.StatusCode.NOT_FOUND, "topic.not.found"),
        ("/data/accountchangeevent", grpc.StatusCode.NOT_FOUND, "topic.not.found"),
        ("", grpc.StatusCode.INVALID_ARGUMENT, "topic.validation.empty"),
    ],
)
def test_subscribe_to_unknown_or_blank_topic(subscribe, topic, status, code):
    s = subscribe(fetch(topic, 1))
    assert_sf_error(s.wait_end(), status, code)


def test_change_events_channel_carries_every_object_with_same_replay_ids(emulator, subscribe):
    account = emulator.append(account_events(2))
    widget = emulator.append(widget_events(2))
    emulator.append(order_events(1))  # platform events are not change events
    s = subscribe(fetch(CHANNEL, 10, pb2.EARLIEST))
    events = s.next().events
    assert [e.replay_id for e in events] == account + widget
    assert {e.event.schema_id for e in events} == {
        emulator.log(ACCOUNT_TOPIC)[0].schema_id,
        emulator.log(WIDGET_TOPIC)[0].schema_id,
    }
    assert [e.replay_id for e in emulator.log(CHANNEL)] == account + widget


def test_platform_event_topic_subscribes_too(emulator, subscribe):
    ids = emulator.append(order_events(2))
    s = subscribe(fetch(ORDER_TOPIC, 2, pb2.EARLIEST))
    assert [e.replay_id for e in s.events(2)] == ids


def test_message_encoding_serves_identical_responses(make_emulator):
    from ingest.pubsub import pb2_grpc

    results = []
    for encoding in ("prebuilt", "message"):
        emulator = make_emulator(response_encoding=encoding)
        emulator.append(account_events(5))
        channel = emulator.channel()
        s = StreamDriver(pb2_grpc.PubSubStub(channel).Subscribe, emulator.issue_token().metadata())
        s.send(fetch(ACCOUNT_TOPIC, 7, pb2.EARLIEST))
        r = s.next()
        results.append(
            (
                [(e.event.id, e.event.schema_id, e.event.payload, e.replay_id) for e in r.events],
                r.latest_replay_id,
                r.pending_num_requested,
            )
        )
        s.close()
        channel.close()
    assert results[0] == results[1]
