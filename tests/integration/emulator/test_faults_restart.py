"""Fault injection over a socket (stream cuts, token expiry, latency, keepalive-only periods,
purges) and restarts with a persisted log."""

from __future__ import annotations

import time

import grpc
import pytest

from ingest.emulator.faults import Faults, FaultSettings, StreamCut
from ingest.emulator.managed import ManagedSubscriptionConfig
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.pubsub import pb2, pb2_grpc
from tests.emulator_helpers import (
    ACCOUNT_TOPIC,
    ORDER_TOPIC,
    StreamDriver,
    account_events,
    assert_sf_error,
    catalogue,
    fetch,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def subscribe(emulator):
    channel = emulator.channel()
    stub = pb2_grpc.PubSubStub(channel)
    md = emulator.issue_token().metadata()
    drivers: list[StreamDriver] = []

    def open_(*requests, method="Subscribe"):
        d = StreamDriver(getattr(stub, method), md)
        for r in requests:
            d.send(r)
        drivers.append(d)
        return d

    yield open_
    for d in drivers:
        d.close()
    channel.close()


def test_stream_cut_once_after_n_events(emulator, subscribe):
    ids = emulator.append(account_events(10))
    emulator.faults.cut_streams(4)
    s = subscribe(fetch(ACCOUNT_TOPIC, 10, pb2.EARLIEST))
    assert [e.replay_id for e in s.events(4)] == ids[:4]
    assert_sf_error(
        s.wait_end(),
        grpc.StatusCode.UNAVAILABLE,
        "service.unavailable",
        "The Pub/Sub API service is unavailable.",
    )
    # One-shot: the resubscription after the last delivered id runs through.
    again = subscribe(fetch(ACCOUNT_TOPIC, 10, pb2.CUSTOM, ids[3]))
    assert [e.replay_id for e in again.events(6)] == ids[4:]
    assert emulator.faults.stream_cut[1] is None


def test_stream_cut_every_n_events(emulator, subscribe):
    ids = emulator.append(account_events(7))
    emulator.faults.cut_streams(3, code="subscription.internal.error", repeat=True)
    got: list[bytes] = []
    start = fetch(ACCOUNT_TOPIC, 100, pb2.EARLIEST)
    for _ in range(3):
        s = subscribe(start)
        batch = [e.replay_id for e in s.events(min(3, len(ids) - len(got)))]
        got.extend(batch)
        if len(got) < len(ids):
            assert_sf_error(
                s.wait_end(), grpc.StatusCode.UNAVAILABLE, "subscription.internal.error"
            )
        start = fetch(ACCOUNT_TOPIC, 100, pb2.CUSTOM, got[-1])
    assert got == ids
    emulator.faults.clear_stream_cut()


def test_stream_cut_applies_to_managed_subscribe(make_emulator):
    sub = ManagedSubscriptionConfig("Cut_Me", ACCOUNT_TOPIC, default_replay="EARLIEST")
    faults = Faults(FaultSettings(stream_cut=StreamCut(2)))
    emulator = make_emulator(managed_subscriptions=(sub,), faults=faults)
    emulator.append(account_events(5))
    with emulator.channel() as channel:
        s = StreamDriver(
            pb2_grpc.PubSubStub(channel).ManagedSubscribe, emulator.issue_token().metadata()
        )
        s.send(pb2.ManagedFetchRequest(developer_name="Cut_Me", num_requested=10))
        assert len(s.events(2)) == 2
        assert_sf_error(s.wait_end(), grpc.StatusCode.UNAVAILABLE, "service.unavailable")
        s.close()


def test_expire_tokens_now(emulator):
    token = emulator.issue_token()
    request = pb2.TopicRequest(topic_name=ORDER_TOPIC)
    with emulator.channel() as channel:
        stub = pb2_grpc.PubSubStub(channel)
        assert stub.GetTopic(request, metadata=token.metadata()).can_publish
        emulator.faults.expire_tokens()
        with pytest.raises(grpc.RpcError) as info:
            stub.GetTopic(request, metadata=token.metadata())
        assert_sf_error(info.value, grpc.StatusCode.UNAUTHENTICATED, "service.auth.error")
        assert stub.GetTopic(request, metadata=emulator.issue_token().metadata()).can_publish


def test_latency_is_added_per_response(emulator, subscribe):
    token = emulator.issue_token()
    request = pb2.TopicRequest(topic_name=ORDER_TOPIC)
    emulator.faults.latency = 0.15
    with emulator.channel() as channel:
        stub = pb2_grpc.PubSubStub(channel)
        started = time.monotonic()
        stub.GetTopic(request, metadata=token.metadata())
        assert time.monotonic() - started >= 0.15
    emulator.append(account_events(2))
    s = subscribe(fetch(ACCOUNT_TOPIC, 1, pb2.EARLIEST))
    started = time.monotonic()
    s.events(1)
    s.send(fetch(n=1))
    s.events(1)
    assert time.monotonic() - started >= 0.3
    emulator.faults.latency = 0
    with pytest.raises(ValueError, match=">= 0"):
        emulator.faults.latency = -1


def test_keepalive_only_period(emulator, subscribe):
    ids = emulator.append(account_events(3))
    emulator.faults.keepalive_only = True
    s = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.EARLIEST))
    for _ in range(2):
        keepalive = s.next()
        assert list(keepalive.events) == [] and keepalive.pending_num_requested == 5
    emulator.faults.keepalive_only = False
    assert [e.replay_id for e in s.events(3)] == ids


def test_purge_through_a_replay_id_corrupts_stored_ids(emulator, subscribe):
    ids = emulator.append(account_events(5))
    assert emulator.faults.purge(through=ids[2]) == 3
    assert [e.replay_id for e in emulator.log(ACCOUNT_TOPIC)] == ids[3:]
    s = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.CUSTOM, ids[1]))
    assert_sf_error(
        s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "subscription.fetch.replayid.corrupted"
    )
    ok = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.CUSTOM, ids[3]))
    assert [e.replay_id for e in ok.events(1)] == ids[4:]


def test_purge_before_a_time(emulator, subscribe, clock):
    old = emulator.append(account_events(2))
    clock.advance(60)
    new = emulator.append(account_events(2, start=2))
    assert emulator.faults.purge(before=clock() - 30) == 2
    assert [e.replay_id for e in emulator.log(ACCOUNT_TOPIC)] == new
    s = subscribe(fetch(ACCOUNT_TOPIC, 5, pb2.CUSTOM, old[1]))
    assert_sf_error(
        s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "subscription.fetch.replayid.corrupted"
    )


def test_purge_needs_arguments_and_valid_ids(emulator):
    with pytest.raises(ValueError, match="before="):
        emulator.faults.purge()
    with pytest.raises(ValueError, match="10 bytes"):
        emulator.faults.purge(through=b"123")


def test_restart_with_persisted_log(tmp_path, clock):
    state = tmp_path / "state"
    sub = ManagedSubscriptionConfig("Persisted", ACCOUNT_TOPIC, default_replay="EARLIEST")
    config = EmulatorConfig(state_dir=state, managed_subscriptions=(sub,), keepalive_interval=0.25)
    first = Emulator(catalogue(), config, clock=clock).start()
    ids = first.append(account_events(4))
    token = first.issue_token()
    with first.channel() as channel:
        s = StreamDriver(pb2_grpc.PubSubStub(channel).ManagedSubscribe, token.metadata())
        s.send(pb2.ManagedFetchRequest(developer_name="Persisted", num_requested=2))
        assert len(s.events(2)) == 2
        s.send(
            pb2.ManagedFetchRequest(
                commit_replay_id_request=pb2.CommitReplayRequest(
                    commit_request_id="c", replay_id=ids[1]
                )
            )
        )
        assert not s.next().commit_response.HasField("error")
        s.close()
    before = [
        (e.replay_id, e.event_id, e.schema_id, e.payload, e.time) for e in first.log(ACCOUNT_TOPIC)
    ]
    first.close()

    second = Emulator(catalogue(), config, clock=clock).start()
    try:
        after = [
            (e.replay_id, e.event_id, e.schema_id, e.payload, e.time)
            for e in second.log(ACCOUNT_TOPIC)
        ]
        assert after == before
        more = second.append(account_events(1, start=4))
        assert more[0] > ids[-1]
        with second.channel() as channel:
            stub = pb2_grpc.PubSubStub(channel)
            # The access token survives the restart (the new process has a new port, so a new
            # instance URL).
            md = (
                ("accesstoken", token.access_token),
                ("instanceurl", second.instance_url),
                ("tenantid", second.org_id),
            )
            s = StreamDriver(stub.Subscribe, md).send(fetch(ACCOUNT_TOPIC, 10, pb2.CUSTOM, ids[0]))
            assert [e.replay_id for e in s.events(4)] == ids[1:] + more
            s.close()
            m = StreamDriver(stub.ManagedSubscribe, md)
            m.send(pb2.ManagedFetchRequest(developer_name="Persisted", num_requested=10))
            assert [e.replay_id for e in m.events(3)] == ids[2:] + more
            m.close()
    finally:
        second.close()


def test_restart_in_place_ends_streams_and_serves_again(make_emulator):
    emulator = make_emulator()
    ids = emulator.append(account_events(2))
    token = emulator.issue_token()
    port = emulator.grpc_port
    channel = emulator.channel()
    stub = pb2_grpc.PubSubStub(channel)
    s = StreamDriver(stub.Subscribe, token.metadata()).send(fetch(ACCOUNT_TOPIC, 5, pb2.EARLIEST))
    assert len(s.events(2)) == 2
    emulator.restart()
    assert emulator.grpc_port == port
    assert_sf_error(s.wait_end(), grpc.StatusCode.UNAVAILABLE, "service.unavailable")
    s.close()
    again = StreamDriver(stub.Subscribe, token.metadata()).send(
        fetch(ACCOUNT_TOPIC, 5, pb2.EARLIEST)
    )
    assert [e.replay_id for e in again.events(2)] == ids
    again.close()
    channel.close()
