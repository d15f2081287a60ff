"""Bronze files written by pyarrow and committed with add actions hold exactly the rows the
engine's own append would, under the same transaction rules."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.errors import CheckpointError, LakeError
from ingest.replay import ReplayId
from pipelines.bronze.checkpoint import CheckpointRow, CheckpointStore
from pipelines.bronze.files import LocalBronzeWriter, bronze_file_stats
from pipelines.bronze.landing import _arrow, _OpenBatch, _Sealed
from pipelines.bronze.tables import BRONZE_LAYOUT, BRONZE_SCHEMA, BronzeTables, ensure_tables
from pipelines.engines import LocalEngine, TableRef
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.base import Txn

TOPIC = "/data/AccountChangeEvent"


def _batch(batch_id: int, events: int, *, schema_ids: list[str] | None = None) -> _Sealed:
    ob = _OpenBatch()
    ob.replay_ids = [bytes([batch_id, i % 256, i // 256]) for i in range(events)]
    ob.event_ids = [f"{batch_id:04d}-{i:06d}-é" if i == 1 else f"e-{i}" for i in range(events)]
    ob.schema_ids = schema_ids or [f"schema-{i % 3}" for i in range(events)]
    ob.payloads = [bytes([i % 256]) * (i % 50) for i in range(events)]
    ob.times = [1_700_000_000_000_000 + batch_id, 1_700_000_000_500_000 + batch_id]
    ob.counts = [events // 2, events - events // 2]
    return _Sealed(TOPIC, batch_id, "events", None, ob)


def _reference(sealed: _Sealed) -> pa.Table:
    b = sealed.batch
    n = len(b.replay_ids)
    received = [t for t, c in zip(b.times, b.counts, strict=True) for _ in range(c)]
    return pa.table(
        {
            "replay_id": pa.array(b.replay_ids, pa.binary()),
            "event_id": pa.array(b.event_ids, pa.string()),
            "schema_id": pa.array(b.schema_ids, pa.string()),
            "payload": pa.array(b.payloads, pa.binary()),
            "topic": pa.array([TOPIC] * n, pa.string()),
            "received_at": pa.array(received, pa.timestamp("us", tz="UTC")),
            "batch_id": pa.array([sealed.batch_id] * n, pa.int64()),
            "batch_seq": pa.array(range(n), pa.int32()),
        },
        schema=BRONZE_SCHEMA,
    )


@pytest.mark.parametrize("schema_ids", [None, ["only-one"] * 300])
def test_batch_columns_equal_a_value_by_value_conversion(schema_ids: list[str] | None) -> None:
    sealed = _batch(7, 300, schema_ids=schema_ids)
    expected = _reference(sealed)
    assert _arrow(sealed).equals(expected)


def _engine(tmp_path: Path) -> tuple[LocalEngine, TableRef]:
    engine = LocalEngine(None, location=tmp_path / "lake")
    table = TableRef("bronze", "account")
    engine.ensure_table(table, arrow_schema_to_spark(BRONZE_SCHEMA))
    return engine, table


def test_direct_files_land_the_same_rows_as_the_engine(tmp_path: Path) -> None:
    (engine, table), (other, other_table) = _engine(tmp_path / "a"), _engine(tmp_path / "b")
    writer = LocalBronzeWriter(engine.path, clock=lambda: 1_700_000_000.0)
    assert writer.accepts(table)
    for batch_id in (1, 2, 3):
        rows = _reference(_batch(batch_id, 250))
        txn = Txn(f"sfcdc.bronze:{TOPIC}", batch_id)
        meta = {"sfcdc.topic": TOPIC, "sfcdc.kind": "events"}
        direct = writer.append(table, rows, txn=txn, metadata=meta)
        via_engine = other.append(
            other_table, rows, txn=txn, metadata=meta, evolve_schema=False, layout=BRONZE_LAYOUT
        )
        assert (direct.version, direct.rows, direct.skipped) == (batch_id, 250, False)
        assert (via_engine.version, via_engine.rows) == (direct.version, direct.rows)

    order = [("batch_id", "ascending"), ("batch_seq", "ascending")]
    got = engine.read_arrow(table).sort_by(order)
    assert got.equals(other.read_arrow(other_table).sort_by(order))
    assert got.num_rows == 750
    assert engine.txn_version(table, f"sfcdc.bronze:{TOPIC}") == 3
    # Readers that filter on batch_id (checkpoint recovery) see the batch and only it.
    only = engine.read_arrow(table, where=[("batch_id", "=", 2)])
    assert sorted(only.column("batch_seq").to_pylist()) == list(range(250))
    assert set(only.column("batch_id").to_pylist()) == {2}
    history = engine.history(table, limit=1)[0]
    assert history.metadata == {"sfcdc.topic": TOPIC, "sfcdc.kind": "events"}
    assert history.txn == Txn(f"sfcdc.bronze:{TOPIC}", 3)
    # One commit per batch after the table's creation.
    assert len(list((engine.path(table) / "_delta_log").glob("*.json"))) == 4


def test_an_applied_transaction_writes_nothing(tmp_path: Path) -> None:
    engine, table = _engine(tmp_path)
    writer = LocalBronzeWriter(engine.path)
    assert writer.accepts(table)
    rows = _reference(_batch(1, 10))
    txn = Txn("sfcdc.bronze:x", 1)
    first = writer.append(table, rows, txn=txn, metadata={})
    files = sorted(engine.path(table).glob("*.parquet"))
    again = writer.append(table, rows, txn=txn, metadata={})
    assert again.skipped and again.version == first.version and again.rows == 0
    assert sorted(engine.path(table).glob("*.parquet")) == files
    assert engine.read_arrow(table).num_rows == 10


def test_rows_of_another_schema_are_refused_with_both_schemas_named(tmp_path: Path) -> None:
    engine, table = _engine(tmp_path)
    writer = LocalBronzeWriter(engine.path)
    assert writer.accepts(table)
    expected = r"needs rows of \['replay_id', .*got rows of \['replay_id'\]"
    with pytest.raises(LakeError, match=expected):
        writer.append(
            table, pa.table({"replay_id": [b"1"]}), txn=Txn("sfcdc.bronze:x", 1), metadata={}
        )


def test_a_second_writer_of_the_same_transaction_is_refused(tmp_path: Path) -> None:
    engine, table = _engine(tmp_path)
    first, second = LocalBronzeWriter(engine.path), LocalBronzeWriter(engine.path)
    assert first.accepts(table) and second.accepts(table)
    app = "sfcdc.bronze:x"
    first.append(table, _reference(_batch(1, 5)), txn=Txn(app, 1), metadata={})
    second.append(table, _reference(_batch(2, 5)), txn=Txn(app, 2), metadata={})
    # The first writer commits after its own last commit; finding that version taken, it
    # reads the table again and sees that the transaction moved meanwhile.
    with pytest.raises(LakeError, match="another writer committed"):
        first.append(table, _reference(_batch(3, 5)), txn=Txn(app, 3), metadata={})
    # After a failure the writer reads the table again, so the repeat is recognised.
    assert first.append(table, _reference(_batch(2, 5)), txn=Txn(app, 2), metadata={}).skipped
    assert first.append(table, _reference(_batch(3, 5)), txn=Txn(app, 3), metadata={}).version
    assert sorted(set(engine.read_arrow(table).column("batch_id").to_pylist())) == [1, 2, 3]
    assert engine.read_arrow(table).num_rows == 15


def test_checkpoint_rows_written_directly_read_back_like_the_engine_writes_them(
    tmp_path: Path,
) -> None:
    tables = BronzeTables(
        {TOPIC: TableRef("bronze", "account")},
        TableRef("bronze", "sfcdc_checkpoints"),
        TableRef("bronze", "sfcdc_schemas"),
    )
    read = []
    for name, direct in (("direct", True), ("engine", False)):
        engine = LocalEngine(None, location=tmp_path / name)
        ensure_tables(engine, tables)
        writer = LocalBronzeWriter(engine.path) if direct else None
        store = CheckpointStore(engine, tables, clock=lambda: 1_700_000_000.0, writer=writer)
        for batch in (1, 2):
            store.write(
                CheckpointRow(
                    topic=TOPIC,
                    batch_id=batch,
                    kind="events",
                    replay_id=ReplayId(bytes([batch])),
                    event_count=10 * batch,
                    payload_bytes=100 * batch,
                    bronze_version=batch,
                )
            )
        with pytest.raises(CheckpointError, match="already committed"):
            store.write(CheckpointRow(TOPIC, 2, "keepalive", ReplayId(b"\x02"), 0, 0))
        latest = store.latest(TOPIC)
        assert latest is not None and latest.batch_id == 2
        assert latest.replay_id == ReplayId(b"\x02")
        read.append(engine.read_arrow(tables.checkpoints).sort_by("batch_id"))
    assert read[0].equals(read[1])


def test_a_table_that_gained_a_column_is_left_to_the_engine(tmp_path: Path) -> None:
    engine, table = _engine(tmp_path)
    grown = pa.schema([*BRONZE_SCHEMA, pa.field("extra", pa.string())])
    engine.ensure_table(table, arrow_schema_to_spark(grown))
    assert not LocalBronzeWriter(engine.path).accepts(table)
    assert not LocalBronzeWriter(engine.path).accepts(TableRef("bronze", "missing"))


def test_file_stats_bound_the_filtered_columns() -> None:
    stats = json.loads(bronze_file_stats(_reference(_batch(4, 20))))
    assert stats["numRecords"] == 20
    assert stats["minValues"]["batch_id"] == stats["maxValues"]["batch_id"] == 4
    assert (stats["minValues"]["batch_seq"], stats["maxValues"]["batch_seq"]) == (0, 19)
    assert stats["minValues"]["received_at"] == "2023-11-14T22:13:20.000Z"
    assert stats["maxValues"]["received_at"] == "2023-11-14T22:13:20.500Z"
    assert set(stats["nullCount"]) == {"event_id", "schema_id", "topic", "received_at"} | {
        "batch_id",
        "batch_seq",
    }


def _log_entry(engine: LocalEngine, table: TableRef, version: int) -> list[dict[str, object]]:
    path = engine.path(table) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_plain_tables_are_committed_as_delta_log_entries_readers_understand(
    tmp_path: Path,
) -> None:
    engine, table = _engine(tmp_path)
    writer = LocalBronzeWriter(engine.path, clock=lambda: 1_700_000_000.0)
    assert writer.accepts(table)
    result = writer.append(
        table, _reference(_batch(1, 20)), txn=Txn("sfcdc.bronze:x", 1), metadata={"k": "v"}
    )
    assert result.version == 1
    entry = _log_entry(engine, table, 1)
    kinds = [next(iter(action)) for action in entry]
    assert kinds == ["commitInfo", "add", "txn"]
    info = entry[0]["commitInfo"]
    assert isinstance(info, dict) and info["operation"] == "WRITE"
    assert info["timestamp"] == 1_700_000_000_000
    # delta-rs reads it back: rows, transaction, history, statistics-based skipping.
    assert engine.version(table) == 1
    assert engine.txn_version(table, "sfcdc.bronze:x") == 1
    assert engine.read_arrow(table).num_rows == 20
    (last, *_rest) = engine.history(table, limit=1)
    assert last.metadata == {"k": "v"} and last.txn == Txn("sfcdc.bronze:x", 1)
    assert engine.read_arrow(table, where=[("batch_id", "=", 2)]).num_rows == 0
    # No temporary file is left next to the log.
    assert [
        p.name for p in (engine.path(table) / "_delta_log").iterdir() if p.suffix == ".tmp"
    ] == []


def test_a_version_taken_by_maintenance_is_not_a_conflict(tmp_path: Path) -> None:
    engine, table = _engine(tmp_path)
    writer = LocalBronzeWriter(engine.path)
    assert writer.accepts(table)
    app = "sfcdc.bronze:x"
    for batch_id in (1, 2, 3):
        writer.append(table, _reference(_batch(batch_id, 5)), txn=Txn(app, batch_id), metadata={})
    engine.maintain(table)  # compaction and a Delta checkpoint: versions this writer did not see
    compacted = engine.version(table)
    assert compacted is not None and compacted > 3
    result = writer.append(table, _reference(_batch(4, 5)), txn=Txn(app, 4), metadata={})
    assert result.version == compacted + 1 and not result.skipped
    assert engine.txn_version(table, app) == 4
    assert sorted(set(engine.read_arrow(table).column("batch_id").to_pylist())) == [1, 2, 3, 4]
    assert engine.read_arrow(table).num_rows == 20


def test_tables_with_other_protocols_are_committed_through_delta_rs(tmp_path: Path) -> None:
    engine = LocalEngine(None, location=tmp_path / "lake")
    table = TableRef("bronze", "account")
    engine.ensure_table(
        table,
        arrow_schema_to_spark(BRONZE_SCHEMA),
        properties={"delta.enableChangeDataFeed": "true"},  # needs writer version 4
    )
    writer = LocalBronzeWriter(engine.path)
    assert writer.accepts(table)
    first = writer.append(table, _reference(_batch(1, 5)), txn=Txn("a", 1), metadata={})
    second = writer.append(table, _reference(_batch(2, 5)), txn=Txn("a", 2), metadata={})
    assert first.version is not None and second.version == first.version + 1
    info = _log_entry(engine, table, second.version)[0]["commitInfo"]
    # delta-rs wrote this commit (it names itself in it), not the writer's own log entry.
    assert isinstance(info, dict) and str(info.get("engineInfo", "")).startswith("delta-rs")
    assert engine.txn_version(table, "a") == 2 and engine.read_arrow(table).num_rows == 10


def test_nulls_in_not_null_columns_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    engine, table = _engine(tmp_path)
    writer = LocalBronzeWriter(engine.path)
    assert writer.accepts(table)
    rows = _reference(_batch(1, 3))
    broken = rows.set_column(1, rows.schema.field("event_id"), pa.array(["a", None, "c"]))
    with pytest.raises(LakeError, match=r"nulls in NOT NULL columns \['event_id'\]"):
        writer.append(table, broken, txn=Txn("a", 1), metadata={})
    assert list(engine.path(table).glob("*.parquet")) == []
    assert engine.version(table) == 0
