"""The silver job on real Delta tables: bronze-shaped tables written through the engine, the
schema registry, incremental and idempotent runs, channels, backlogs, failures."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from datetime import date, datetime
from pathlib import Path

import pytest
from pyspark.sql import types as T

from ingest.errors import LakeError
from pipelines.engines import LakeEngine, TableRef
from pipelines.silver.job import QUARANTINE_TABLE, SilverResult, run_silver
from pipelines.spec import ObjectSpec, SilverSpec
from tests.conftest import EngineFactory
from tests.spark.silver.lake import (
    ACCOUNT,
    ACCOUNT_SILVER,
    ACCOUNT_TOPIC,
    CHANNEL,
    DAY,
    OPPORTUNITY,
    UTC,
    account_batch_0,
    conf_of,
    land,
    quarantine,
    register,
    silver,
    table_dir,
    versions,
)
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


def test_single_topic_end_to_end_incremental_and_idempotent(engine: LakeEngine) -> None:
    register(engine, ACCOUNT_V1, CONTACT)
    # Bronze versions are the landing commits' (the local engine creates a table in a commit
    # of its own, so the first landing's version is engine-dependent).
    v0 = land(engine, ACCOUNT, account_batch_0(), batch_id=0)
    conf = conf_of(ACCOUNT)

    result = run_silver(engine, conf)
    (topic,) = result.topics
    (account,) = topic.objects
    assert (topic.bronze_rows, topic.quarantined, account.events, account.rows) == (11, 3, 9, 10)
    assert (account.after_version, account.bronze_version, account.commits) == (None, v0, 1)

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
    assert update["_cdc_commit_timestamp"] == datetime(2025, 1, 1, tzinfo=UTC)
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

    assert engine.txn_version(ACCOUNT_SILVER, "sfcdc.silver:Account") == v0
    entry = engine.history(ACCOUNT_SILVER, limit=1)[0]
    assert entry.metadata["sfcdc.silver.bronze_versions"] == f"0-{v0}"
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
    after_v2 = land(
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
    assert result.objects[0].after_version == v0 and result.objects[0].bronze_version == after_v2
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


def test_channel_objects_are_decoded_once_and_catch_up(engine: LakeEngine) -> None:
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

    v0 = land(engine, account, batch(0), batch_id=0)
    conf = conf_of(account, contact)
    first = run_silver(engine, conf, objects=["Account"])
    assert [o.object for o in first.objects] == ["Account"]
    assert first.topics[0].other_entities == {"Contact": 1, "Opportunity": 1}
    assert not engine.exists(TableRef("silver", "contact"))

    v1 = land(engine, account, batch(1), batch_id=1)
    second = run_silver(engine, conf)
    # Contact starts from the beginning, Account after the first landing: two groups.
    by_object = {o.object: o for o in second.objects}
    assert (by_object["Contact"].after_version, by_object["Contact"].bronze_version) == (None, v1)
    assert (by_object["Account"].after_version, by_object["Account"].bronze_version) == (v0, v1)
    assert by_object["Contact"].events == 2 and by_object["Account"].events == 2

    assert [r["Id"] for r in silver(engine, account)] == ["0010", "0011"]
    contacts = silver(engine, contact)
    assert [r["Id"] for r in contacts] == ["0030", "0031"]
    assert contacts[0]["Birthdate"] == date(1969, 12, 31)
    # Each undecodable row is quarantined once, whichever group read it.
    coordinates = Counter((r["bronze_batch_id"], r["bronze_batch_seq"]) for r in quarantine(engine))
    assert coordinates == {(0, 3): 1, (1, 3): 1}
    assert {r["entity"] for r in quarantine(engine)} == {"Account"}


def test_platform_events(engine: LakeEngine) -> None:
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
    assert row["CreatedDate"] == datetime(2025, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)
    assert (row["CreatedById"], row["Weight__c"], row["Delivery_Date__c"]) == (
        "005A",
        2.5,
        date(2025, 1, 2),
    )
    assert row["_cdc_event_id"] == "evt-0-0" and row["_cdc_schema_id"] == s.schema_id
    assert "Id" not in row and "_cdc_change_type" not in row


def test_a_backlog_is_committed_in_bounded_steps(engine: LakeEngine) -> None:
    obj = ObjectSpec(
        api_name="Account", kind="change_events", silver=SilverSpec(max_rows_per_commit=2)
    )
    register(engine, ACCOUNT_V1)
    s = ACCOUNT_V1
    landed = [
        land(
            engine,
            obj,
            [(s.schema_id, change_event(s, "CREATE", [f"001{b}{i}"])) for i in range(2)],
            batch_id=b,
        )
        for b in range(3)
    ]
    result = run_silver(engine, conf_of(obj))
    assert result.objects[0].commits == 3 and result.rows == 6
    history = engine.history(ACCOUNT_SILVER, limit=3)
    # One step per landing commit, the first from the table's first version.
    assert [h.txn.version if h.txn else None for h in history] == landed[::-1]
    assert [h.metadata["sfcdc.silver.bronze_versions"] for h in history] == [
        f"{landed[2]}-{landed[2]}",
        f"{landed[1]}-{landed[1]}",
        f"0-{landed[0]}",
    ]


def test_quarantine_first_survives_a_failed_silver_write(
    engine: LakeEngine, make_engine: EngineFactory, lake: Path
) -> None:
    register(engine, ACCOUNT_V1)
    s = ACCOUNT_V1
    v0 = land(
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
    # Each engine words the refusal its own way; both name the column and why.
    with pytest.raises(LakeError, match=r"(?i)column '?Blocker'?.*NOT NULL.*missing from the data"):
        run_silver(engine, conf_of(ACCOUNT))
    assert len(quarantine(engine)) == 1
    assert engine.txn_version(QUARANTINE_TABLE, "sfcdc.silver.quarantine:Account") == v0

    # More bronze arrives; the retry reads both versions at once, so its range ends elsewhere
    # than the quarantine's: rows already quarantined are not added again.
    land(
        engine,
        ACCOUNT,
        [(s.schema_id, b"\x0b"), (s.schema_id, change_event(s, "CREATE", ["001B"]))],
        1,
    )
    shutil.rmtree(table_dir(lake, ACCOUNT_SILVER))
    engine = make_engine(lake)  # a new run, a new process
    result = run_silver(engine, conf_of(ACCOUNT))
    assert result.rows == 2
    assert [(r["bronze_batch_id"], r["bronze_batch_seq"]) for r in quarantine(engine)] == [
        (0, 1),
        (1, 0),
    ]


def test_a_field_changing_type_asks_for_a_rebuild(
    engine: LakeEngine, make_engine: EngineFactory, lake: Path
) -> None:
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
    table_dir(lake, TableRef("silver", "widget")).rename(lake / "old_widget")
    engine = make_engine(lake)  # a new run, a new process
    run_silver(engine, conf_of(obj))
    assert [r["Flag__c"] for r in silver(engine, obj)] == ["true", "No"]


def test_nothing_to_do_without_bronze(engine: LakeEngine) -> None:
    result = run_silver(engine, conf_of(ACCOUNT))
    assert isinstance(result, SilverResult) and result.topics == ()
    assert json.dumps(result.rows) == "0"


def test_a_recreated_bronze_table_is_refused(
    engine: LakeEngine, make_engine: EngineFactory, lake: Path
) -> None:
    s = ACCOUNT_V1
    register(engine, s)
    for b in (1, 2):
        last = land(engine, ACCOUNT, [(s.schema_id, change_event(s, "CREATE", [f"001{b}"]))], b)
    run_silver(engine, conf_of(ACCOUNT))
    shutil.rmtree(table_dir(lake, TableRef("bronze", ACCOUNT.tables.bronze)))
    engine = make_engine(lake)  # a new run, a new process
    land(engine, ACCOUNT, [(s.schema_id, change_event(s, "CREATE", ["001X"]))], 1)
    processed = rf"processed bronze\.account_change_event up to version {last}"
    with pytest.raises(LakeError, match=processed):
        run_silver(engine, conf_of(ACCOUNT))


def test_silver_tables_are_compacted_every_n_versions(engine: LakeEngine) -> None:
    obj = ObjectSpec(
        api_name="Account", kind="change_events", silver=SilverSpec(max_rows_per_commit=2)
    )
    conf = conf_of(obj)
    conf = dataclasses.replace(
        conf,
        pipeline=dataclasses.replace(
            conf.pipeline,
            ingest=dataclasses.replace(conf.pipeline.ingest, maintain_every_commits=3),
        ),
    )
    register(engine, ACCOUNT_V1)
    s = ACCOUNT_V1
    for b in range(6):
        land(
            engine,
            obj,
            [(s.schema_id, change_event(s, "CREATE", [f"001{b}{i}"])) for i in range(2)],
            batch_id=b,
        )
    result = run_silver(engine, conf)
    assert result.objects[0].commits == 6 and result.rows == 12
    history = engine.history(ACCOUNT_SILVER, limit=20)
    optimized = [h.version for h in history if "OPTIMIZE" in h.operation.upper()]
    # Appends made versions 1..6 (0 created the table); versions 3 and 6 were followed by a
    # compaction (each its own version), and nothing was lost or repeated.
    assert len(optimized) == 2, [(h.version, h.operation) for h in history]
    ids = engine.read_arrow(ACCOUNT_SILVER, columns=["Id"]).column("Id").to_pylist()
    assert sorted(ids) == sorted(f"001{b}{i}" for b in range(6) for i in range(2))
    # Incremental runs after a compaction still find their place.
    assert run_silver(engine, conf).rows == 0
