"""The operations dashboard's queries and the lag alert's run on Spark SQL (the Databricks
dialect) over a small commits table, and the lag they compute agrees with `sfcdc status`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from pipelines.ops.table import COMMITS_TABLE, CommitRecord, records_to_arrow

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[3]
TOPIC = "/data/AccountChangeEvent"


def _records(now: datetime) -> list[CommitRecord]:
    def at(seconds_ago: float) -> datetime:
        return now - timedelta(seconds=seconds_ago)

    def commit(layer: str, table: str, newest: float, visible: float, **kw: object):
        return CommitRecord(
            layer=layer,
            kind="commit",
            visible_at=at(visible),
            topic=TOPIC,
            object=None if layer == "bronze" else "Account",
            table=table,
            events=10,
            rows=10,
            newest_commit_at=at(newest),
            **kw,  # type: ignore[arg-type]
        )

    return [
        commit("bronze", "bronze.account_change_event", 100, 95, payload_bytes=500),
        commit("silver", "silver.account", 100, 90, quarantined=2),
        commit("gold", "gold.account", 400, 85, resync_rows=1),
        CommitRecord(layer="gold", kind="error", visible_at=at(50), message="LakeError: x"),
    ]


@pytest.fixture
def few_partitions(spark: SparkSession) -> Iterator[SparkSession]:
    # Four rows: one shuffle partition keeps each query's joins and groupings quick.
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    yield spark
    spark.conf.set("spark.sql.shuffle.partitions", before)


def test_every_dataset_and_the_alert_run_and_agree_on_lag(few_partitions: SparkSession) -> None:
    spark = few_partitions
    now = datetime.now(timezone.utc).replace(microsecond=0)
    spark.createDataFrame(records_to_arrow(_records(now))).createOrReplaceTempView(COMMITS_TABLE)
    document = json.loads((ROOT / "dashboards" / "sfcdc_ops.lvdash.json").read_text())
    results = {
        d["name"]: spark.sql("".join(d["queryLines"])).collect() for d in document["datasets"]
    }
    (lag,) = results["lag"]
    # Gold's newest commit time is 400 s old and no caught-up moment covers it.
    assert lag["object"] == "Account" and lag["layer"] == "gold"
    # (current_timestamp() moves on between the queries on a busy machine)
    assert 399 <= lag["lag_seconds"] <= 520
    assert sum(r["events"] for r in results["throughput"]) == 30
    assert sum(r["quarantined"] for r in results["quarantine_resync"]) == 2
    assert sum(r["resync_rows"] for r in results["quarantine_resync"]) == 1
    assert [r["message"] for r in results["errors"]] == ["LakeError: x"]

    alert = yaml.safe_load((ROOT / "resources" / "sfcdc_lag.alert.yml").read_text())
    sql = alert["resources"]["alerts"]["sfcdc_lag"]["query_text"].replace(
        "${var.catalog}.${var.bronze_schema}.", ""
    )
    (row,) = spark.sql(sql).collect()
    assert row["object"] == "Account"
    assert 0 <= row["lag_seconds"] - lag["lag_seconds"] <= 120
