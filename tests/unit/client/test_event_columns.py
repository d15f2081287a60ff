"""Event batches held as columns: the per-event view and the column view agree, whichever the
batch was built from, and a response's wire size is counted without re-measuring it (as
gRPC parses it, so the next request goes out at once)."""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Iterator

import pytest

from ingest.client import EventBatch, EventColumns, ReceivedEvent
from ingest.client.stream import FlowWindow, _SizedParser, _Stream
from ingest.client.subscriber import _convert_fetch
from ingest.errors import PermanentError
from ingest.pubsub import pb2
from ingest.replay import ReplayId

TOPIC = "/event/Order__e"


def _events() -> tuple[ReceivedEvent, ...]:
    return (
        ReceivedEvent(ReplayId(b"\x00\x01"), "e1", "s1", b"first"),
        ReceivedEvent(ReplayId(b"\x00\x02"), "e2", "s1", b""),
        ReceivedEvent(ReplayId(b"\x00\x03"), "e3", "s2", b"\xff" * 3),
    )


def _columns() -> EventColumns:
    return EventColumns(
        (b"\x00\x01", b"\x00\x02", b"\x00\x03"),
        ("e1", "e2", "e3"),
        ("s1", "s1", "s2"),
        (b"first", b"", b"\xff" * 3),
    )


def _response(*replay_ids: bytes, latest: bytes = b"") -> pb2.FetchResponse:
    response = pb2.FetchResponse(latest_replay_id=latest, rpc_id="rpc-1", pending_num_requested=7)
    for i, rid in enumerate(replay_ids):
        event = response.events.add()
        event.replay_id = rid
        event.event.id = f"e{i + 1}"
        event.event.schema_id = "s1"
        event.event.payload = bytes([i]) * (i + 1)
    return response


def test_columns_and_events_describe_the_same_events() -> None:
    assert _columns().events() == _events()
    assert EventColumns.of(_events()) == _columns()
    assert len(_columns()) == 3


def test_columns_of_different_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"one length \(got replay_ids 2, event_ids 1"):
        EventColumns((b"\x01", b"\x02"), ("e1",), ("s1", "s1"), (b"", b""))


def test_a_batch_built_from_columns_equals_one_built_from_events() -> None:
    latest = ReplayId(b"\x00\x03")
    by_events = EventBatch(TOPIC, _events(), latest, "rpc", 12.5, 4)
    by_columns = EventBatch.of_columns(
        TOPIC,
        _columns(),
        latest_replay_id=latest,
        rpc_id="rpc",
        received_at=12.5,
        pending_num_requested=4,
    )
    assert by_columns == by_events
    assert hash(by_columns) == hash(by_events)
    assert by_columns.events == _events()
    assert by_events.columns == _columns()
    assert len(by_columns) == len(by_events) == 3
    assert by_columns != EventBatch(TOPIC, _events()[:2], latest, "rpc", 12.5, 4)
    # The derived view is built once and kept.
    assert by_columns.events is by_columns.events


def test_a_batch_is_immutable_and_keeps_its_dataclass_shape() -> None:
    batch = EventBatch(TOPIC, _events(), ReplayId(b"\x00\x03"), "rpc", 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.topic = "/event/Other__e"  # type: ignore[misc]
    assert batch.pending_num_requested == 0
    match batch:
        case EventBatch(topic, events, latest):
            assert (topic, len(events), latest) == (TOPIC, 3, ReplayId(b"\x00\x03"))
    assert pickle.loads(pickle.dumps(batch)) == batch
    assert "payload" not in repr(batch) and "first" not in repr(batch)
    assert "<3 events>" in repr(batch)


def test_a_response_becomes_one_columnar_batch() -> None:
    convert = _convert_fetch(TOPIC)
    (batch,) = convert(_response(b"\x00\x01", b"\x00\x02", latest=b"\x00\x09"), 3.0)
    assert isinstance(batch, EventBatch)
    assert batch.columns == EventColumns(
        (b"\x00\x01", b"\x00\x02"), ("e1", "e2"), ("s1", "s1"), (b"\x00", b"\x01\x01")
    )
    assert batch.latest_replay_id == ReplayId(b"\x00\x09")
    assert (batch.rpc_id, batch.received_at, batch.pending_num_requested) == ("rpc-1", 3.0, 7)
    assert [e.replay_id for e in batch.events] == [ReplayId(b"\x00\x01"), ReplayId(b"\x00\x02")]
    # Without latest_replay_id the last event's replay id is the position.
    (batch,) = convert(_response(b"\x00\x01", b"\x00\x04"), 3.0)
    assert batch.latest_replay_id == ReplayId(b"\x00\x04")


def test_an_event_without_replay_id_is_a_permanent_error_naming_it() -> None:
    convert = _convert_fetch(TOPIC)
    with pytest.raises(PermanentError, match="event e2 without a replay id"):
        convert(_response(b"\x00\x01", b""), 3.0)


def test_the_parser_reports_the_wire_size_of_the_response_it_parsed() -> None:
    response = _response(b"\x00\x01", b"\x00\x02", latest=b"\x00\x02")
    wire = response.SerializeToString()
    parser = _SizedParser(pb2.FetchResponse.FromString)
    parsed = parser(wire)
    assert parsed == response
    assert parser.size_of(parsed) == len(wire) == response.ByteSize()
    # Asked again without a new parse, it measures the message instead of guessing.
    assert parser.size_of(parsed) == response.ByteSize()


def test_a_listening_parser_hands_each_response_and_its_size_to_the_listener() -> None:
    response = _response(b"\x00\x01", latest=b"\x00\x01")
    wire = response.SerializeToString()
    parser = _SizedParser(pb2.FetchResponse.FromString)
    heard: list[tuple[pb2.FetchResponse, int]] = []
    parser.listen(lambda parsed, size: heard.append((parsed, size)))
    assert parser(wire) == (response, len(wire))
    assert heard == [(response, len(wire))]


def test_a_stream_counts_a_response_and_asks_for_more_while_grpc_parses_it() -> None:
    """The top-up goes out from the parse itself, before the reader thread hands the response
    over (nothing consumes this stream): the server has at most ``window`` events outstanding,
    so the stream would stand still while the reader waited to be scheduled."""
    window = FlowWindow(window=2, buffer_events=10)
    parser = _SizedParser(pb2.FetchResponse.FromString)
    wire = _response(b"\x00\x01", b"\x00\x02", latest=b"\x00\x02").SerializeToString()
    seen: dict[str, object] = {}
    requests_sent: list[pb2.FetchRequest] = []

    def call(requests: Iterator[pb2.FetchRequest]) -> Iterator[object]:
        requests_sent.append(next(requests))  # the first request, as gRPC would send it
        parsed = parser(wire)
        seen.update(outstanding=window.outstanding, buffered=window.buffered)
        requests_sent.append(next(requests))  # the top-up is queued already
        return iter([parsed])

    stream: _Stream[pb2.FetchRequest, pb2.FetchResponse] = _Stream(
        name=TOPIC,
        call=call,
        parser=parser,
        first_request=lambda n: pb2.FetchRequest(topic_name=TOPIC, num_requested=n),
        fetch_request=lambda n: pb2.FetchRequest(num_requested=n),
        convert=_convert_fetch(TOPIC),
        window=window,
        idle_fetch_after=60.0,
        logger=logging.getLogger("test"),
    )
    try:
        assert seen == {"outstanding": 2, "buffered": 2}
        assert [r.num_requested for r in requests_sent] == [2, 2]
        items = iter(stream)
        batch = next(items)
        assert isinstance(batch, EventBatch) and len(batch) == 2
        assert batch.columns.replay_ids == (b"\x00\x01", b"\x00\x02")
    finally:
        stream.close()
