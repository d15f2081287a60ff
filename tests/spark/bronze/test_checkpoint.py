"""Checkpoints on real Delta tables, on both lake engines: reading, writing, and recovering
from a kill between the bronze and the checkpoint commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.errors import CheckpointError, ConfigError
from ingest.replay import After, Earliest, Latest, ReplayId
from pipelines.bronze import (
    BRONZE_SCHEMA,
    CHECKPOINT_SCHEMA,
    CheckpointRow,
    CheckpointStore,
    bronze_app_id,
    bronze_tables,
    checkpoint_app_id,
    ensure_tables,
)
from pipelines.engines import LakeEngine, TableRef, Txn
from pipelines.spec import BatchingSpec, ReplaySpec, TopicSpec

TOPIC = "/data/AccountChangeEvent"
OTHER = "/event/Order_Shipped__e"


def spec(topic: str, table: str) -> TopicSpec:
    return TopicSpec(topic, "change_events", table, ReplaySpec(), BatchingSpec(), ())


def rid(n: int) -> ReplayId:
    return ReplayId(n.to_bytes(8, "big") + b"\x00\x00")


def bronze_rows(batch: int, first: int, count: int) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "replay_id": rid(first + i).value,
                "event_id": f"e-{first + i}",
                "schema_id": "s1",
                "payload": b"x" * (10 + i),
                "topic": TOPIC,
                "received_at": 0,
                "batch_id": batch,
                "batch_seq": i,
            }
            for i in range(count)
        ],
        schema=BRONZE_SCHEMA,
    )


class Fixture:
    def __init__(self, engine: LakeEngine) -> None:
        self.engine = engine
        self.tables = bronze_tables([spec(TOPIC, "account_change_event"), spec(OTHER, "order")])
        ensure_tables(self.engine, self.tables)
        self.store = CheckpointStore(self.engine, self.tables, clock=lambda: 1_700_000_000.0)

    def land(self, batch: int, first: int, count: int, *, checkpoint: bool = True) -> None:
        """Steps 1 and (optionally) 2 of the protocol for one batch."""
        self.engine.append(
            self.tables.bronze(TOPIC),
            bronze_rows(batch, first, count),
            txn=Txn(bronze_app_id(TOPIC), batch),
        )
        if checkpoint:
            self.store.write(
                CheckpointRow(TOPIC, batch, "events", rid(first + count - 1), event_count=count)
            )


@pytest.fixture
def lake(lake_engine: LakeEngine) -> Fixture:
    return Fixture(lake_engine)


def test_a_fresh_topic_starts_at_the_configured_position(lake: Fixture) -> None:
    recovery = lake.store.recover(TOPIC, default_start=Latest())
    assert recovery.checkpoint is None
    assert recovery.start == Latest()
    assert recovery.next_batch_id == 1
    assert recovery.recovered_batch is None


def test_resumes_after_the_latest_checkpoint_of_its_own_topic(lake: Fixture) -> None:
    lake.land(1, 100, 3)
    lake.land(2, 200, 2)
    lake.store.write(CheckpointRow(OTHER, 1, "keepalive", rid(999)))
    recovery = lake.store.recover(TOPIC, default_start=Earliest())
    assert recovery.start == After(rid(201))
    assert recovery.next_batch_id == 3
    assert recovery.checkpoint is not None and recovery.checkpoint.kind == "events"
    assert lake.store.recover(OTHER, default_start=Earliest()).start == After(rid(999))


def test_keepalive_rows_advance_the_position_without_bronze_rows(lake: Fixture) -> None:
    lake.land(1, 100, 3)
    lake.store.write(CheckpointRow(TOPIC, 2, "keepalive", rid(150)))
    recovery = lake.store.recover(TOPIC, default_start=Earliest())
    assert recovery.start == After(rid(150))
    assert recovery.next_batch_id == 3  # bronze is at batch 1, checkpoints at 2


def test_a_kill_between_bronze_and_checkpoint_is_recovered_from_bronze(lake: Fixture) -> None:
    lake.land(1, 100, 3)
    lake.land(2, 200, 4, checkpoint=False)  # the process died after step 1
    recovery = lake.store.recover(TOPIC, default_start=Earliest())
    assert recovery.recovered_batch == 2
    assert recovery.start == After(rid(203))  # the batch's highest batch_seq
    assert recovery.next_batch_id == 3
    # The missing row is now on disk, under the batch's own transaction.
    assert lake.engine.txn_version(lake.tables.checkpoints, checkpoint_app_id(TOPIC)) == 2
    latest = lake.store.latest(TOPIC)
    assert latest is not None and latest.replay_id == rid(203)
    rows = lake.engine.read_arrow(
        lake.tables.checkpoints, where=[("topic", "=", TOPIC), ("batch_id", "=", 2)]
    ).to_pylist()
    assert len(rows) == 1
    assert rows[0]["event_count"] == 4
    assert rows[0]["payload_bytes"] == 10 + 11 + 12 + 13
    assert "recovered from bronze" in rows[0]["detail"]
    # A second start finds nothing to recover and the same position.
    again = lake.store.recover(TOPIC, default_start=Earliest())
    assert (again.recovered_batch, again.start, again.next_batch_id) == (None, After(rid(203)), 3)


def test_a_replay_of_a_committed_batch_is_skipped_by_its_transaction(lake: Fixture) -> None:
    lake.land(1, 100, 3)
    again = lake.engine.append(
        lake.tables.bronze(TOPIC), bronze_rows(1, 100, 3), txn=Txn(bronze_app_id(TOPIC), 1)
    )
    assert again.skipped
    assert lake.engine.read_arrow(lake.tables.bronze(TOPIC)).num_rows == 3
    with pytest.raises(CheckpointError, match="already committed by another writer"):
        lake.store.write(CheckpointRow(TOPIC, 1, "events", rid(102)))


def test_a_replay_gap_row_resumes_where_the_policy_moved_the_subscription(lake: Fixture) -> None:
    lake.land(1, 100, 3)
    lake.store.write(
        CheckpointRow(
            TOPIC,
            2,
            "replay_gap",
            None,
            gap_requested="after:" + rid(102).hex(),
            gap_resumed="earliest",
            detail="replay id rejected",
        )
    )
    recovery = lake.store.recover(TOPIC, default_start=Latest())
    assert recovery.start == Earliest()
    assert recovery.checkpoint is not None and recovery.checkpoint.kind == "replay_gap"
    assert recovery.next_batch_id == 3


def test_inconsistent_tables_are_reported_not_guessed(
    lake: Fixture, make_engine: Any, tmp_path: Path
) -> None:
    lake.land(1, 100, 3)
    lake.engine.append(
        lake.tables.bronze(TOPIC), bronze_rows(3, 300, 1), txn=Txn(bronze_app_id(TOPIC), 3)
    )
    with pytest.raises(CheckpointError, match="holds batch 3 but the checkpoints end at batch 1"):
        lake.store.recover(TOPIC, default_start=Earliest())

    # A transaction recorded without its row (rows deleted behind sfcdc's back).
    other = Fixture(make_engine(tmp_path / "other"))
    other.engine.append(
        other.tables.checkpoints,
        CHECKPOINT_SCHEMA.empty_table(),
        txn=Txn(checkpoint_app_id(TOPIC), 4),
    )
    with pytest.raises(CheckpointError, match="records batch 4 as committed but holds no row"):
        other.store.recover(TOPIC, default_start=Earliest())


def test_landed_after_and_the_schema_registry(lake: Fixture) -> None:
    lake.land(1, 100, 2)
    lake.land(2, 200, 2)
    assert lake.store.landed_after(TOPIC, 1) == {rid(200).value, rid(201).value}
    assert len(lake.store.landed_after(TOPIC, None)) == 4
    assert lake.store.registered_schemas() == set()
    lake.store.register_schemas(TOPIC, {"s1": '{"type":"record"}', "s2": "{}"})
    assert lake.store.registered_schemas() == {"s1", "s2"}
    rows = lake.engine.read_arrow(lake.tables.schemas, where=[("schema_id", "=", "s1")])
    assert rows.column("topic").to_pylist() == [TOPIC]


def test_rows_are_validated() -> None:
    with pytest.raises(ValueError, match="batch ids start at 1"):
        CheckpointRow(TOPIC, 0, "events", rid(1))
    with pytest.raises(ValueError, match="needs the replay id"):
        CheckpointRow(TOPIC, 1, "keepalive", None)
    with pytest.raises(ValueError, match="resumes at 'earliest' or 'latest'"):
        CheckpointRow(TOPIC, 1, "replay_gap", None, gap_resumed="after:00")


def test_table_layout_refuses_reserved_and_shared_names() -> None:
    with pytest.raises(ConfigError) as info:
        bronze_tables(
            [
                spec(TOPIC, "sfcdc_checkpoints"),
                spec(OTHER, "shared"),
                spec("/event/Other__e", "shared"),
            ]
        )
    assert info.value.problems == [
        f"{TOPIC}: bronze table 'sfcdc_checkpoints' is reserved for sfcdc's own bookkeeping "
        "(sfcdc_checkpoints, sfcdc_commits, sfcdc_leases, sfcdc_schema_failures, "
        "sfcdc_schemas, sfcdc_topic_failures); set tables.bronze to another name",
        "/event/Other__e: bronze table 'shared' already lands /event/Order_Shipped__e; each "
        "topic needs its own",
    ]
    tables = bronze_tables([spec(TOPIC, "account_change_event")])
    assert tables.bronze(TOPIC) == TableRef("bronze", "account_change_event")
    assert str(tables.checkpoints) == "bronze.sfcdc_checkpoints"
    with pytest.raises(KeyError, match="not landed here"):
        tables.bronze(OTHER)


@pytest.mark.append_parts
def test_rows_of_several_topics_are_written_together(lake: Fixture) -> None:
    store = lake.store
    lake.land(1, 100, 3, checkpoint=False)
    before = lake.engine.version(lake.tables.checkpoints)
    store.write_all(
        [
            CheckpointRow(TOPIC, 1, "events", rid(102), event_count=3),
            CheckpointRow(OTHER, 1, "keepalive", rid(999)),
        ]
    )
    # One commit holding both topics' transactions on the local engine and with the spark
    # engine's one-commit append (Delta's OptimisticTransaction); a commit per topic with its
    # DataFrameWriter.
    after = lake.engine.version(lake.tables.checkpoints)
    one_commit = getattr(lake.engine, "one_commit_appends", True)
    assert before is not None and after == before + (1 if one_commit else 2)
    assert lake.engine.txn_version(lake.tables.checkpoints, checkpoint_app_id(TOPIC)) == 1
    assert lake.engine.txn_version(lake.tables.checkpoints, checkpoint_app_id(OTHER)) == 1
    assert store.recover(TOPIC, default_start=Earliest()).start == After(rid(102))
    assert store.recover(OTHER, default_start=Earliest()).start == After(rid(999))
    # A row already committed is an error (another landing of the topic); it is not written
    # twice.
    with pytest.raises(CheckpointError, match="already committed by another writer"):
        store.write_all(
            [
                CheckpointRow(OTHER, 2, "keepalive", rid(1000)),
                CheckpointRow(TOPIC, 1, "events", rid(102), event_count=3),
            ]
        )
    rows = lake.engine.read_arrow(lake.tables.checkpoints, where=[("topic", "=", TOPIC)])
    assert rows.column("batch_id").to_pylist() == [1]
    with pytest.raises(ValueError, match="distinct topics"):
        store.write_all(
            [
                CheckpointRow(OTHER, 2, "keepalive", rid(1)),
                CheckpointRow(OTHER, 3, "keepalive", rid(2)),
            ]
        )


@pytest.mark.append_parts
def test_recover_all_reads_every_topic_in_one_pass_and_repairs_each(lake: Fixture) -> None:
    """Topics recover together: one with a checkpointed batch and a batch in bronze whose
    checkpoint was never written, one with only a keepalive checkpoint; each gets what
    recovering it alone gives, and a topic without checkpoints reads as none."""
    lake.land(1, 100, 3)
    lake.land(2, 103, 2, checkpoint=False)  # killed between the two commits
    lake.store.write(CheckpointRow(OTHER, 1, "keepalive", rid(999)))
    latest = lake.store.latest_of([TOPIC, OTHER, "/data/ContactChangeEvent"])
    assert latest[TOPIC] is not None and latest[TOPIC].batch_id == 1
    assert latest[OTHER] is not None and latest[OTHER].replay_id == rid(999)
    assert latest["/data/ContactChangeEvent"] is None
    starts = {TOPIC: Earliest(), OTHER: Latest()}
    recoveries = lake.store.recover_all(starts)
    assert recoveries[TOPIC].recovered_batch == 2
    assert recoveries[TOPIC].start == After(rid(104)) and recoveries[TOPIC].next_batch_id == 3
    assert recoveries[OTHER].recovered_batch is None
    assert recoveries[OTHER].start == After(rid(999)) and recoveries[OTHER].next_batch_id == 2
    # Recovering again finds the repaired checkpoint and writes nothing more.
    version = lake.engine.version(lake.tables.checkpoints)
    again = {t: lake.store.recover(t, default_start=s) for t, s in starts.items()}
    assert {t: (r.start, r.next_batch_id, r.recovered_batch) for t, r in again.items()} == {
        TOPIC: (After(rid(104)), 3, None),
        OTHER: (After(rid(999)), 2, None),
    }
    assert lake.engine.version(lake.tables.checkpoints) == version
