"""A schema change in the middle of a Structured Streaming query (shared Spark session, Delta
sink, the emulator over a socket): the query stops with the reason, and started again from
its checkpoint it reads both versions, each event decoded with its own writer schema."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.spark_source import SalesforceSource
from tests.spark_source.conftest import ACCOUNT, Org
from tests.spark_source.oracle import decoded, expected_rows, silver_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.spark_source]


def wait(done: Callable[[], bool], query: StreamingQuery, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the query did not land the events in time"
        time.sleep(0.5)


@pytest.mark.timeout(400)
def test_a_schema_change_mid_stream_stops_the_query_and_the_restart_reads_both_versions(
    spark: SparkSession, org: Org, tmp_path: Path
) -> None:
    spark.dataSource.register(SalesforceSource)
    table = tmp_path / "account"
    options = org.options(startingReplay="earliest", decode="silver")

    def start() -> StreamingQuery:
        return (
            spark.readStream.format("salesforce")
            .options(**options)
            .load()
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .option("mergeSchema", "true")
            .trigger(processingTime="200 milliseconds")
            .start(str(table))
        )

    def rows() -> list[dict[str, Any]]:
        if not DeltaTable.is_deltatable(str(table)):
            return []
        return DeltaTable(str(table)).to_pyarrow_table().to_pylist()

    def landed() -> bool:
        return {r["_cdc_replay_id"] for r in rows()} >= set(org.replay_ids())

    org.publish(150)
    first = start()
    try:
        wait(landed, first)
        org.workload.change_schema("Account")
        org.publish(150)
        with pytest.raises(StreamingQueryException, match="SchemaChangedError") as info:
            first.awaitTermination(120)
        assert "Tier__c" in str(info.value)
    finally:
        first.stop()

    second = start()
    try:
        wait(landed, second)
    finally:
        second.stop()
    got = rows()
    truth = decoded(org.emulator, ACCOUNT)
    assert {r["_cdc_replay_id"] for r in got} == set(org.replay_ids())
    assert silver_rows(got) == expected_rows(org.workload, "Account", set(truth))
    assert len(Counter(r["_cdc_schema_id"] for r in got)) == 2
    for row in got:
        schema_id, record = truth[row["_cdc_event_id"]]
        assert row["_cdc_schema_id"] == schema_id
        assert row["Tier__c"] == record.get("Tier__c")
