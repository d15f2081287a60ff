"""ManagedSubscribe over a socket: identification, start positions, commits, exclusivity,
keepalives and the no-commit timeout."""

from __future__ import annotations

import time

import grpc
import pytest

from ingest.emulator.eventlog import decode_replay_id, encode_replay_id
from ingest.emulator.managed import ManagedSubscriptionConfig
from ingest.pubsub import pb2, pb2_grpc
from tests.emulator_helpers import (
    ACCOUNT_TOPIC,
    StreamDriver,
    account_events,
    assert_sf_error,
)

pytestmark = pytest.mark.integration

SUBS = (
    ManagedSubscriptionConfig("Account_Sync", ACCOUNT_TOPIC, default_replay="EARLIEST"),
    ManagedSubscriptionConfig(
        "Account_Latest", ACCOUNT_TOPIC, default_replay="LATEST", error_recovery_replay="EARLIEST"
    ),
    ManagedSubscriptionConfig("Account_Stopped", ACCOUNT_TOPIC, state="STOP"),
)


@pytest.fixture
def emulator(make_emulator):
    return make_emulator(managed_subscriptions=SUBS)


@pytest.fixture
def managed(emulator):
    channel = emulator.channel()
    stub = pb2_grpc.PubSubStub(channel)
    md = emulator.issue_token().metadata()
    drivers: list[StreamDriver] = []

    def open_(name="", n=0, sub_id="", commit=None):
        d = StreamDriver(stub.ManagedSubscribe, md)
        request = pb2.ManagedFetchRequest(
            developer_name=name, subscription_id=sub_id, num_requested=n
        )
        if commit is not None:
            request.commit_replay_id_request.CopyFrom(commit)
        d.send(request)
        drivers.append(d)
        return d

    yield open_
    for d in drivers:
        d.close()
    channel.close()


def commit(replay_id: bytes, request_id: str = "c1") -> pb2.ManagedFetchRequest:
    return pb2.ManagedFetchRequest(
        commit_replay_id_request=pb2.CommitReplayRequest(
            commit_request_id=request_id, replay_id=replay_id
        )
    )


def test_default_replay_earliest_then_resume_after_commit(emulator, managed, clock):
    ids = emulator.append(account_events(5))
    s = managed("Account_Sync", 3)
    first = s.next()
    assert [e.replay_id for e in first.events] == ids[:3]
    s.send(commit(ids[1], "commit-1"))
    answer = s.next()
    assert answer.commit_response.commit_request_id == "commit-1"
    assert answer.commit_response.replay_id == ids[1]
    assert answer.commit_response.process_time == int(clock() * 1000)
    assert not answer.commit_response.HasField("error")
    assert list(answer.events) == [] and answer.rpc_id == first.rpc_id
    s.close()
    resumed = managed("Account_Sync", 10)
    assert [e.replay_id for e in resumed.next().events] == ids[2:]


def test_by_subscription_id_15_or_18(emulator, managed):
    ids = emulator.append(account_events(2))
    sub_id = SUBS[0].subscription_id
    assert sub_id.startswith("18x") and len(sub_id) == 18
    s = managed(sub_id=sub_id, n=5)
    assert [e.replay_id for e in s.next().events] == ids
    s.close()
    s15 = managed(sub_id=sub_id[:15], n=5, name="Account_Sync")
    assert [e.replay_id for e in s15.next().events] == ids


def test_default_replay_latest(emulator, managed):
    emulator.append(account_events(2))
    s = managed("Account_Latest", 5)
    assert list(s.next().events) == []  # keepalive: nothing old
    later = emulator.append(account_events(1, start=2))
    assert [e.replay_id for e in s.events(1)] == later


def test_expired_commit_uses_error_recovery_replay(emulator, managed):
    ids = emulator.append(account_events(4))
    emulator.managed.commit(SUBS[1].subscription_id, ids[0])
    emulator.faults.purge(through=ids[1])  # the committed id is gone
    s = managed("Account_Latest", 5)
    assert [e.replay_id for e in s.next().events] == ids[2:]  # errorRecoveryReplay EARLIEST


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "managed.subscription.id.or.developer.name.empty"),
        (
            {"name": "Nope"},
            grpc.StatusCode.NOT_FOUND,
            "managed.subscription.developer.name.not.found",
        ),
        (
            {"sub_id": "18x000000000000AAA"},
            grpc.StatusCode.NOT_FOUND,
            "managed.subscription.subscription.id.not.found",
        ),
        (
            {"sub_id": "18x12"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "managed.subscription.subscription.id.invalid",
        ),
        (
            {"name": "Account_Stopped"},
            grpc.StatusCode.FAILED_PRECONDITION,
            "managed.subscription.config.stopped",
        ),
        (
            {"name": "Account_Sync", "commit": pb2.CommitReplayRequest(commit_request_id="x")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "managed.subscription.fetch.request.commit.request.restricted",
        ),
        (
            {"name": "Account_Sync", "n": -1},
            grpc.StatusCode.INVALID_ARGUMENT,
            "managed.subscription.fetch.request.events.invalid",
        ),
    ],
)
def test_first_request_errors(managed, kwargs, status, code):
    s = managed(**kwargs)
    assert_sf_error(s.wait_end(), status, code)


def test_stopping_at_run_time(emulator, managed):
    emulator.managed.set_state("Account_Sync", "STOP")
    assert_sf_error(
        managed("Account_Sync", 1).wait_end(),
        grpc.StatusCode.FAILED_PRECONDITION,
        "managed.subscription.config.stopped",
    )


def test_one_active_client_per_subscription(emulator, managed):
    first = managed("Account_Sync", 1)
    first.next()
    second = managed("Account_Sync", 1)
    assert_sf_error(
        second.wait_end(), grpc.StatusCode.ALREADY_EXISTS, "managed.subscription.already.active"
    )
    other = managed("Account_Latest", 1)  # another subscription is independent
    other.next()
    first.close()
    deadline = time.monotonic() + 30
    while emulator.managed.is_active(SUBS[0].subscription_id) and time.monotonic() < deadline:
        time.sleep(0.02)
    third = managed("Account_Sync", 1)
    assert third.next().rpc_id


def test_commit_failures_keep_the_stream_open(emulator, managed):
    ids = emulator.append(account_events(4))
    s = managed("Account_Sync", 2)
    assert [e.replay_id for e in s.next().events] == ids[:2]

    def commit_error(replay_id: bytes, request_id: str) -> str:
        s.send(commit(replay_id, request_id))
        answer = s.next().commit_response
        assert answer.commit_request_id == request_id and answer.replay_id == replay_id
        assert answer.error.code == pb2.COMMIT, answer
        return answer.error.msg

    assert "hasn't been delivered" in commit_error(ids[3], "not-yet")
    assert "malformed" in commit_error(b"123", "bad")
    assert "no replay ID" in commit_error(b"", "empty")
    unknown = encode_replay_id(decode_replay_id(ids[1]) - 1)
    assert unknown not in ids  # the seeded bus leaves gaps between positions
    assert "unknown" in commit_error(unknown, "unknown")
    s.send(commit(ids[1], "ok"))
    assert not s.next().commit_response.HasField("error")
    assert "older than the committed" in commit_error(ids[0], "older")
    s.send(commit(ids[1], "same-again"))
    assert not s.next().commit_response.HasField("error")
    s.send(pb2.ManagedFetchRequest(num_requested=2))
    assert [e.replay_id for e in s.events(2)] == ids[2:]
    assert emulator.managed.committed(SUBS[0].subscription_id) == ids[1]


def test_a_commit_in_the_eight_byte_form_is_the_same_position(emulator, managed):
    ids = emulator.append(account_events(4))
    s = managed("Account_Sync", 2)
    assert [e.replay_id for e in s.next().events] == ids[:2]
    s.send(commit(ids[1][:8], "short"))
    answer = s.next().commit_response
    assert answer.commit_request_id == "short" and not answer.HasField("error"), answer
    s.close()
    # Stored as the replay id the emulator issues, so a new stream resumes right after it.
    assert emulator.managed.committed(SUBS[0].subscription_id) == ids[1]
    again = managed("Account_Sync", 2)
    assert [e.replay_id for e in again.next().events] == ids[2:]


def test_committing_a_keepalive_position(emulator, managed):
    s = managed("Account_Latest", 5)
    keepalive = s.next()
    assert list(keepalive.events) == [] and keepalive.latest_replay_id
    s.send(commit(keepalive.latest_replay_id, "ka"))
    answer = s.next().commit_response
    assert answer.commit_request_id == "ka" and not answer.HasField("error")
    s.close()
    later = emulator.append(account_events(1))
    resumed = managed("Account_Latest", 5)
    assert [e.replay_id for e in resumed.events(1)] == later


def test_later_request_needs_events_or_a_commit(managed):
    s = managed("Account_Sync", 1)
    s.next()
    s.send(pb2.ManagedFetchRequest(num_requested=0))
    assert_sf_error(
        s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "managed.subscription.fetch.request.invalid"
    )


def test_flow_control_and_keepalive_like_subscribe(emulator, managed):
    s = managed("Account_Latest", 150)
    keepalive = s.next()
    assert keepalive.pending_num_requested == 100 and list(keepalive.events) == []
    ids = emulator.append(account_events(3))
    response = s.next()
    assert [e.replay_id for e in response.events] == ids
    assert response.pending_num_requested == 97 and response.latest_replay_id == ids[-1]


def test_no_commit_timeout_closes_with_deadline_exceeded(make_emulator):
    emulator = make_emulator(managed_subscriptions=SUBS, no_commit_timeout=0.5)
    channel = emulator.channel()
    s = StreamDriver(
        pb2_grpc.PubSubStub(channel).ManagedSubscribe, emulator.issue_token().metadata()
    )
    s.send(pb2.ManagedFetchRequest(developer_name="Account_Latest", num_requested=1))
    started = time.monotonic()
    err = assert_sf_error(
        s.wait_end(),
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "managed.subscription.commit.timeout",
        "No CommitReplayRequests sent in the last 0.5 seconds. Closing managed subscription.",
    )
    assert err.details
    assert time.monotonic() - started >= 0.4
    s.close()
    channel.close()
    assert not emulator.managed.is_active(SUBS[1].subscription_id)
