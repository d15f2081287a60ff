"""Event batches held as columns: the per-event view and the column view agree, whichever the
batch was built from, and a response's wire size is counted without re-measuring it."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from ingest.client import EventBatch, EventColumns, ReceivedEvent
from ingest.client.stream import _SizedParser
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
