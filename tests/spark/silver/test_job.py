"""The silver job on real Delta tables: bronze-shaped tables written through the engine, the
schema registry, incremental and idempotent runs, channels, backlogs, failures."""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from ingest.errors import LakeError
from ingest.schema import EventSchema
from pipelines.bronze.tables import SCHEMA_REGISTRY_SCHEMA, bronze_app_id
from pipelines.engines import LocalEngine, TableRef, Txn
from pipelines.silver import small
from pipelines.silver.job import QUARANTINE_TABLE, REGISTRY_TABLE, SilverResult, run_silver
from pipelines.spec import Conf, ObjectSpec, PipelineSpec, SilverSpec
from tests.unit.silver.support import (
    ACCOUNT_V1,
    ACCOUNT_V2,
    CONTACT,
    HEADER,
    ORDER_SHIPPED,
    bronze_batch,
    change_event,
    change_schema,
    encode,
    opt,
)

pytestmark = pytest.mark.spark

UTC = timezone.utc
DAY = 86_400_000
ACCOUNT_TOPIC = "/data/AccountChangeEvent"
CHANNEL = "/data/ChangeEvents"
OPPORTUNITY = change_schema(
    "Opportunity",
    [
        {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"},
        opt("StageName", "string", "Data:DynamicEnum"),
    ],
)


@pytest.fixture
def engine(spark: SparkSession, tmp_path: Path) -> LocalEngine:
    return LocalEngine(spark, location=tmp_path / "lake")


def conf_of(*objects: ObjectSpec) -> Conf:
    return Conf(pipeline=PipelineSpec(), objects=objects, conf_dir=Path("conf"))


def register(engine: LocalEngine, *schemas: EventSchema, topic: str = ACCOUNT_TOPIC) -> None:
    """Registry rows, as landing writes them before the events that use them."""
    now = datetime.now(UTC)
    engine.append(
        REGISTRY_TABLE,
        pa.table(
            {
                "schema_id": [s.schema_id for s in schemas],
                "schema_json": [s.json for s in schemas],
                "topic": [topic] * len(schemas),
                "first_seen_at": pa.array([now] * len(schemas), pa.timestamp("us", tz="UTC")),
            },
            schema=SCHEMA_REGISTRY_SCHEMA,
        ),
    )


def land(
    engine: LocalEngine, obj: ObjectSpec, events: list[tuple[str, bytes]], batch_id: int
) -> int:
    """One bronze landing commit (txn = batch id, as landing does); returns its version."""
    table = bronze_batch(events, batch_id=batch_id, topic=obj.topic)
    result = engine.append(
        TableRef("bronze", obj.tables.bronze), table, txn=Txn(bronze_app_id(obj.topic), batch_id)
    )
    assert result.version is not None
    return result.version


def silver(engine: LocalEngine, obj: ObjectSpec) -> list[dict[str, Any]]:
    rows = engine.read(TableRef("silver", obj.tables.silver)).collect()
    return sorted(
        (r.asDict(recursive=True) for r in rows),
        key=lambda r: (r["_cdc_bronze_batch_id"], r["_cdc_bronze_batch_seq"], r.get("Id") or ""),
    )


def quarantine(engine: LocalEngine) -> list[dict[str, Any]]:
    rows = engine.read(QUARANTINE_TABLE).collect()
    return sorted(
        (r.asDict() for r in rows), key=lambda r: (r["bronze_batch_id"], r["bronze_batch_seq"])
    )


def versions(engine: LocalEngine, *tables: TableRef) -> list[int | None]:
    return [engine.version(t) for t in tables]


ACCOUNT = ObjectSpec(api_name="Account", kind="change_events")
ACCOUNT_SILVER = TableRef("silver", "account")


def account_batch_0() -> list[tuple[str, bytes]]:
    s = ACCOUNT_V1
    sid = s.schema_id
    return [
        (sid, change_event(s, "CREATE", ["001A"], {"Name": "Acme", "SLA_Date__c": 20_089 * DAY})),
        (
            sid,
            change_event(
                s,
                "CREATE",
                ["001B"],
                {"Name": {"FirstName": "Ada", "LastName": "Lovelace"}, "Open_At__c": 9 * 3_600_000},
            ),
        ),
        (
            sid,
            change_event(
                s,
                "UPDATE",
                ["001A"],
                {"BillingAddress": {"City": "Paris"}, "Phone": "+33 1", "LastModifiedDate": 1},
                changed=["BillingAddress.City", "Phone", "Description", "LastModifiedDate"],
                nulled=["Description"],
                sequence=2,
            ),
        ),
        (sid, change_event(s, "DELETE", ["001C", "001D", "001E"])),
        (sid, change_event(s, "UPDATE", ["001*"], changed=["IsActive__c"], nulled=["IsActive__c"])),
        (sid, change_event(s, "GAP_OVERFLOW", [])),
        (sid, change_event(s, "UNDELETE", ["001C"], {"Name": "Back"})),
        (sid, change_event(s, "GAP_UPDATE", ["001A"])),
        (sid, change_event(s, "CREATE", ["001F"])[:-4]),  # truncated
        ("not-registered", change_event(s, "CREATE", ["001G"])),
        (CONTACT.schema_id, change_event(CONTACT, "CREATE", ["003A"], {"LastName": "X"})),
    ]


def test_single_topic_end_to_end_incremental_and_idempotent(engine: LocalEngine) -> None:
    register(engine, ACCOUNT_V1, CONTACT)
    land(engine, ACCOUNT, account_batch_0(), batch_id=0)
    conf = conf_of(ACCOUNT)

    result = run_silver(engine, conf)
    (topic,) = result.topics
    (account,) = topic.objects
    assert (topic.bronze_rows, topic.quarantined, account.events, account.rows) == (11, 3, 9, 10)
    assert (account.after_version, account.bronze_version, account.commits) == (None, 0, 1)

    rows = silver(engine, ACCOUNT)
    assert [(r["Id"], r["_cdc_change_type"]) for r in rows] == [
        ("001A", "CREATE"),
        ("001B", "CREATE"),
        ("001A", "UPDATE"),
        ("001C", "DELETE"),
        ("001D", "DELETE"),
        ("001E", "DELETE"),
        ("001*", "UPDATE"),
        (None, "GAP_OVERFLOW"),
        ("001C", "UNDELETE"),
        ("001A", "GAP_UPDATE"),
    ]
    first, person, update = rows[0], rows[1], rows[2]
    assert (first["Name"], first["Name_PersonName"], first["SLA_Date__c"]) == (
        "Acme",
        None,
        date(2025, 1, 1),
    )
    assert person["Name"] is None and person["Name_PersonName"]["LastName"] == "Lovelace"
    assert person["Open_At__c"] == "09:00:00.000"
    assert update["BillingAddress"]["City"] == "Paris" and update["Phone"] == "+33 1"
    assert update["_cdc_changed_fields"] == [
        "BillingAddress.City",
        "Phone",
        "Description",
        "LastModifiedDate",
    ]
    assert update["_cdc_nulled_fields"] == ["Description"]
    assert update["_cdc_commit_timestamp"] == datetime(2025, 1, 1)
    assert update["_cdc_commit_number"] == 1_709_303_151_782_928_388
    assert update["_cdc_sequence_number"] == 2
    assert [r["_cdc_record_count"] for r in rows[3:6]] == [3, 3, 3]
    assert rows[6]["_cdc_is_wildcard"] and not any(r["_cdc_is_wildcard"] for r in rows[:6])
    assert rows[7]["_cdc_record_count"] == 0

    bad = quarantine(engine)
    assert [(r["bronze_batch_seq"], r["reason_kind"]) for r in bad] == [
        (8, "corrupt_payload"),
        (9, "unknown_schema"),
        (10, "wrong_entity"),
    ]
    batch = bronze_batch(account_batch_0())
    for row in bad:
        seq = row["bronze_batch_seq"]
        assert row["payload"] == batch.column("payload")[seq].as_py()
        assert row["replay_id"] == batch.column("replay_id")[seq].as_py()
        assert row["event_id"] == f"evt-0-{seq}"
        assert (row["bronze_table"], row["topic"]) == ("account_change_event", ACCOUNT_TOPIC)
    assert "truncated" in bad[0]["reason"] and "not-registered" in bad[1]["reason"]
    assert "Contact schema" in bad[2]["reason"]

    assert engine.txn_version(ACCOUNT_SILVER, "sfcdc.silver:Account") == 0
    entry = engine.history(ACCOUNT_SILVER, limit=1)[0]
    assert entry.metadata["sfcdc.silver.bronze_versions"] == "0-0"
    assert entry.metadata["sfcdc.silver.bronze_max_batch_id"] == "0"

    # Running again on the same bronze changes nothing: no new version, same rows.
    before = versions(engine, ACCOUNT_SILVER, QUARANTINE_TABLE)
    again = run_silver(engine, conf)
    assert versions(engine, ACCOUNT_SILVER, QUARANTINE_TABLE) == before
    assert again.objects[0].up_to_date and again.rows == 0 and again.quarantined == 0
    assert silver(engine, ACCOUNT) == rows and quarantine(engine) == bad

    # A schema change mid-stream: v2 inserts Tier__c before Phone (every later bitmap position
    # moves) and adds ShippingAddress. The registry gets v2 before the events that use it.
    register(engine, ACCOUNT_V2)
    v1, v2 = ACCOUNT_V1, ACCOUNT_V2
    land(
        engine,
        ACCOUNT,
        [
            (v1.schema_id, change_event(v1, "UPDATE", ["001A"], {"Phone": "1"}, changed=["Phone"])),
            (
                v2.schema_id,
                change_event(
                    v2,
                    "UPDATE",
                    ["001A"],
                    {"Tier__c": "Gold", "ShippingAddress": {"City": "Lyon"}},
                    changed=["Tier__c", "ShippingAddress.City"],
                ),
            ),
        ],
        batch_id=1,
    )
    result = run_silver(engine, conf)
    assert result.objects[0].after_version == 0 and result.objects[0].bronze_version == 1
    rows = silver(engine, ACCOUNT)
    assert len(rows) == 12
    old, new = rows[-2], rows[-1]
    assert (old["Phone"], old["Tier__c"], old["_cdc_changed_fields"]) == ("1", None, ["Phone"])
    assert (new["Tier__c"], new["Phone"]) == ("Gold", None)
    assert new["_cdc_changed_fields"] == ["Tier__c", "ShippingAddress.City"]
    assert new["ShippingAddress"]["City"] == "Lyon"
    assert all(r["Tier__c"] is None for r in rows[:-1])
    assert engine.schema(ACCOUNT_SILVER).names[-2:] == ["Tier__c", "ShippingAddress"]  # type: ignore[union-attr]
    assert len(quarantine(engine)) == 3


def test_channel_objects_are_decoded_once_and_catch_up(engine: LocalEngine) -> None:
    account = ObjectSpec(api_name="Account", kind="change_events", topic=CHANNEL)
    contact = ObjectSpec(
        api_name="Contact",
        kind="change_events",
        topic=CHANNEL,
        silver=SilverSpec(compound_fields="flattened"),
    )
    register(engine, ACCOUNT_V1, CONTACT, OPPORTUNITY, topic=CHANNEL)
    a, c, o = ACCOUNT_V1, CONTACT, OPPORTUNITY

    def batch(n: int) -> list[tuple[str, bytes]]:
        return [
            (a.schema_id, change_event(a, "CREATE", [f"001{n}"], {"Name": f"A{n}"})),
            (c.schema_id, change_event(c, "CREATE", [f"003{n}"], {"Birthdate": -DAY})),
            (o.schema_id, change_event(o, "CREATE", [f"006{n}"], {"StageName": "New"})),
            (a.schema_id, b"\x02\x03"),
        ]

    land(engine, account, batch(0), batch_id=0)
    conf = conf_of(account, contact)
    first = run_silver(engine, conf, objects=["Account"])
    assert [o.object for o in first.objects] == ["Account"]
    assert first.topics[0].other_entities == {"Contact": 1, "Opportunity": 1}
    assert not engine.exists(TableRef("silver", "contact"))

    land(engine, account, batch(1), batch_id=1)
    second = run_silver(engine, conf)
    # Contact starts from the beginning, Account from version 0: two groups.
    by_object = {o.object: o for o in second.objects}
    assert (by_object["Contact"].after_version, by_object["Contact"].bronze_version) == (None, 1)
    assert (by_object["Account"].after_version, by_object["Account"].bronze_version) == (0, 1)
    assert by_object["Contact"].events == 2 and by_object["Account"].events == 2

    assert [r["Id"] for r in silver(engine, account)] == ["0010", "0011"]
    contacts = silver(engine, contact)
    assert [r["Id"] for r in contacts] == ["0030", "0031"]
    assert contacts[0]["Birthdate"] == date(1969, 12, 31)
    # Each undecodable row is quarantined once, whichever group read it.
    coordinates = Counter((r["bronze_batch_id"], r["bronze_batch_seq"]) for r in quarantine(engine))
    assert coordinates == {(0, 3): 1, (1, 3): 1}
    assert {r["entity"] for r in quarantine(engine)} == {"Account"}


def test_platform_events(engine: LocalEngine) -> None:
    obj = ObjectSpec(api_name="Order_Shipped__e", kind="platform_event")
    s = ORDER_SHIPPED
    register(engine, s, topic=obj.topic)
    land(
        engine,
        obj,
        [
            (
                s.schema_id,
                encode(
                    s,
                    {
                        "CreatedDate": 1_735_689_600_250,
                        "CreatedById": "005A",
                        "Weight__c": 2.5,
                        "Delivery_Date__c": 20_090 * DAY,
                    },
                ),
            )
        ],
        batch_id=0,
    )
    result = run_silver(engine, conf_of(obj))
    assert result.rows == 1
    (row,) = silver(engine, obj)
    assert row["CreatedDate"] == datetime(2025, 1, 1, 0, 0, 0, 250_000)
    assert (row["CreatedById"], row["Weight__c"], row["Delivery_Date__c"]) == (
        "005A",
        2.5,
        date(2025, 1, 2),
    )
    assert row["_cdc_event_id"] == "evt-0-0" and row["_cdc_schema_id"] == s.schema_id
    assert "Id" not in row and "_cdc_change_type" not in row


def test_a_backlog_is_committed_in_bounded_steps(engine: LocalEngine) -> None:
    obj = ObjectSpec(
        api_name="Account", kind="change_events", silver=SilverSpec(max_rows_per_commit=2)
    )
    register(engine, ACCOUNT_V1)
    s = ACCOUNT_V1
    for b in range(3):
        land(
            engine,
            obj,
            [(s.schema_id, change_event(s, "CREATE", [f"001{b}{i}"])) for i in range(2)],
            batch_id=b,
        )
    result = run_silver(engine, conf_of(obj))
    assert result.objects[0].commits == 3 and result.rows == 6
    history = engine.history(ACCOUNT_SILVER, limit=3)
    assert [h.txn.version if h.txn else None for h in history] == [2, 1, 0]
    assert [h.metadata["sfcdc.silver.bronze_versions"] for h in history] == ["2-2", "1-1", "0-0"]


def test_quarantine_first_survives_a_failed_silver_write(engine: LocalEngine) -> None:
    register(engine, ACCOUNT_V1)
    s = ACCOUNT_V1
    land(
        engine,
        ACCOUNT,
        [(s.schema_id, change_event(s, "CREATE", ["001A"])), (s.schema_id, b"\x09")],
        0,
    )
    # A silver table that refuses the rows (a NOT NULL column they lack): its write fails
    # after the quarantine's.
    engine.ensure_table(
        ACCOUNT_SILVER, T.StructType([T.StructField("Blocker", T.IntegerType(), False)])
    )
    with pytest.raises(LakeError, match="'Blocker' is NOT NULL"):
        run_silver(engine, conf_of(ACCOUNT))
    assert len(quarantine(engine)) == 1
    assert engine.txn_version(QUARANTINE_TABLE, "sfcdc.silver.quarantine:Account") == 0

    # More bronze arrives; the retry reads both versions at once, so its range ends elsewhere
    # than the quarantine's: rows already quarantined are not added again.
    land(
        engine,
        ACCOUNT,
        [(s.schema_id, b"\x0b"), (s.schema_id, change_event(s, "CREATE", ["001B"]))],
        1,
    )
    shutil.rmtree(engine.path(ACCOUNT_SILVER))
    engine = LocalEngine(engine.spark, location=engine.location)  # a new run, a new process
    result = run_silver(engine, conf_of(ACCOUNT))
    assert result.rows == 2
    assert [(r["bronze_batch_id"], r["bronze_batch_seq"]) for r in quarantine(engine)] == [
        (0, 1),
        (1, 0),
    ]


def test_a_field_changing_type_asks_for_a_rebuild(engine: LocalEngine) -> None:
    head = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}
    v1 = change_schema("Widget__c", [head, opt("Flag__c", "boolean", "Data:Boolean")])
    v2 = change_schema("Widget__c", [head, opt("Flag__c", "string", "Data:DynamicEnum")])
    obj = ObjectSpec(api_name="Widget__c", kind="change_events")
    register(engine, v1, topic=obj.topic)
    land(engine, obj, [(v1.schema_id, change_event(v1, "CREATE", ["a01A"], {"Flag__c": True}))], 0)
    run_silver(engine, conf_of(obj))
    register(engine, v2, topic=obj.topic)
    land(engine, obj, [(v2.schema_id, change_event(v2, "CREATE", ["a01B"], {"Flag__c": "No"}))], 1)
    with pytest.raises(LakeError, match=r"column 'Flag__c' is boolean .* now make it string"):
        run_silver(engine, conf_of(obj))
    # Rebuilt from bronze, the column holds both versions' values as text.
    engine.path(TableRef("silver", "widget")).rename(engine.location / "old_widget")
    engine = LocalEngine(engine.spark, location=engine.location)  # a new run, a new process
    run_silver(engine, conf_of(obj))
    assert [r["Flag__c"] for r in silver(engine, obj)] == ["true", "No"]


def test_nothing_to_do_without_bronze(engine: LocalEngine) -> None:
    result = run_silver(engine, conf_of(ACCOUNT))
    assert isinstance(result, SilverResult) and result.topics == ()
    assert json.dumps(result.rows) == "0"


class CachingEngine(LocalEngine):
    """Local Delta tables, but announced as the spark engine: silver then takes that engine's
    path (the pass cached, its silver and quarantine parts written as DataFrames)."""

    name = "spark"  # type: ignore[assignment]


def _outcome(engine: LocalEngine, result: Any) -> tuple[Any, ...]:
    """What a silver run left: its counts, the silver rows and the quarantine rows (without
    their timestamps), for comparing two engines' runs."""
    return (
        result.rows,
        result.quarantined,
        silver(engine, ACCOUNT),
        [{k: v for k, v in r.items() if k != "quarantined_at"} for r in quarantine(engine)],
    )


def test_the_dataframe_path_writes_what_the_arrow_path_writes(
    spark: SparkSession, tmp_path: Path
) -> None:
    s = ACCOUNT_V1
    events = [
        (s.schema_id, change_event(s, "CREATE", ["001A", "001B"], {"Name": "Acme"})),
        (s.schema_id, b"\x01\x02"),
        ("nope", change_event(s, "CREATE", ["001C"])),
    ]
    outcomes = []
    for kind, location in (("arrow", tmp_path / "a"), ("dataframe", tmp_path / "b")):
        engine = (LocalEngine if kind == "arrow" else CachingEngine)(spark, location=location)
        register(engine, s)
        land(engine, ACCOUNT, events, batch_id=1)
        result = run_silver(engine, conf_of(ACCOUNT))
        outcomes.append(_outcome(engine, result))
    assert outcomes[0] == outcomes[1]
    rows, quarantined, silver_rows, bad = outcomes[0]
    assert (rows, quarantined, len(silver_rows), len(bad)) == (2, 2, 2, 2)


def test_a_recreated_bronze_table_is_refused(engine: LocalEngine) -> None:
    s = ACCOUNT_V1
    register(engine, s)
    for b in (1, 2):
        land(engine, ACCOUNT, [(s.schema_id, change_event(s, "CREATE", [f"001{b}"]))], b)
    run_silver(engine, conf_of(ACCOUNT))
    shutil.rmtree(engine.path(TableRef("bronze", ACCOUNT.tables.bronze)))
    engine = LocalEngine(engine.spark, location=engine.location)
    land(engine, ACCOUNT, [(s.schema_id, change_event(s, "CREATE", ["001X"]))], 1)
    with pytest.raises(LakeError, match=r"processed bronze\.account_change_event up to version 1"):
        run_silver(engine, conf_of(ACCOUNT))


def test_bronze_files_read_by_the_tasks_give_what_the_spark_scan_gives(
    spark: SparkSession,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Steps this small are decoded in the driver; this test is about the Spark job's input.
    monkeypatch.setattr(small, "SMALL_BATCH_ROWS", -1)
    v1, v2 = ACCOUNT_V1, ACCOUNT_V2
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
    outcomes = []
    for kind, location in (("arrow", tmp_path / "a"), ("dataframe", tmp_path / "b")):
        engine = (LocalEngine if kind == "arrow" else CachingEngine)(spark, location=location)
        register(engine, v1, v2)
        for batch_id, events in enumerate(landings, start=1):
            land(engine, ACCOUNT, events, batch_id=batch_id)
        with caplog.at_level(logging.DEBUG, logger="pipelines.silver.job"):
            caplog.clear()
            result = run_silver(engine, conf_of(ACCOUNT))
        read_by_tasks = "the tasks read 3 bronze files themselves" in caplog.text
        assert read_by_tasks == (kind == "arrow")
        outcomes.append(_outcome(engine, result))
    assert outcomes[0] == outcomes[1]
    rows, quarantined, silver_rows, bad = outcomes[0]
    assert (rows, quarantined, len(silver_rows), len(bad)) == (4, 2, 4, 2)
