"""The source's reads without Spark, against the emulator over a socket: every micro-batch the
warm subscription hands out is found again, event for event, by a re-read between its offsets
(what Spark asks for after a crash), also for a query that started at ``latest``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pipelines.connect import Source, connect, secret_resolver
from pipelines.spark_source.bounded import read_between
from pipelines.spark_source.feed import Events, Feed
from pipelines.spark_source.offsets import BatchOffset, TopicOffset
from pipelines.spark_source.options import parse_options
from tests.spark_source.conftest import ACCOUNT, ORDERS, Org

pytestmark = [pytest.mark.integration, pytest.mark.spark_source]


@pytest.fixture
def source(org: Org) -> Iterator[Source]:
    options = parse_options(org.options(), streaming=True)
    with connect(options.connection, secrets=secret_resolver()) as opened:
        yield opened


def take_all(
    feed: Feed, offsets: dict[str, TopicOffset], want: int, per_batch: int
) -> list[tuple[dict[str, TopicOffset], dict[str, TopicOffset], dict[str, Events]]]:
    """Micro-batches of at most ``per_batch`` events until ``want`` events were taken."""
    batches = []
    got = 0
    deadline = time.monotonic() + 30
    while got < want and time.monotonic() < deadline:
        taken, ends = feed.take(offsets, per_batch, 0.5)
        got += sum(len(e) for e in taken.values())
        # Offsets travel through Spark's checkpoint as JSON.
        ends = dict(BatchOffset.from_json(BatchOffset(ends).to_json()).topics)
        if any(e.count for e in ends.values()):
            batches.append((offsets, ends, taken))
        offsets = ends
    assert got == want
    return batches


def test_every_micro_batch_is_read_again_exactly(org: Org, source: Source) -> None:
    org.publish(300)
    want = len(org.replay_ids(ACCOUNT)) + len(org.replay_ids(ORDERS))
    start = {t: TopicOffset(start="earliest") for t in (ACCOUNT, ORDERS)}
    feed = Feed(source, start, on_corrupted="fail")
    try:
        batches = take_all(feed, start, want, per_batch=37)
    finally:
        feed.close()
    assert len(batches) >= 3
    for first, last, taken in batches:
        for topic, end in last.items():
            again = read_between(source, topic, first[topic], end, on_corrupted="fail")
            events = taken.get(topic, Events())
            assert again.replay_ids == events.replay_ids
            assert again.event_ids == events.event_ids
            assert again.payloads == events.payloads


def test_a_query_that_started_at_latest_reads_its_first_batch_again(
    org: Org, source: Source
) -> None:
    org.publish(100)  # before the query: not part of it
    start = {ACCOUNT: TopicOffset(start="latest")}
    feed = Feed(source, start, on_corrupted="fail")
    try:
        # Publish as soon as the stream is open at the tip, so events come before its first
        # keepalive (0.5 s later), which would give the query a position to start from. The
        # events are made beforehand: making them is most of publishing's time, which a loaded
        # machine stretches toward those 0.5 s.
        events = list(org.workload.events(200))
        deadline = time.monotonic() + 60
        while org.emulator.peak_requested == 0:
            assert time.monotonic() < deadline, "the feed did not open its stream"
            time.sleep(0.01)
        before = len(org.replay_ids(ACCOUNT))
        org.emulator.append(events)
        want = len(org.replay_ids(ACCOUNT)) - before
        batches = take_all(feed, start, want, per_batch=10_000)
    finally:
        feed.close()
    first, last, taken = batches[0]
    assert first[ACCOUNT].after is None, "the first micro-batch began at latest"
    assert last[ACCOUNT].first is not None
    assert taken[ACCOUNT].replay_ids[0] == org.replay_ids(ACCOUNT)[before]
    again = read_between(source, ACCOUNT, first[ACCOUNT], last[ACCOUNT], on_corrupted="fail")
    assert again.replay_ids == taken[ACCOUNT].replay_ids


def test_planning_a_micro_batch_on_a_quiet_topic_returns_soon_and_keepalives_advance_it(
    org: Org,
) -> None:
    from pipelines.spark_source.source import _StreamReader

    org.publish(50)
    options = parse_options(
        org.options(startingReplay="latest", maxWaitSeconds="0.3"), streaming=True
    )
    reader = _StreamReader(options, None)
    try:
        start = reader.initialOffset()
        waits = []
        offset = start
        for _ in range(8):
            began = time.monotonic()
            rows, offset = reader.read(offset)
            waits.append(time.monotonic() - began)
            assert list(rows) == []
            if offset != start:
                break
    finally:
        reader.close()
    # Each call waits about maxWaitSeconds (the first also opens the subscription).
    assert max(waits[1:]) < 1.5
    # A keepalive (every 0.5 s here) gave the quiet topic a position: an empty micro-batch
    # that moves the checkpoint.
    moved = BatchOffset.from_json(offset).topics[ACCOUNT]
    assert moved.after is not None and moved.count == 0
