"""Streaming API bronze on both lake engines: notifications land exactly once and the replay
checkpoint moves in step with the bronze commits, including across a stop between a batch's
bronze commit and its checkpoint commit (the next landing rebuilds the checkpoint from bronze
and resumes after it)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.emulator.server import Emulator
from pipelines.bronze.cometd_tables import COMETD_BRONZE_SCHEMA, replay_number
from pipelines.bronze.tables import bronze_app_id
from pipelines.cometd_pipeline import land_streams
from pipelines.engines import LakeEngine, TableRef
from pipelines.engines.base import Txn
from pipelines.spec import load_conf
from tests.cometd_helpers import Bayeux, token_manager
from tests.integration.cometd.lake import (
    ACCOUNT_QUERY,
    account,
    checkpoints,
    ordered,
    write_conf,
)

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

A = "001000000000001AAA"
CHANNEL = "/topic/Accts"
# The PushTopic exists (made below on the emulator); sfcdc checks it and lands from it.
EXISTING = f"""\
kind: streaming_api
channel: {CHANNEL}
pushtopic:
  manage: existing
  query: {ACCOUNT_QUERY}
"""


def _raw_message(emu: Emulator, after: int) -> dict[str, object]:
    """The message following replay id ``after``, as the server sends it."""
    client = Bayeux(emu)
    try:
        client.handshake()
        assert client.subscribe(CHANNEL, after)["successful"]
        return next(m for m in client.events() if m["channel"] == CHANNEL)
    finally:
        client.close()


def test_exactly_once_with_the_checkpoint_rebuilt_after_a_stop_between_commits(
    tmp_path: Path, tls_emulator: Emulator, lake_engine: LakeEngine, lake_kind: str
) -> None:
    emu = tls_emulator
    emu.streaming.create_push_topic("Accts", ACCOUNT_QUERY, NotifyForFields="Referenced")
    conf = load_conf(
        write_conf(
            tmp_path,
            emu,
            {"accts": EXISTING},
            engine=lake_kind,
            batching="{max_events: 100, max_bytes: 1MiB, max_age_seconds: 5}",
        )
    )
    spec = conf.enabled_streams()[0]
    bronze = TableRef("bronze", spec.tables.bronze)
    tokens = token_manager(emu)

    account(emu, "CREATE", A, {"Name": "Acme", "Industry": "Energy"})
    account(emu, "UPDATE", A, {"Industry": "Banking"})
    first = land_streams(
        conf, engine=lake_engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True
    )
    assert [t.events for t in first.topics] == [2]

    # Two more notifications; a landing received the first, committed it to bronze as batch 2
    # and stopped before writing checkpoint 2.
    account(emu, "UPDATE", A, {"NumberOfEmployees": 10})
    account(emu, "UPDATE", A, {"Name": "Acme Corp"})
    message = _raw_message(emu, after=2)
    event = message["data"]["event"]  # type: ignore[index]
    row = {
        "replay_id": event["replayId"],
        "channel": CHANNEL,
        "event_type": event["type"],
        "created_date": event["createdDate"],
        "event_uuid": None,
        "raw": json.dumps(message, separators=(",", ":")),
        "malformed": None,
        "received_at": datetime.now(timezone.utc),
        "batch_id": 2,
        "batch_seq": 0,
    }
    lake_engine.append(
        bronze,
        pa.Table.from_pylist([row], schema=COMETD_BRONZE_SCHEMA),
        txn=Txn(bronze_app_id(spec.key), 2),
    )

    second = land_streams(
        conf, engine=lake_engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True
    )
    assert [t.events for t in second.topics] == [1]

    rows = ordered(lake_engine, bronze, "replay_id", "event_type")
    assert [(r["batch_id"], r["replay_id"]) for r in rows] == [(1, 1), (1, 2), (2, 3), (3, 4)]
    marks = checkpoints(lake_engine, spec.key)
    assert [(r["batch_id"], replay_number(r["replay_id"])) for r in marks] == [
        (1, 2),
        (2, 3),
        (3, 4),
    ]
    assert marks[1]["detail"].startswith("recovered from bronze")
    assert lake_engine.txn_version(bronze, bronze_app_id(spec.key)) == 3
