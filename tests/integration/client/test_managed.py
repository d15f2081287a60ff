"""ManagedSubscribe against the emulator: commits, resume after commit, refused commits."""

from __future__ import annotations

import grpc
import pytest

from ingest.client.managed import ManagedSubscription
from ingest.client.retry import RetryPolicy
from ingest.client.stream import CommitFailed, EventBatch, Keepalive, Resubscribed
from ingest.emulator.server import Emulator
from ingest.errors import PermanentError
from ingest.replay import After, ReplayId
from tests.integration.client.conftest import MANAGED, fill, wait_answered

pytestmark = pytest.mark.integration

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.0)


def test_resume_after_commit(emulator: Emulator, channel: grpc.Channel) -> None:
    log = fill(emulator, 30)
    stored: list[bytes] = []
    with ManagedSubscription(channel, developer_name=MANAGED, num_requested=10) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                stored.extend(e.replay_id.value for e in item.events)
                if len(stored) >= 20:
                    # stored durably: now commit (leaving the loop would end the stream)
                    sub.commit(item.latest_replay_id)
                    wait_answered(sub)
                    break
        assert sub.last_committed == ReplayId(stored[-1])
    assert stored == log[:20]

    again: list[bytes] = []
    with ManagedSubscription(channel, developer_name=MANAGED, num_requested=10) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                again.extend(e.replay_id.value for e in item.events)
                if len(again) >= 10:
                    break
    assert again == log[20:30]


def test_refused_commit_is_yielded_not_ignored(emulator: Emulator, channel: grpc.Channel) -> None:
    fill(emulator, 20)
    failed: list[CommitFailed] = []
    batches: list[EventBatch] = []
    with ManagedSubscription(channel, developer_name=MANAGED, num_requested=10) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                batches.append(item)
                if len(batches) == 2:
                    sub.commit(batches[1].latest_replay_id)
                    wait_answered(sub)
                    # older than the committed position: the server refuses it
                    sub.commit(batches[0].latest_replay_id)
            elif isinstance(item, CommitFailed):
                failed.append(item)
                break
            elif isinstance(item, Keepalive):
                continue
    assert len(failed) == 1
    assert failed[0].replay_id == batches[0].latest_replay_id
    assert "older" in failed[0].error
    assert sub.last_committed == batches[1].latest_replay_id


def test_keepalive_ids_can_be_committed(emulator: Emulator, channel: grpc.Channel) -> None:
    with ManagedSubscription(channel, developer_name=MANAGED) as sub:
        for item in sub:
            assert isinstance(item, Keepalive)
            sub.commit(item.latest_replay_id)
            wait_answered(sub)
            assert sub.last_committed == item.latest_replay_id
            break


def test_reconnects_after_a_cut_and_the_server_resumes_after_the_commit(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    log = fill(emulator, 40)
    emulator.faults.cut_streams(15)
    stored: dict[bytes, int] = {}  # an idempotent store: replay id -> times written
    pending: list[bytes] = []
    resubscribed: list[Resubscribed] = []
    first_after_resubscribe: list[bytes] = []
    abandoned: list[CommitFailed] = []
    with ManagedSubscription(
        channel, developer_name=MANAGED, num_requested=10, retry=FAST_RETRY, sleep=lambda s: None
    ) as sub:
        for item in sub:
            if isinstance(item, Resubscribed):
                resubscribed.append(item)
                pending.clear()  # not stored: the server delivers these again
            elif isinstance(item, CommitFailed):
                # the cut can beat the commit's answer: it is reported, never dropped
                abandoned.append(item)
            elif isinstance(item, EventBatch):
                if len(first_after_resubscribe) < len(resubscribed):
                    first_after_resubscribe.append(item.events[0].replay_id.value)
                pending.extend(e.replay_id.value for e in item.events)
                if len(pending) >= 10:
                    for rid in pending:
                        stored[rid] = stored.get(rid, 0) + 1
                    pending.clear()
                    sub.commit(item.latest_replay_id)
                if set(stored) >= set(log):
                    break
    assert set(stored) == set(log)
    assert len(resubscribed) == 1
    position = resubscribed[0].position
    committed = log[: log.index(position.replay_id.value) + 1] if position else []
    assert isinstance(position, After) or position is None
    # the new stream starts right after what the server acknowledged as committed, or, when
    # the cut beat a commit's answer (reported as abandoned), right after that commit if the
    # server had applied it
    starts = {log[len(committed)]}
    after_abandoned = [log.index(a.replay_id.value) + 1 for a in abandoned]
    starts |= {log[i] for i in after_abandoned if i < len(log)}
    assert first_after_resubscribe[0] in starts
    # only events whose commit was abandoned by the cut are written twice
    assert all(n == 1 for n in stored.values()) or abandoned
    assert all("stream ended" in a.error for a in abandoned)


def test_unknown_managed_subscription_is_permanent(channel: grpc.Channel) -> None:
    with (
        pytest.raises(PermanentError, match=r"developer\.name\.not\.found"),
        ManagedSubscription(
            channel, developer_name="No_Such_Subscription", retry=FAST_RETRY
        ) as sub,
    ):
        next(iter(sub))


def test_commit_needs_an_iteration(channel: grpc.Channel) -> None:
    sub = ManagedSubscription(channel, subscription_id="18x000000000001AAA")
    with pytest.raises(RuntimeError, match="before iterating"):
        sub.commit(ReplayId(b"\x01"))
    with pytest.raises(ValueError, match="exactly one of"):
        ManagedSubscription(channel, developer_name="A", subscription_id="18x")


def test_by_subscription_id(emulator: Emulator, channel: grpc.Channel) -> None:
    log = fill(emulator, 5)
    sub_id = emulator.config.managed_subscriptions[0].subscription_id
    assert sub_id.startswith("18x")
    got: list[bytes] = []
    with ManagedSubscription(channel, subscription_id=sub_id) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got.extend(e.replay_id.value for e in item.events)
            if len(got) >= 5:
                break
    assert got == log
    assert sub.topic == f"managed:{sub_id}"


def test_a_commit_made_while_reconnecting_is_reported(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    fill(emulator, 10)
    emulator.faults.cut_streams(10)
    failed: list[CommitFailed] = []
    last = None
    with ManagedSubscription(
        channel, developer_name=MANAGED, retry=FAST_RETRY, sleep=lambda s: None
    ) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                last = item.latest_replay_id
            elif isinstance(item, Resubscribed):
                assert last is not None
                sub.commit(last)  # no stream is open right now
            elif isinstance(item, CommitFailed):
                failed.append(item)
                break
    assert len(failed) == 1
    assert "no stream was open" in failed[0].error
    assert failed[0].replay_id == last
