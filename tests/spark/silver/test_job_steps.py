"""How the silver job reads bronze, on each lake engine: steps over small or large ranges of
bronze versions write the same rows, a range the quarantine already partly holds is not
quarantined twice, bronze compacted (and vacuumed) behind silver's back is still read exactly
once; and both engines write the same silver and quarantine rows from the same bronze."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pipelines.engines import LakeEngine, SparkEngine, TableRef, Txn
from pipelines.engines.local import LocalEngine
from pipelines.silver.job import QUARANTINE_TABLE, SilverResult, run_silver
from pipelines.spec import Conf, ObjectSpec
from tests.conftest import EngineFactory
from tests.spark.silver.lake import (
    ACCOUNT,
    ACCOUNT_SILVER,
    CHANNEL,
    OPPORTUNITY,
    UTC,
    account_batch_0,
    conf_of,
    land,
    outcome,
    quarantine,
    register,
    silver,
    versions,
)
from tests.unit.silver.support import ACCOUNT_V1, ACCOUNT_V2, CONTACT, change_event

NOW = datetime(2025, 6, 1, 12, tzinfo=UTC)
BRONZE = TableRef("bronze", ACCOUNT.tables.bronze)


def run(engine: LakeEngine, conf: Conf) -> SilverResult:
    return run_silver(engine, conf, now=lambda: NOW)


def _landings() -> list[list[tuple[str, bytes]]]:
    """Four landings of Account: a first event; multi-record events, a wildcard, gap events
    and a row for every quarantine reason; a schema change (v2 moves every later bitmap
    position and adds a compound field); an event of v2."""
    v1, v2 = ACCOUNT_V1, ACCOUNT_V2
    return [
        [(v1.schema_id, change_event(v1, "CREATE", ["001Z"]))],
        account_batch_0(),
        [
            (v1.schema_id, change_event(v1, "UPDATE", ["001A"], {"Phone": "1"}, changed=["Phone"])),
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
        [(v2.schema_id, change_event(v2, "CREATE", ["001Q"]))],
    ]


def test_small_and_large_ranges_of_bronze_give_the_same_rows(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    conf = conf_of(ACCOUNT)
    landings = _landings()

    # One run after each landing: every step reads one or two bronze versions; the first
    # reads the table from version 0, the later ones only the new commits.
    steps = make_engine(tmp_path / "steps")
    register(steps, ACCOUNT_V1, CONTACT)
    for batch_id, events in enumerate(landings):
        if batch_id == 2:
            register(steps, ACCOUNT_V2)
        land(steps, ACCOUNT, events, batch_id)
        if batch_id != 2:
            run(steps, conf)
    # A re-run finds nothing to do and writes nothing.
    before = versions(steps, ACCOUNT_SILVER, QUARANTINE_TABLE)
    again = run(steps, conf)
    assert versions(steps, ACCOUNT_SILVER, QUARANTINE_TABLE) == before
    assert again.objects[0].up_to_date and again.rows == 0 and again.quarantined == 0

    # All of bronze in one step.
    whole = make_engine(tmp_path / "whole")
    register(whole, ACCOUNT_V1, CONTACT)
    register(whole, ACCOUNT_V2)
    for batch_id, events in enumerate(landings):
        land(whole, ACCOUNT, events, batch_id)
    result = run(whole, conf)
    assert result.objects[0].commits == 1

    assert silver(steps, ACCOUNT) == silver(whole, ACCOUNT)
    assert quarantine(steps) == quarantine(whole)
    assert steps.schema(ACCOUNT_SILVER) == whole.schema(ACCOUNT_SILVER)
    rows, bad = silver(whole, ACCOUNT), quarantine(whole)
    assert len(rows) == 15 and len(bad) == 3
    assert {r["reason_kind"] for r in bad} == {"corrupt_payload", "unknown_schema", "wrong_entity"}


def test_a_quarantine_range_already_partly_written(engine: LakeEngine) -> None:
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

    register(engine, a, c, o, topic=CHANNEL)
    land(engine, account, batch(0), 0)
    run(engine, conf)
    first = land(engine, account, batch(1), 1)
    land(engine, account, batch(2), 2)
    # An earlier run quarantined batch 1's bad row with a range ending at batch 1's version
    # and died before its silver writes: the step over both versions must not quarantine it
    # again.
    bad = quarantine(engine)[0]
    row = {**bad, "bronze_batch_id": 1, "bronze_batch_seq": 3, "payload": bytes([2, 1])}
    engine.append(
        QUARANTINE_TABLE,
        pa.Table.from_pylist([row], schema=engine.read_arrow(QUARANTINE_TABLE).schema),
        txn=Txn("sfcdc.silver.quarantine:Account", first),
    )
    result = run(engine, conf)
    assert [r["Id"] for r in silver(engine, account)] == ["0010", "0011", "0012"]
    assert [r["Id"] for r in silver(engine, contact)] == ["0030", "0031", "0032"]
    assert [(r["bronze_batch_id"], r["bronze_batch_seq"]) for r in quarantine(engine)] == [
        (0, 3),
        (1, 3),
        (2, 3),
    ]
    (topic,) = result.topics
    assert topic.other_entities == {"Opportunity": 2}


def test_an_object_without_events_in_a_range_still_records_it(engine: LakeEngine) -> None:
    account = ObjectSpec(api_name="Account", kind="change_events", topic=CHANNEL)
    contact = ObjectSpec(api_name="Contact", kind="change_events", topic=CHANNEL)
    a, c = ACCOUNT_V1, CONTACT
    conf = conf_of(account, contact)
    register(engine, a, c, topic=CHANNEL)
    landed = land(engine, account, [(a.schema_id, change_event(a, "CREATE", ["0010"]))], 0)
    result = run(engine, conf)
    by_object = {o.object: o for o in result.objects}
    assert (by_object["Contact"].events, by_object["Contact"].rows) == (0, 0)
    # An empty commit creates the table and records the bronze version it got to.
    contacts = TableRef("silver", "contact")
    assert engine.count(engine.read(contacts)) == 0
    assert engine.txn_version(contacts, "sfcdc.silver:Contact") == landed
    assert all(o.up_to_date for o in run(engine, conf).objects)
    land(engine, account, [(c.schema_id, change_event(c, "CREATE", ["0030"]))], 1)
    assert run(engine, conf).rows == 1
    assert [r["Id"] for r in silver(engine, contact)] == ["0030"]


@pytest.mark.parametrize("vacuum", [False, True], ids=["compacted", "vacuumed"])
def test_bronze_compacted_behind_silver_is_read_once(engine: LakeEngine, vacuum: bool) -> None:
    s = ACCOUNT_V1
    conf = conf_of(ACCOUNT)
    register(engine, s)

    def events(n: int) -> list[tuple[str, bytes]]:
        return [(s.schema_id, change_event(s, "CREATE", [f"001{n}{i}"])) for i in range(2)]

    for b in (0, 1):
        land(engine, ACCOUNT, events(b), b)
    run(engine, conf)
    for b in (2, 3):
        land(engine, ACCOUNT, events(b), b)
    # Compaction rewrites the files of versions silver has and has not read yet. Vacuumed
    # away, the files of the new versions are gone: the change data feed no longer covers
    # them, the whole table is read and the batches silver processed are left out.
    report = engine.maintain(BRONZE, vacuum_hours=0 if vacuum else None)
    assert report.files_removed == 4
    land(engine, ACCOUNT, events(4), 4)
    result = run(engine, conf)
    (topic,) = result.topics
    assert topic.full_read == vacuum
    assert (topic.bronze_rows, result.rows) == (6, 6)
    ids = [r["Id"] for r in silver(engine, ACCOUNT)]
    assert ids == [f"001{b}{i}" for b in range(5) for i in range(2)]
    assert run(engine, conf).objects[0].up_to_date


# ------------------------------------------------------------------ both engines, one bronze


def _one_landing(engine: LakeEngine) -> None:
    s = ACCOUNT_V1
    register(engine, s)
    events = [
        (s.schema_id, change_event(s, "CREATE", ["001A", "001B"], {"Name": "Acme"})),
        (s.schema_id, b"\x01\x02"),
        ("nope", change_event(s, "CREATE", ["001C"])),
    ]
    land(engine, ACCOUNT, events, batch_id=1)


def _three_landings(engine: LakeEngine) -> None:
    v1, v2 = ACCOUNT_V1, ACCOUNT_V2
    register(engine, v1, v2)
    landings = [
        [
            (v1.schema_id, change_event(v1, "CREATE", ["001A"], {"Name": "Acme", "Phone": "1"})),
            (v1.schema_id, b"\x01\x02"),
        ],
        [
            ("nope", change_event(v1, "CREATE", ["001C"])),
            (v2.schema_id, change_event(v2, "UPDATE", ["001A", "001B"], {"Tier__c": "Gold"})),
        ],
        [(v2.schema_id, change_event(v2, "DELETE", ["001A"]))],
    ]
    for batch_id, events in enumerate(landings, start=1):
        land(engine, ACCOUNT, events, batch_id=batch_id)


@pytest.mark.spark_engine
@pytest.mark.spark
@pytest.mark.parametrize(
    ("write_bronze", "counts"),
    [(_one_landing, (2, 2, 2, 2)), (_three_landings, (4, 2, 4, 2))],
    ids=["one-landing", "three-landings"],
)
def test_both_engines_write_the_same_rows(
    spark: SparkSession,
    tmp_path: Path,
    write_bronze: Callable[[LakeEngine], None],
    counts: tuple[int, ...],
) -> None:
    outcomes: list[tuple[Any, ...]] = []
    for engine in (
        LocalEngine(location=tmp_path / "local"),
        SparkEngine(spark, location=tmp_path / "spark"),
    ):
        write_bronze(engine)
        outcomes.append(outcome(engine, run(engine, conf_of(ACCOUNT))))
    assert outcomes[0] == outcomes[1]
    rows, quarantined, silver_rows, bad = outcomes[0]
    assert (rows, quarantined, len(silver_rows), len(bad)) == counts


@pytest.mark.spark_engine
@pytest.mark.spark
def test_each_engine_continues_what_the_other_wrote(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"

    def engines() -> tuple[LakeEngine, LakeEngine]:
        # New engines for each run, as new processes would have.
        return LocalEngine(location=lake), SparkEngine(spark, location=lake)

    s = ACCOUNT_V1
    conf = conf_of(ACCOUNT)
    register(engines()[0], s)
    # Landing and silver alternate between the engines; each run takes only the new batch.
    for b in range(4):
        engine = engines()[b % 2]
        land(engine, ACCOUNT, [(s.schema_id, change_event(s, "CREATE", [f"001{b}"]))], b)
        result = run(engine, conf)
        assert (result.rows, result.objects[0].commits) == (1, 1)
    local, remote = engines()
    assert run(remote, conf).objects[0].up_to_date and run(local, conf).objects[0].up_to_date
    assert [r["Id"] for r in silver(local, ACCOUNT)] == ["0010", "0011", "0012", "0013"]
    assert silver(remote, ACCOUNT) == silver(local, ACCOUNT)
