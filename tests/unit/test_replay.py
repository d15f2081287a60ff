from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.replay import After, Earliest, Latest, ReplayId, parse_start


@given(st.binary(min_size=1, max_size=32))
def test_replay_id_round_trips_through_hex_and_base64(raw: bytes) -> None:
    rid = ReplayId(raw)
    assert ReplayId.from_hex(rid.hex()) == rid
    assert ReplayId.from_base64(rid.base64()) == rid
    assert bytes(rid) == raw


def test_replay_id_is_bytes_only() -> None:
    with pytest.raises(TypeError, match="needs bytes"):
        ReplayId(487259)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        ReplayId(b"")


def test_replay_ids_keep_every_byte() -> None:
    # The 10-byte form seen from Salesforce: trailing zero bytes are part of the id.
    ten = ReplayId(bytes.fromhex("0000000000076f5b0000"))
    assert ten != ReplayId(bytes.fromhex("0000000000076f5b"))
    assert str(ten) == "0000000000076f5b0000"


def test_parse_start() -> None:
    assert parse_start("LATEST") == Latest()
    assert parse_start("earliest") == Earliest()
    assert parse_start("after:00ff") == After(ReplayId(b"\x00\xff"))
    with pytest.raises(ValueError, match="start position"):
        parse_start("yesterday")
