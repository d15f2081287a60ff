"""Batch reads (``spark.read.format("salesforce")``) from the emulator over a socket, in the
shared Spark session: raw bronze columns and silver-decoded rows, several topics at once, a
schema change between events, and a corrupted stored replay id under each policy."""

from __future__ import annotations

import base64
from collections import Counter

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from pipelines.spark_source import SalesforceSource
from tests.spark_source.conftest import ACCOUNT, ORDERS, Org
from tests.spark_source.oracle import decoded, expected_rows, silver_rows, timestamp

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.spark_source]

QUICK = {"batchIdleSeconds": "1", "startingReplay": "earliest"}


@pytest.fixture
def spark_with_source(spark: SparkSession) -> SparkSession:
    spark.dataSource.register(SalesforceSource)
    return spark


def test_raw_rows_are_the_published_events_in_replay_order(
    spark_with_source: SparkSession, org: Org
) -> None:
    org.publish(400)
    df = spark_with_source.read.format("salesforce").options(**org.options(**QUICK)).load()
    assert df.columns == ["replay_id", "event_id", "schema_id", "payload", "topic", "received_at"]
    rows = df.collect()
    logged = org.emulator.log(ACCOUNT)
    assert len(rows) == len(logged) > 0
    assert [bytes(r.replay_id) for r in rows] == [e.replay_id for e in logged]
    assert [r.event_id for r in rows] == [e.event_id for e in logged]
    assert [r.schema_id for r in rows] == [e.schema_id for e in logged]
    assert [bytes(r.payload) for r in rows] == [e.payload for e in logged]
    assert {r.topic for r in rows} == {ACCOUNT}


def test_several_topics_are_read_at_once(spark_with_source: SparkSession, org: Org) -> None:
    org.publish(400)
    options = org.options(topic=f"{ACCOUNT}, {ORDERS}", **QUICK)
    rows = spark_with_source.read.format("salesforce").options(**options).load().collect()
    got = Counter(r.topic for r in rows)
    assert got == {ACCOUNT: len(org.emulator.log(ACCOUNT)), ORDERS: len(org.emulator.log(ORDERS))}
    assert got[ORDERS] > 0


def test_silver_rows_are_decoded_with_each_events_own_schema_across_a_schema_change(
    spark_with_source: SparkSession, org: Org
) -> None:
    org.publish(300)
    org.workload.change_schema("Account")
    org.publish(300)
    df = (
        spark_with_source.read.format("salesforce")
        .options(**org.options(decode="silver", **QUICK))
        .load()
    )
    assert {"Id", "_cdc_change_type", "_cdc_changed_fields", "Name", "Tier__c"} <= set(df.columns)
    rows = [r.asDict(recursive=True) for r in df.collect()]
    truth = decoded(org.emulator, ACCOUNT)
    versions = Counter(schema_id for schema_id, _ in truth.values())
    assert len(versions) == 2, "both schema versions were published"
    assert {r["_cdc_schema_id"] for r in rows} == set(versions)
    # Bitmaps expanded with each event's own schema (v2 inserts fields, moving the bits).
    assert silver_rows(rows) == expected_rows(org.workload, "Account", set(truth))
    assert all(r["_cdc_error"] is None for r in rows)
    for row in rows:
        schema_id, record = truth[row["_cdc_event_id"]]
        assert row["_cdc_schema_id"] == schema_id
        header = record["ChangeEventHeader"]
        assert row["_cdc_commit_timestamp"] == timestamp(header["commitTimestamp"])
        assert row["LastModifiedDate"] == timestamp(record["LastModifiedDate"])
        name = record["Name"]
        assert row["Name"] == (name if isinstance(name, str) else None)
        assert row["Tier__c"] == record.get("Tier__c")


def test_a_corrupted_stored_replay_id_fails_by_default(
    spark_with_source: SparkSession, org: Org
) -> None:
    org.publish(100)
    logged = org.emulator.log(ACCOUNT)
    gone = logged[2].replay_id
    org.emulator.faults.purge(through=logged[4].replay_id)
    options = org.options(**{**QUICK, "startingReplay": base64.b64encode(gone).decode()})
    df = spark_with_source.read.format("salesforce").options(**options).load()
    with pytest.raises(PythonException, match="ReplayIdError") as info:
        df.collect()
    assert gone.hex() in str(info.value)
    assert "on_corrupted='earliest'" in str(info.value)


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_a_corrupted_stored_replay_id_follows_the_policy(
    spark_with_source: SparkSession, org: Org, policy: str
) -> None:
    org.publish(100)
    logged = org.emulator.log(ACCOUNT)
    gone = logged[2].replay_id
    org.emulator.faults.purge(through=logged[4].replay_id)
    retained = [e.replay_id for e in org.emulator.log(ACCOUNT)]
    options = org.options(
        **{**QUICK, "startingReplay": base64.b64encode(gone).decode(), "onCorrupted": policy}
    )
    rows = spark_with_source.read.format("salesforce").options(**options).load().collect()
    got = [bytes(r.replay_id) for r in rows]
    # earliest: every retained event; latest: only what comes after subscribing (nothing).
    assert got == (retained if policy == "earliest" else [])
