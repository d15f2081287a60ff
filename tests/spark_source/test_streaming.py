"""Structured Streaming queries (the ``salesforce`` source into a Delta table through Delta's
streaming sink) in a driver process of their own, against the emulator over a socket.

The driver is SIGKILLed at random moments, several times, while events keep being published,
and restarted from its checkpoint; the table must end with every published event exactly
once. A schema change mid-stream stops the query with the reason, and the restarted query
reads both versions, each decoded with its own schema.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.spark_source.conftest import ACCOUNT, Org
from tests.spark_source.oracle import decoded, expected_rows, silver_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark_source, pytest.mark.slow]

KILLS = 5


def table_rows(path: Any) -> list[dict[str, Any]]:
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def uncommitted(checkpoint: Path) -> bool:
    """Whether the checkpoint holds a micro-batch that was planned (its offsets written) but
    not committed: the restarted query must read exactly its events again."""

    def ids(name: str) -> set[int]:
        folder = checkpoint / name
        return (
            {int(p.name) for p in folder.iterdir() if p.name.isdigit()}
            if folder.exists()
            else set()
        )

    return bool(ids("offsets") - ids("commits"))


@pytest.mark.timeout(400)
def test_a_query_killed_again_and_again_ends_with_every_event_exactly_once(
    org: Org, driver_for: Any
) -> None:
    rng = random.Random(18)
    org.publish(200)
    driver = driver_for(org.options(startingReplay="earliest", maxEventsPerTrigger="60"))
    replays = 0
    for _ in range(KILLS):
        proc = driver.start(timeout=300)
        driver.wait_started(proc)
        # Events keep arriving while the query runs; it dies at a random moment of a
        # micro-batch, a Delta commit or a checkpoint write.
        for _ in range(3):
            time.sleep(rng.uniform(0.2, 1.2))
            org.publish(rng.randint(20, 60))
        time.sleep(rng.uniform(0.0, 1.5))
        driver.kill(proc)
        replays += uncommitted(driver.root / "checkpoint")
    published = org.replay_ids()
    code, out = driver.run(until_events=len(published), timeout=120)
    assert code == 0, out
    rows = table_rows(driver.table)
    got = Counter(r["replay_id"] for r in rows)
    assert [rid for rid, n in got.items() if n > 1] == [], "no event is landed twice"
    assert set(got) == set(published), "every published event is landed"
    logged = {e.replay_id: e.event_id for e in org.emulator.log(ACCOUNT)}
    assert all(logged[r["replay_id"]] == r["event_id"] for r in rows)
    # Typically every kill leaves one: offsets are written as a micro-batch is planned.
    assert replays >= 1, "some restart read a planned, uncommitted micro-batch again"


@pytest.mark.timeout(400)
def test_a_schema_change_mid_stream_stops_the_query_and_the_restart_reads_both_versions(
    org: Org, driver_for: Any
) -> None:
    org.publish(150)
    driver = driver_for(org.options(startingReplay="earliest", decode="silver"))
    before = len(org.replay_ids())
    first = driver.start(timeout=120)
    driver.wait_started(first)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if DeltaTable.is_deltatable(str(driver.table)):
            ids = {r["_cdc_replay_id"] for r in table_rows(driver.table)}
            if len(ids) >= before:
                break
        time.sleep(0.5)
    org.workload.change_schema("Account")
    org.publish(150)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 3, out
    assert "SchemaChangedError" in out and "Tier__c" in out

    code, out = driver.run(
        until_events=len(org.replay_ids()), id_column="_cdc_replay_id", timeout=120
    )
    assert code == 0, out
    rows = table_rows(driver.table)
    truth = decoded(org.emulator, ACCOUNT)
    assert {r["_cdc_replay_id"] for r in rows} == set(org.replay_ids())
    assert silver_rows(rows) == expected_rows(org.workload, "Account", set(truth))
    versions = Counter(r["_cdc_schema_id"] for r in rows)
    assert len(versions) == 2
    for row in rows:
        schema_id, record = truth[row["_cdc_event_id"]]
        assert row["_cdc_schema_id"] == schema_id
        assert row["Tier__c"] == record.get("Tier__c")
