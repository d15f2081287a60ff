"""Columnar batches land exactly the rows per-event batches land.

The client hands landing :class:`EventColumns` without building an object per event; a batch
built from :class:`ReceivedEvent` objects must land identically. Both kinds go through the
same landing into real Delta tables (local engine), with batch limits that split responses.
No server is reached: the schemas are registered beforehand and the channel is never dialled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from ingest.client import EventBatch, EventColumns, Item, Keepalive, ReceivedEvent
from ingest.replay import ReplayId
from pipelines.bronze import BronzeLanding
from pipelines.bronze.checkpoint import CheckpointStore
from pipelines.bronze.tables import bronze_tables, ensure_tables
from pipelines.session import engine_for
from pipelines.spec import load_conf

TOPIC = "/event/Order_Shipped__e"


def _responses() -> list[list[ReceivedEvent]]:
    out = []
    seq = 0
    for size in (10, 3, 9, 1, 12):
        events = []
        for _ in range(size):
            seq += 1
            events.append(
                ReceivedEvent(
                    ReplayId(seq.to_bytes(6, "big")),
                    f"evt-{seq:04d}",
                    "schema-b" if seq % 4 == 0 else "schema-a",
                    bytes([seq % 256]) * (seq % 7),
                )
            )
        out.append(events)
    return out


def _items(columnar: bool) -> list[Item]:
    items: list[Item] = []
    for i, events in enumerate(_responses()):
        latest = events[-1].replay_id
        received_at = 1_700_000_000.25 + i
        if columnar:
            columns = EventColumns(
                tuple(e.replay_id.value for e in events),
                tuple(e.event_id for e in events),
                tuple(e.schema_id for e in events),
                tuple(e.payload for e in events),
            )
            items.append(
                EventBatch.of_columns(
                    TOPIC, columns, latest_replay_id=latest, rpc_id="r", received_at=received_at
                )
            )
        else:
            items.append(EventBatch(TOPIC, tuple(events), latest, "r", received_at))
        if i == 2:
            items.append(Keepalive(TOPIC, latest, "r", received_at))
    return items


def _land(root: Path, items: list[Item]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    conf_dir = root / "conf"
    (conf_dir / "objects").mkdir(parents=True)
    (conf_dir / "pipeline.yml").write_text(f"lake: {{engine: local, location: {root / 'lake'}}}\n")
    (conf_dir / "objects" / "order.yml").write_text(
        "object: Order_Shipped__e\nkind: platform_event\n"
        "batching: {max_events: 7, max_bytes: 1MiB, max_age_seconds: 60}\n"
    )
    conf = load_conf(conf_dir)
    engine = engine_for(conf.pipeline.lake)
    tables = bronze_tables(conf.topics())
    ensure_tables(engine, tables)
    CheckpointStore(engine, tables).register_schemas(TOPIC, {"schema-a": "{}", "schema-b": "{}"})
    channel = grpc.insecure_channel("127.0.0.1:9")
    try:
        landing = BronzeLanding(engine, conf.topics(), channel=channel, tokens=None)
        # The consuming side of run(), driven item by item without a subscription.
        landing._prepare()
        landing._committer.start()
        try:
            for item in items:
                landing._handle(item)
            landing._finish("all items handled")
        finally:
            landing._committer.close()
    finally:
        channel.close()
    bronze = engine.read_arrow(tables.bronze(TOPIC)).sort_by(
        [("batch_id", "ascending"), ("batch_seq", "ascending")]
    )
    checkpoints = engine.read_arrow(tables.checkpoints).sort_by("batch_id")
    return bronze.to_pylist(), checkpoints.drop_columns(["committed_at"]).to_pylist()


@pytest.fixture(scope="module")
def landed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("columnar")
    return {
        "columns": _land(root / "columns", _items(columnar=True)),
        "events": _land(root / "events", _items(columnar=False)),
    }


def test_columnar_and_per_event_batches_land_the_same_rows(landed: dict[str, Any]) -> None:
    by_columns, by_events = landed["columns"], landed["events"]
    assert by_columns == by_events
    rows, checkpoints = by_columns
    expected = [e for events in _responses() for e in events]
    assert [(r["replay_id"], r["event_id"], r["schema_id"], r["payload"]) for r in rows] == [
        (e.replay_id.value, e.event_id, e.schema_id, e.payload) for e in expected
    ]
    # Responses were split at the 7-event limit without losing their receive times.
    times = [r["received_at"].timestamp() for r in rows]
    assert times[9:11] == [1_700_000_000.25, 1_700_000_001.25]
    assert [c["event_count"] for c in checkpoints if c["kind"] == "events"] == [7, 7, 7, 7, 7]
    assert checkpoints[-1]["replay_id"] == expected[-1].replay_id.value
