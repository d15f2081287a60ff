"""Conformance of the one hand-written Delta log writer (:mod:`pipelines.engines.deltalog`):
its commits hold the rows and transactions delta-rs would commit, and both delta-rs and
delta-spark read them -- rows, statistics-based skipping, transactions, history, the change
data feed -- including after compaction by either engine. Also the bronze batch's columns."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ingest.errors import CheckpointError, LakeError
from ingest.replay import ReplayId
from pipelines.bronze.batches import OpenBatch, SealedBatch, bronze_rows
from pipelines.bronze.checkpoint import CheckpointRow, CheckpointStore
from pipelines.bronze.tables import BRONZE_LAYOUT, BRONZE_SCHEMA, BronzeTables, ensure_tables
from pipelines.engines import SparkEngine, TableRef, Txn
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.deltalog import DirectAppender, file_stats, plain_protocol
from pipelines.engines.local import LocalEngine

TOPIC = "/data/AccountChangeEvent"
APP = f"sfcdc.bronze:{TOPIC}"
TABLE = TableRef("bronze", "account")


def _batch(batch_id: int, events: int, *, schema_ids: list[str] | None = None) -> SealedBatch:
    ob = OpenBatch()
    ob.replay_ids = [bytes([batch_id, i % 256, i // 256]) for i in range(events)]
    ob.event_ids = [f"{batch_id:04d}-{i:06d}-é" if i == 1 else f"e-{i}" for i in range(events)]
    ob.schema_ids = schema_ids or [f"schema-{i % 3}" for i in range(events)]
    ob.payloads = [bytes([i % 256]) * (i % 50) for i in range(events)]
    ob.times = [1_700_000_000_000_000 + batch_id, 1_700_000_000_500_000 + batch_id]
    ob.counts = [events // 2, events - events // 2]
    return SealedBatch(TOPIC, batch_id, "events", None, ob)


def _reference(sealed: SealedBatch) -> pa.Table:
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
    expected = _reference(sealed)  # before bronze_rows, which releases the batch's lists
    assert bronze_rows(sealed).equals(expected)


def _engine(root: Path) -> LocalEngine:
    engine = LocalEngine(location=root / "lake")
    engine.ensure_table(TABLE, arrow_schema_to_spark(BRONZE_SCHEMA))
    return engine


def _log_entry(engine: LocalEngine, version: int) -> list[dict[str, Any]]:
    path = engine.path(TABLE) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_appends_are_log_entries_delta_rs_reads(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    assert plain_protocol(DeltaTable(str(engine.path(TABLE))))
    created = engine.version(TABLE)
    assert created is not None
    for batch_id in (1, 2, 3):
        result = engine.append(
            TABLE,
            _reference(_batch(batch_id, 250)),
            txn=Txn(APP, batch_id),
            metadata={"sfcdc.topic": TOPIC},
            evolve_schema=False,
            layout=BRONZE_LAYOUT,
        )
        assert (result.version, result.rows, result.skipped) == (created + batch_id, 250, False)
    entry = _log_entry(engine, created + 1)
    assert [next(iter(a)) for a in entry] == ["commitInfo", "add", "txn"]
    info = entry[0]["commitInfo"]
    assert info["engineInfo"] == "sfcdc" and info["operationMetrics"]["numOutputRows"] == "250"
    # No temporary file is left next to the log.
    assert not list((engine.path(TABLE) / "_delta_log").glob("*.tmp"))
    # delta-rs reads it back: rows, transaction, history, statistics-based skipping.
    dt = DeltaTable(str(engine.path(TABLE)))
    assert dt.version() == created + 3 and dt.transaction_version(APP) == 3
    assert dt.to_pyarrow_table().num_rows == 750
    (last,) = engine.history(TABLE, limit=1)
    assert last.metadata == {"sfcdc.topic": TOPIC} and last.txn == Txn(APP, 3)
    only = engine.read_arrow(TABLE, where=[("batch_id", "=", 2)])
    assert sorted(only.column("batch_seq").to_pylist()) == list(range(250))
    stats = json.loads(entry[1]["add"]["stats"])
    assert stats["minValues"]["batch_id"] == stats["maxValues"]["batch_id"] == 1
    # The change data feed of those commits holds exactly their rows.
    appended = engine.read_appends(TABLE, after_version=created + 1)
    assert sorted(set(engine.to_arrow(appended.rows).column("batch_id").to_pylist())) == [2, 3]


def test_delta_spark_reads_the_commits_and_compaction_by_either_engine(
    spark: Any, tmp_path: Path
) -> None:
    engine = _engine(tmp_path)
    remote = SparkEngine(spark, location=engine.location)
    for batch_id in (1, 2, 3):
        engine.append(TABLE, _reference(_batch(batch_id, 20)), txn=Txn(APP, batch_id))
    order = [("batch_id", "ascending"), ("batch_seq", "ascending")]
    expected = engine.read_arrow(TABLE).sort_by(order)
    assert remote.read_arrow(TABLE).sort_by(order).equals(expected)
    assert remote.txn_version(TABLE, APP) == 3
    filtered = remote.sql(
        f"SELECT count(*) AS n FROM delta.`{remote.path(TABLE)}` WHERE batch_id = 2"
    )
    assert filtered.collect()[0].n == 20
    history = remote.history(TABLE, limit=1)[0]
    assert history.operation == "WRITE" and history.txn == Txn(APP, 3)
    remote.maintain(TABLE)  # delta-spark compacts: this writer's next commit follows it
    engine.append(TABLE, _reference(_batch(4, 20)), txn=Txn(APP, 4))
    engine.maintain(TABLE)  # delta-rs compacts and checkpoints: delta-spark reads on
    engine.append(TABLE, _reference(_batch(5, 20)), txn=Txn(APP, 5))
    assert remote.txn_version(TABLE, APP) == 5
    assert remote.count(remote.read(TABLE)) == 100
    feed = remote.read_appends(TABLE, after_version=1)
    assert not feed.full_read
    assert sorted(set(remote.to_arrow(feed.rows).column("batch_id").to_pylist())) == [2, 3, 4, 5]


def test_an_applied_transaction_writes_nothing(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    rows = _reference(_batch(1, 10))
    first = engine.append(TABLE, rows, txn=Txn("sfcdc.bronze:x", 1))
    files = sorted(engine.path(TABLE).glob("*.parquet"))
    again = engine.append(TABLE, rows, txn=Txn("sfcdc.bronze:x", 1))
    assert again.skipped and again.version == first.version and again.rows == 0
    assert sorted(engine.path(TABLE).glob("*.parquet")) == files
    assert engine.read_arrow(TABLE).num_rows == 10


def test_a_second_writer_of_the_same_transaction_is_refused(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    first, second = DirectAppender(engine.path), DirectAppender(engine.path)
    assert first.accepts(TABLE, BRONZE_SCHEMA) and second.accepts(TABLE, BRONZE_SCHEMA)
    first.append_parts(TABLE, [(_reference(_batch(1, 5)), Txn(APP, 1))])
    second.append_parts(TABLE, [(_reference(_batch(2, 5)), Txn(APP, 2))])
    # The first writer commits after its own last commit; finding that version taken, it
    # reads the table again and sees that the transaction moved meanwhile.
    with pytest.raises(LakeError, match="another writer committed"):
        first.append_parts(TABLE, [(_reference(_batch(3, 5)), Txn(APP, 3))])
    # After a failure the writer reads the table again, so the repeat is recognised.
    (repeat,) = first.append_parts(TABLE, [(_reference(_batch(2, 5)), Txn(APP, 2))])
    assert repeat.skipped
    (third,) = first.append_parts(TABLE, [(_reference(_batch(3, 5)), Txn(APP, 3))])
    assert third.version is not None and not third.skipped
    assert sorted(set(engine.read_arrow(TABLE).column("batch_id").to_pylist())) == [1, 2, 3]
    assert engine.read_arrow(TABLE).num_rows == 15


def test_parts_of_several_transactions_share_one_commit(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    results = engine.append_parts(
        TABLE,
        [(_reference(_batch(1, 3)), Txn("a", 1)), (_reference(_batch(2, 4)), Txn("b", 1))],
    )
    assert [r.rows for r in results] == [3, 4] and results[0].version == results[1].version
    entry = _log_entry(engine, results[0].version)  # type: ignore[arg-type]
    assert [next(iter(a)) for a in entry] == ["commitInfo", "add", "txn", "txn"]
    assert engine.txn_version(TABLE, "a") == 1 and engine.txn_version(TABLE, "b") == 1


def test_checkpoint_rows_read_back_the_same_from_either_engine(spark: Any, tmp_path: Path) -> None:
    tables = BronzeTables(
        {TOPIC: TableRef("bronze", "account")},
        TableRef("bronze", "sfcdc_checkpoints"),
        TableRef("bronze", "sfcdc_schemas"),
    )
    read = []
    for name in ("local", "spark"):
        lake = tmp_path / name
        engine = (
            LocalEngine(location=lake) if name == "local" else SparkEngine(spark, location=lake)
        )
        ensure_tables(engine, tables)
        store = CheckpointStore(engine, tables, clock=lambda: 1_700_000_000.0)
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


def test_rows_must_have_the_table_schema_for_a_direct_append(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    grown = pa.schema([*BRONZE_SCHEMA, pa.field("extra", pa.string())])
    engine.ensure_table(TABLE, arrow_schema_to_spark(grown))
    assert not DirectAppender(engine.path).accepts(TABLE, BRONZE_SCHEMA)
    assert DirectAppender(engine.path).accepts(TABLE, grown)
    assert not DirectAppender(engine.path).accepts(TableRef("bronze", "missing"), BRONZE_SCHEMA)
    # The engine fits narrower rows to the table (the new column null) and appends them.
    engine.append(TABLE, _reference(_batch(1, 3)))
    assert engine.read_arrow(TABLE).column("extra").null_count == 3
    # Rows that would grow the table go through delta-rs, which evolves its schema.
    wider = _reference(_batch(2, 2)).append_column("more", pa.array(["x", "y"]))
    version = engine.append(TABLE, wider).version
    info = _log_entry(engine, version)[0]["commitInfo"]  # type: ignore[arg-type]
    assert str(info.get("engineInfo", "")).startswith("delta-rs")
    assert engine.read_arrow(TABLE, where=[("batch_id", "=", 2)]).column("more").to_pylist() == [
        "x",
        "y",
    ]


def test_tables_with_constraints_are_committed_through_delta_rs(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    DeltaTable(str(engine.path(TABLE))).alter.add_constraint({"positive": "batch_id > 0"})
    assert not plain_protocol(DeltaTable(str(engine.path(TABLE))))
    version = engine.append(TABLE, _reference(_batch(1, 5)), txn=Txn("a", 1)).version
    info = _log_entry(engine, version)[0]["commitInfo"]  # type: ignore[arg-type]
    assert str(info.get("engineInfo", "")).startswith("delta-rs")
    assert engine.txn_version(TABLE, "a") == 1 and engine.read_arrow(TABLE).num_rows == 5


def test_file_stats_bound_the_filtered_columns() -> None:
    rows = _reference(_batch(4, 20))
    stats = json.loads(file_stats(rows, unindexed=BRONZE_LAYOUT.unindexed))
    assert stats["numRecords"] == 20
    assert stats["minValues"]["batch_id"] == stats["maxValues"]["batch_id"] == 4
    assert (stats["minValues"]["batch_seq"], stats["maxValues"]["batch_seq"]) == (0, 19)
    assert stats["minValues"]["received_at"] == "2023-11-14T22:13:20.000Z"
    assert stats["maxValues"]["received_at"] == "2023-11-14T22:13:20.500Z"
    assert set(stats["minValues"]) == {"received_at", "batch_id", "batch_seq"}
    # Null counts of every indexed column, binary ones too, as Delta writes them.
    assert set(stats["nullCount"]) == set(rows.schema.names)


def test_nulls_in_not_null_columns_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    before = engine.version(TABLE)
    rows = _reference(_batch(1, 3))
    broken = rows.set_column(1, rows.schema.field("event_id"), pa.array(["a", None, "c"]))
    with pytest.raises(LakeError, match=r"event_id"):
        engine.append(TABLE, broken, txn=Txn("a", 1))
    assert list(engine.path(TABLE).glob("*.parquet")) == []
    assert engine.version(TABLE) == before


def test_two_threads_appending_to_one_table_through_one_engine_lose_nothing(
    tmp_path: Path,
) -> None:
    engine = _engine(tmp_path)
    appends = 40
    failures: list[BaseException] = []

    def write(app: str, first_batch: int) -> None:
        try:
            for n in range(1, appends + 1):
                engine.append(
                    TABLE,
                    _reference(_batch(first_batch + n, 3)),
                    txn=Txn(app, n),
                    evolve_schema=False,
                    layout=BRONZE_LAYOUT,
                )
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=write, args=("writer-a", 0)),
        threading.Thread(target=write, args=("writer-b", 100)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    batches = engine.read_arrow(TABLE).column("batch_id").to_pylist()
    assert sorted(batches) == sorted(b for b in [*range(1, 41), *range(101, 141)] for _ in range(3))
    assert engine.txn_version(TABLE, "writer-a") == appends
    assert engine.txn_version(TABLE, "writer-b") == appends
