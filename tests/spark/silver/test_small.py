"""Small steps decoded in the driver (pipelines.silver.small) write exactly what the Spark
path writes: the same input goes through both, in two lakes, and the tables must be equal
(silver rows, quarantine rows, versions, app transactions, commit metadata)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pipelines.engines import LocalEngine, TableRef, Txn
from pipelines.silver import small
from pipelines.silver.job import QUARANTINE_TABLE, SilverResult, run_silver
from pipelines.spec import ObjectSpec
from tests.spark.silver.test_job import (
    ACCOUNT,
    ACCOUNT_SILVER,
    ACCOUNT_V1,
    ACCOUNT_V2,
    CHANNEL,
    CONTACT,
    OPPORTUNITY,
    account_batch_0,
    conf_of,
    land,
    quarantine,
    register,
    silver,
)
from tests.unit.silver.support import change_event

pytestmark = pytest.mark.spark

NOW = datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
PATHS = ("driver", "spark")


def _use(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    # The threshold is the switch: -1 rows sends every step through Spark.
    monkeypatch.setattr(small, "SMALL_BATCH_ROWS", 50_000 if path == "driver" else -1)


def _jobs(spark: SparkSession, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def _state(engine: LocalEngine, *tables: TableRef) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for table in tables:
        if not engine.exists(table):
            out[str(table)] = None
            continue
        last = engine.history(table, limit=1)[0]
        out[str(table)] = (engine.version(table), last.txn, dict(last.metadata))
    return out


def _summary(result: SilverResult) -> list[tuple[Any, ...]]:
    return [
        (
            t.topic,
            t.after_version,
            t.bronze_version,
            t.bronze_rows,
            t.quarantined,
            t.full_read,
            *((o.object, o.events, o.rows, o.commits, o.silver_version) for o in t.objects),
            tuple(sorted(t.other_entities.items())),
        )
        for t in result.topics
    ]


def test_a_single_topic_with_schema_change_multi_record_events_and_quarantine(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = conf_of(ACCOUNT)
    v1, v2 = ACCOUNT_V1, ACCOUNT_V2
    outcomes = {}
    for path in PATHS:
        engine = LocalEngine(spark, location=tmp_path / path)
        _use(monkeypatch, path)
        register(engine, v1, CONTACT)
        steps = []
        # The first step reads every commit from version 0; the later ones only the new ones.
        land(engine, ACCOUNT, [(v1.schema_id, change_event(v1, "CREATE", ["001Z"]))], 0)
        steps.append(_summary(run_silver(engine, conf, now=lambda: NOW)))
        # Multi-record events, a wildcard, gap events, a corrupt payload, an unknown schema
        # id and another entity's schema: every quarantine reason.
        land(engine, ACCOUNT, account_batch_0(), 1)
        steps.append(_summary(run_silver(engine, conf, now=lambda: NOW)))
        # A schema change: v2 moves every later bitmap position and adds a compound field.
        register(engine, v2)
        land(
            engine,
            ACCOUNT,
            [
                (
                    v1.schema_id,
                    change_event(v1, "UPDATE", ["001A"], {"Phone": "1"}, changed=["Phone"]),
                ),
                (
                    v2.schema_id,
                    change_event(
                        v2,
                        "UPDATE",
                        ["001A", "001B"],
                        {"Tier__c": "Gold", "ShippingAddress": {"City": "Lyon"}},
                        changed=["Tier__c", "ShippingAddress.City"],
                    ),
                ),
            ],
            2,
        )
        land(engine, ACCOUNT, [(v2.schema_id, change_event(v2, "CREATE", ["001Q"]))], 3)
        spark.sparkContext.setJobGroup(f"small-{path}", "a clean step")
        steps.append(_summary(run_silver(engine, conf, now=lambda: NOW)))
        clean_jobs = _jobs(spark, f"small-{path}")
        spark.sparkContext.setJobGroup(f"rerun-{path}", "a re-run")
        # A re-run finds nothing to do and writes nothing.
        before = _state(engine, ACCOUNT_SILVER, QUARANTINE_TABLE)
        steps.append(_summary(run_silver(engine, conf, now=lambda: NOW)))
        assert _state(engine, ACCOUNT_SILVER, QUARANTINE_TABLE) == before
        rerun_jobs = _jobs(spark, f"rerun-{path}")
        spark.sparkContext.setJobGroup("other", "")
        outcomes[path] = {
            "steps": steps,
            "silver": silver(engine, ACCOUNT),
            "quarantine": quarantine(engine),
            "tables": _state(engine, ACCOUNT_SILVER, QUARANTINE_TABLE),
            "schema": engine.schema(ACCOUNT_SILVER),
        }
        if path == "driver":
            # A step with nothing to quarantine, and a re-run, take no Spark job at all.
            assert (clean_jobs, rerun_jobs) == (0, 0)
    driver, spark_path = outcomes["driver"], outcomes["spark"]
    for key in driver:
        assert driver[key] == spark_path[key], key
    assert len(driver["silver"]) == 15 and len(driver["quarantine"]) == 3
    assert {r["reason_kind"] for r in driver["quarantine"]} == {
        "corrupt_payload",
        "unknown_schema",
        "wrong_entity",
    }


def test_channel_objects_and_a_quarantine_range_already_partly_written(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = ObjectSpec(api_name="Account", kind="change_events", topic=CHANNEL)
    contact = ObjectSpec(api_name="Contact", kind="change_events", topic=CHANNEL)
    a, c, o = ACCOUNT_V1, CONTACT, OPPORTUNITY
    conf = conf_of(account, contact)

    def batch(n: int) -> list[tuple[str, bytes]]:
        return [
            (a.schema_id, change_event(a, "CREATE", [f"001{n}"], {"Name": f"A{n}"})),
            (c.schema_id, change_event(c, "CREATE", [f"003{n}"], {"LastName": f"C{n}"})),
            (o.schema_id, change_event(o, "CREATE", [f"006{n}"], {"StageName": "New"})),
            (a.schema_id, bytes([2, n])),
        ]

    outcomes = {}
    for path in PATHS:
        engine = LocalEngine(spark, location=tmp_path / path)
        _use(monkeypatch, path)
        register(engine, a, c, o, topic=CHANNEL)
        steps = []
        land(engine, account, batch(0), 0)
        steps.append(_summary(run_silver(engine, conf, now=lambda: NOW)))
        land(engine, account, batch(1), 1)
        land(engine, account, batch(2), 2)
        # An earlier run quarantined batch 1's bad row with a range ending at version 1 and
        # died before its silver writes: the step 1..2 must not quarantine it again.
        bad = quarantine(engine)[0]
        first = {**bad, "bronze_batch_id": 1, "bronze_batch_seq": 3}
        first["payload"] = bytes([2, 1])
        engine.append(
            QUARANTINE_TABLE,
            pa.Table.from_pylist([first], schema=engine.read_arrow(QUARANTINE_TABLE).schema),
            txn=Txn("sfcdc.silver.quarantine:Account", 1),
        )
        steps.append(_summary(run_silver(engine, conf, now=lambda: NOW)))
        outcomes[path] = (
            steps,
            silver(engine, account),
            silver(engine, contact),
            [{k: v for k, v in r.items() if k != "event_id"} for r in quarantine(engine)],
            _state(engine, TableRef("silver", "account"), TableRef("silver", "contact")),
        )
    assert outcomes["driver"] == outcomes["spark"]
    steps, accounts, contacts, bad_rows, _ = outcomes["driver"]
    assert [r["Id"] for r in accounts] == ["0010", "0011", "0012"]
    assert [r["Id"] for r in contacts] == ["0030", "0031", "0032"]
    assert [(r["bronze_batch_id"], r["bronze_batch_seq"]) for r in bad_rows] == [
        (0, 3),
        (1, 3),
        (2, 3),
    ]
    assert steps[1][0][-1] == (("Opportunity", 2),)


def test_an_arrow_read_of_appends_declines_what_it_cannot_honour(
    spark: SparkSession, tmp_path: Path
) -> None:
    engine = LocalEngine(spark, location=tmp_path)
    table = TableRef("silver", "t")
    engine.append(table, pa.table({"a": [1, 2]}))
    engine.append(table, pa.table({"a": [3], "b": ["x"]}))
    rows = small.read_appended(engine, table, after_version=0, until_version=1, max_rows=10)
    assert rows is not None and rows.to_pylist() == [{"a": 3, "b": "x"}]
    # Version 0's file predates column b: it reads as null.
    both = small.read_appended(engine, table, after_version=None, until_version=1, max_rows=10)
    assert both is not None and both.column("b").to_pylist() == [None, None, "x"]
    # Too many rows for a small step.
    too_many = small.read_appended(engine, table, after_version=None, until_version=1, max_rows=2)
    assert too_many is None
    # A commit that rewrote rows (here an overwrite) is not an append.
    engine.overwrite(table, pa.table({"a": [9], "b": ["y"]}))
    assert small.read_appended(engine, table, after_version=1, until_version=2, max_rows=10) is None
    # A data file no longer on disk (compacted away and vacuumed).
    file = small.appended_files(engine, table, 1, 1)
    assert file is not None
    Path(file[0]).unlink()
    assert small.read_appended(engine, table, after_version=0, until_version=1, max_rows=10) is None
    # A commit missing from the log (cleaned up).
    (engine.path(table) / "_delta_log" / f"{1:020d}.json").unlink()
    assert small.appended_files(engine, table, 1, 1) is None
