"""Gold's small batches read silver with pyarrow (no Spark job): the same silver batches go
through that path and through Spark's read, in two lakes, and every table must be equal
(gold, tombstones, SCD2 history, re-sync rows), with the same versions and transactions."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipelines.engines import LocalEngine, TableRef
from pipelines.gold.job import GoldResult, history_table, tombstone_table
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.silver import small
from pipelines.silver.columns import FieldLayout
from tests.spark.gold.conftest import Silver, account_schema_json
from tests.spark.gold.test_job import GOLD, NOW, RATING, Lake, register

pytestmark = pytest.mark.spark

PATHS = ("driver", "spark")
_VOLATILE = {"_cdc_updated_at"}


def _rows(engine: LocalEngine, table: TableRef) -> list[dict[str, Any]] | None:
    if not engine.exists(table):
        return None
    rows = engine.read_arrow(table).to_pylist()
    return sorted(rows, key=repr)


def _tables(env: Lake) -> dict[str, Any]:
    obj = env.conf.objects[0]
    out: dict[str, Any] = {}
    for table in (GOLD, tombstone_table(obj), history_table(obj), RESYNC_TABLE):
        out[str(table)] = _rows(env.engine, table)
        if env.engine.exists(table):
            last = env.engine.history(table, limit=1)[0]
            out[f"{table} commit"] = (env.engine.version(table), last.txn, dict(last.metadata))
    return out


def _summary(result: GoldResult) -> list[tuple[Any, ...]]:
    return [
        (
            o.object,
            o.after_version,
            o.silver_version,
            o.changes,
            o.records,
            o.applied,
            o.ignored,
            o.resync_rows,
            o.resolved,
            o.tombstones,
            o.versions,
            o.skipped,
            None if o.merge is None else (o.merge.inserted, o.merge.updated, o.merge.deleted),
        )
        for o in result.objects
    ]


def _batches() -> list[Silver]:
    first = Silver()
    first.create("001A", 0, Phone="p0")
    first.create("001B", 0, Phone="b0")
    first.create("001C", 0, Phone="c0")
    second = first.next_batch()
    second.update("001A", 5, Phone="p1")
    second.update("001A", 6, NumberOfEmployees=50)
    second.add("001B", "DELETE", 7)
    second.add("001B", "GAP_DELETE", 7.5)  # resolved by the UNDELETE below
    second.add("001C", "GAP_UPDATE", 8)
    second.add(None, "GAP_OVERFLOW", 9, record_count=0)
    second.update("001D", 9, Phone="unknown record")
    third = second.next_batch()
    third.update("001B", 3, Phone="stale")  # older than its delete
    third.add("001B", "UNDELETE", 12, Name="Company 001B", Phone="back")
    third.add("001C", "UPDATE", 13, changed=["Phone"], Phone="c1", Name="Company 001C")
    third.add("001*", "UPDATE", 14, wildcard=True, changed=["Phone"], Phone="all")
    return [first, second, third]


@pytest.mark.parametrize(
    "gold",
    [
        "",
        "gold: {deletes: hard}\n",
        "gold: {scd2: {enabled: true, track: [Phone]}}\n",
    ],
)
def test_both_reads_of_silver_build_the_same_gold(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gold: str
) -> None:
    # Built once: every row has its own event id, commit number and replay id.
    batches = _batches()
    # A new silver column arrives with a later schema.
    fourth = Silver(extra=(FieldLayout("Rating__c", "leaf", "double"),), batch=9)
    fourth.update("001A", 20, Rating__c=4.5)
    outcomes = {}
    for path in PATHS:
        monkeypatch.setattr(small, "SMALL_BATCH_ROWS", 50_000 if path == "driver" else -1)
        env = Lake(spark, tmp_path / path, gold=gold)
        steps = []
        for n, batch in enumerate(batches):
            env.land(batch)
            steps.append(_summary(env.gold(now=NOW + timedelta(minutes=n))))
        register(env.engine, account_schema_json(), account_schema_json(extra=[RATING]))
        env.land(fourth)
        spark.sparkContext.setJobGroup(f"gold-{path}", "a small batch")
        steps.append(_summary(env.gold(now=NOW + timedelta(minutes=5))))
        # Nothing new: nothing read, nothing written.
        before = _tables(env)
        steps.append(_summary(env.gold(now=NOW + timedelta(minutes=6))))
        assert _tables(env) == before
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(f"gold-{path}")
        spark.sparkContext.setJobGroup("other", "")
        if path == "driver" and "scd2" not in gold:
            # (The SCD2 history is merged through Spark DataFrames either way.)
            assert list(jobs) == []
        outcomes[path] = (steps, _tables(env))
    assert outcomes["driver"] == outcomes["spark"]
    steps, tables = outcomes["driver"]
    assert [s[0][2] for s in steps] == [0, 1, 2, 3, 3]
    gold_rows = {r["Id"]: r for r in tables[str(GOLD)]}
    assert gold_rows["001A"]["Rating__c"] == 4.5
    resync = {(r["record_id"], r["change_type"]): r for r in tables[str(RESYNC_TABLE)]}
    assert resync[("001B", "GAP_DELETE")]["resolved_by"] is not None
