"""A streaming query (shared Spark session, Delta sink, the emulator over a socket) whose
stored replay id the server rejects: under ``fail`` the query stops naming the position,
under ``earliest`` it lands every retained event exactly once, and a ``decode=silver`` query
(or a raw one with ``replayGaps=rows``) lands the replay gap as a row of its own."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.spark_source import SalesforceSource
from tests.spark_source.conftest import ACCOUNT, Org

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.spark_source]


def start(spark: SparkSession, options: dict[str, str], root: Path) -> StreamingQuery:
    spark.dataSource.register(SalesforceSource)
    return (
        spark.readStream.format("salesforce")
        .options(**options)
        .load()
        .writeStream.format("delta")
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start(str(root / "table"))
    )


def landed(table: Path) -> list[dict[str, object]]:
    """The rows of the query's Delta sink so far."""
    if not DeltaTable.is_deltatable(str(table)):
        return []
    got: list[dict[str, object]] = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    return got


def wait_for(query: StreamingQuery, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 120
    while not done():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the query did not land it in time"
        time.sleep(0.5)


def corrupted(org: Org) -> str:
    """A stored replay id the server no longer accepts (its events were purged)."""
    org.publish(120)
    logged = org.emulator.log(ACCOUNT)
    gone = logged[2].replay_id
    org.emulator.faults.purge(through=logged[4].replay_id)
    return base64.b64encode(gone).decode()


@pytest.mark.timeout(300)
def test_under_fail_the_query_stops_naming_the_rejected_replay_id(
    spark: SparkSession, org: Org, tmp_path: Path
) -> None:
    stored = corrupted(org)
    query = start(spark, org.options(startingReplay=stored), tmp_path)
    try:
        with pytest.raises(StreamingQueryException, match="ReplayIdError") as info:
            query.awaitTermination(120)
    finally:
        query.stop()
    assert base64.b64decode(stored).hex() in str(info.value)


@pytest.mark.timeout(300)
def test_under_earliest_the_query_lands_every_retained_event_once(
    spark: SparkSession, org: Org, tmp_path: Path
) -> None:
    stored = corrupted(org)
    retained = [e.replay_id for e in org.emulator.log(ACCOUNT)]
    query = start(spark, org.options(startingReplay=stored, onCorrupted="earliest"), tmp_path)
    table = tmp_path / "table"
    landed: list[bytes] = []
    try:
        deadline = time.monotonic() + 120
        while len(landed) < len(retained) and time.monotonic() < deadline:
            time.sleep(0.5)
            assert query.exception() is None, query.exception()
            if DeltaTable.is_deltatable(str(table)):
                landed = DeltaTable(str(table)).to_pyarrow_table().column("replay_id").to_pylist()
    finally:
        query.stop()
    assert sorted(landed) == sorted(retained)


@pytest.mark.timeout(300)
def test_a_silver_query_records_the_replay_gap_in_its_offsets_and_as_a_row(
    spark: SparkSession, org: Org, tmp_path: Path
) -> None:
    stored = corrupted(org)
    gone = base64.b64decode(stored).hex()
    options = org.options(startingReplay=stored, onCorrupted="latest", decode="silver")
    query = start(spark, options, tmp_path)
    table = tmp_path / "table"
    try:
        # latest: nothing follows the gap yet, and the micro-batch still carries it.
        wait_for(query, lambda: any(r["_cdc_error_kind"] == "replay_gap" for r in landed(table)))
        # Read now: Spark keeps the last 100 offsets only, and keepalives make batches.
        offsets = [
            p.read_text()
            for p in (tmp_path / "checkpoint" / "offsets").iterdir()
            if p.name.isdigit()
        ]
        before = len(org.emulator.log(ACCOUNT))
        org.publish(60)
        after = {e.event_id for e in org.emulator.log(ACCOUNT)[before:]}
        assert after
        wait_for(query, lambda: after <= {r["_cdc_event_id"] for r in landed(table)})
    finally:
        query.stop()
    gaps = [r for r in landed(table) if r["_cdc_error_kind"] == "replay_gap"]
    assert len(gaps) == 1, "the gap is one row, in one micro-batch"
    detail = str(gaps[0]["_cdc_error"])
    assert f"after {gone}" in detail and "resumed at latest" in detail
    assert gaps[0]["_cdc_entity"] == "Account" and gaps[0]["_cdc_event_id"] is None
    # The offset that ends the gap's micro-batch records it (so a re-read brings it back).
    assert sum('"gaps"' in text for text in offsets) == 1
    decoded = [r for r in landed(table) if r["_cdc_error"] is None]
    assert {r["_cdc_event_id"] for r in decoded} == after


@pytest.mark.timeout(300)
def test_a_raw_query_with_gap_rows_lands_the_replay_gap_as_a_row(
    spark: SparkSession, org: Org, tmp_path: Path
) -> None:
    stored = corrupted(org)
    gone = base64.b64decode(stored).hex()
    options = org.options(startingReplay=stored, onCorrupted="latest", replayGaps="rows")
    query = start(spark, options, tmp_path)
    table = tmp_path / "table"
    try:
        wait_for(query, lambda: any(r["replay_gap"] for r in landed(table)))
        before = len(org.emulator.log(ACCOUNT))
        org.publish(60)
        after = [e.replay_id for e in org.emulator.log(ACCOUNT)[before:]]
        assert after
        wait_for(query, lambda: set(after) <= {r["replay_id"] for r in landed(table)})
    finally:
        query.stop()
    gaps = [r for r in landed(table) if r["replay_gap"]]
    assert len(gaps) == 1, "the gap is one row, in one micro-batch"
    (gap,) = gaps
    assert f"after {gone}" in str(gap["replay_gap"])
    assert "resumed at latest" in str(gap["replay_gap"])
    assert gap["topic"] == ACCOUNT and gap["received_at"] is not None
    assert (gap["replay_id"], gap["event_id"], gap["schema_id"], gap["payload"]) == (None,) * 4
    # Every event after the gap landed once, with no gap text of its own.
    events = [r for r in landed(table) if not r["replay_gap"]]
    assert sorted(r["replay_id"] for r in events) == sorted(after)
    assert all(r["payload"] for r in events)
