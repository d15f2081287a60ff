"""The event bus without a server: wire encoding, positions, retention, purges, journal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.emulator.eventlog import (
    EventBus,
    NewEvent,
    decode_replay_id,
    encode_replay_id,
)
from ingest.pubsub import pb2
from tests.emulator_helpers import (
    ACCOUNT_TOPIC,
    CHANNEL,
    ORDER_TOPIC,
    WIDGET_TOPIC,
    FakeClock,
    account_events,
    catalogue,
    order_events,
    widget_events,
)


def _bus(clock=None, **kwargs) -> EventBus:
    return EventBus(catalogue(), clock=clock or FakeClock(), retention=72 * 3600, **kwargs)


@given(
    event_id=st.text(max_size=40),
    schema_id=st.text(max_size=30),
    payload=st.binary(max_size=300),
    headers=st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=10)), max_size=3),
)
def test_wire_bytes_equal_protobuf_serialization(event_id, schema_id, payload, headers):
    bus = _bus()
    (entry,) = bus.append(
        [NewEvent(ORDER_TOPIC, schema_id, payload, event_id or "x", tuple(headers))]
    )
    expected = pb2.FetchResponse(events=[entry.consumer_event()]).SerializeToString()
    assert entry.wire == expected
    assert entry.payload == payload
    parsed = pb2.FetchResponse.FromString(entry.wire).events[0]
    assert parsed.event.id == (event_id or "x") and parsed.replay_id == entry.replay_id


def test_large_payload_offsets():
    bus = _bus()
    payload = bytes(range(256)) * 800
    (entry,) = bus.append([NewEvent(ORDER_TOPIC, "s", payload, "id")])
    assert entry.payload == payload
    assert pb2.FetchResponse.FromString(entry.wire).events[0].event.payload == payload


def test_replay_id_codec():
    assert encode_replay_id(487259) == bytes.fromhex("000000000007 6f5b 0000".replace(" ", ""))
    assert decode_replay_id(bytes.fromhex("0000000000076f5b0000")) == 487259
    # The 8-byte form (the counter alone, big-endian) names the same position.
    assert decode_replay_id(bytes.fromhex("0000000000076f5b")) == 487259
    assert decode_replay_id(b"\x00" * 9 + b"\x01") is None


def test_positions_increase_with_seeded_gaps():
    a = [e.position for e in _bus(seed=7).append(account_events(20))]
    b = [e.position for e in _bus(seed=7).append(account_events(20))]
    c = [e.position for e in _bus(seed=8).append(account_events(20))]
    assert a == b != c
    assert a == sorted(set(a))
    bus = _bus()
    last = bus.append(account_events(1))[0].position
    keepalive = bus.advance()
    assert keepalive > last and bus.position == keepalive and bus.is_valid(keepalive)
    assert not bus.is_valid(keepalive + 1)


def test_keepalive_position_never_passes_a_waiting_event():
    bus = _bus()
    first = bus.append(account_events(2))
    # A reader that has read both events (sequence 2) may be given a keepalive position.
    keepalive = bus.advance_past(ACCOUNT_TOPIC, 2)
    assert keepalive is not None and keepalive > first[-1].position
    # An event appended after the reader's last read is waiting: no keepalive, no movement,
    # or a subscriber resuming after the keepalive position would skip it.
    (late,) = bus.append(account_events(1, start=2))
    assert bus.advance_past(ACCOUNT_TOPIC, 2) is None
    assert bus.position == late.position
    # The channel carries the Account event too; another topic's reader is not held back.
    assert bus.advance_past(CHANNEL, 2) is None
    assert bus.advance_past(ORDER_TOPIC, 0) is not None
    assert bus.advance_past(ACCOUNT_TOPIC, 3) is not None


def test_channel_log_and_listeners():
    bus = _bus()
    calls: list[str] = []
    bus.listen(CHANNEL, lambda: calls.append("channel"))
    bus.listen(ORDER_TOPIC, lambda: calls.append("order"))
    acct = bus.append(account_events(1))
    bus.append(widget_events(1))
    bus.append(order_events(1))
    assert [e.topic for e in bus.log(CHANNEL)] == [ACCOUNT_TOPIC, WIDGET_TOPIC]
    assert bus.log(CHANNEL)[0] is acct[0]
    assert calls == ["channel", "channel", "order"]


def test_read_respects_count_and_byte_budget():
    bus = _bus()
    events = bus.append(account_events(5))
    got, nxt = bus.read(ACCOUNT_TOPIC, 0, 3, 10**9)
    assert got == events[:3] and nxt == 3
    size = len(events[0].wire)
    got, nxt = bus.read(ACCOUNT_TOPIC, 0, 5, size * 2 + 1)
    assert len(got) == 2 and nxt == 2
    got, _ = bus.read(ACCOUNT_TOPIC, 0, 5, 1)  # always at least one event
    assert len(got) == 1
    assert bus.seq_after(ACCOUNT_TOPIC, events[1].position) == 2
    assert bus.start(ACCOUNT_TOPIC) == 0 and bus.end(ACCOUNT_TOPIC) == 5


def test_retention_by_injected_clock():
    clock = FakeClock()
    bus = _bus(clock)
    old = bus.append(account_events(3))
    clock.advance(3600)
    new = bus.append(account_events(2))
    clock.advance(72 * 3600 - 1800)
    assert bus.log(ACCOUNT_TOPIC) == tuple(new)
    assert not bus.is_valid(old[-1].position) and bus.is_valid(new[0].position)
    assert bus.start(ACCOUNT_TOPIC) == 3
    got, nxt = bus.read(ACCOUNT_TOPIC, 0, 10, 10**9)  # a reader behind the purge skips ahead
    assert got == new and nxt == 5


def test_purge_through_and_before():
    clock = FakeClock()
    bus = _bus(clock)
    events = bus.append(account_events(4))
    assert bus.purge(through=events[1].position) == 2
    assert bus.floor == events[1].position + 1
    assert bus.purge(through=events[0].position) == 0
    clock.advance(10)
    later = bus.append(account_events(1))
    assert bus.purge(before=clock.now - 5) == 2
    assert bus.log(ACCOUNT_TOPIC) == tuple(later)


def test_journal_reload(tmp_path):
    clock = FakeClock()
    bus = _bus(clock, state_dir=tmp_path)
    events = bus.append(account_events(3) + order_events(2))
    bus.append([NewEvent(ORDER_TOPIC, "s", b"p", "h", (("k", b"v"),))])
    bus.purge(through=events[0].position)
    keepalive = bus.advance()
    bus.close()
    again = _bus(clock, state_dir=tmp_path)
    assert [e.wire for e in again.log(ACCOUNT_TOPIC)] == [e.wire for e in events[1:3]]
    assert [e.event_id for e in again.log(ORDER_TOPIC)] == ["order-0", "order-1", "h"]
    assert again.log(ORDER_TOPIC)[-1].headers == (("k", b"v"),)
    assert [e.topic for e in again.log(CHANNEL)] == [ACCOUNT_TOPIC, ACCOUNT_TOPIC]
    assert again.position == keepalive and again.is_valid(keepalive)
    assert not again.is_valid(events[0].position)
    assert again.append(account_events(1))[0].position > keepalive
    again.close()


def test_journal_drops_a_torn_final_record(tmp_path):
    bus = _bus(state_dir=tmp_path)
    bus.append(account_events(2))
    bus.close()
    journal = tmp_path / "events.log"
    journal.write_bytes(journal.read_bytes()[:-7])
    again = _bus(state_dir=tmp_path)
    assert [e.event_id for e in again.log(ACCOUNT_TOPIC)] == ["acct-0"]
    again.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="retention"):
        EventBus(catalogue(), clock=FakeClock(), retention=0)
    with pytest.raises(ValueError, match="max_gap"):
        EventBus(catalogue(), clock=FakeClock(), retention=1, max_gap=0)
