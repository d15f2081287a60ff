"""The gold job on real Delta tables, on both lake engines: incremental reads of silver, the
MERGE with its txn, tombstones, SCD2 history, re-sync rows (and their resolution), replay
gaps, schema evolution, and ``sfcdc gold`` itself."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.errors import ConfigError
from pipelines.cli import main
from pipelines.engines import SparkEngine
from pipelines.gold.job import app_id, history_table, run_gold, tombstone_table
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.spec import Conf
from tests.lake_helpers import rows_of
from tests.spark.gold.conftest import T0, Silver, account_schema_json
from tests.spark.gold.helpers import assert_rows
from tests.spark.gold.lakes import (
    CHECKPOINTS,
    GOLD,
    NOW,
    RATING,
    SILVER,
    LakeFactory,
    make_conf,
    register,
)


def test_gold_applies_silver_incrementally_and_a_rerun_changes_nothing(lake: LakeFactory) -> None:
    env = lake()
    first = Silver()
    first.create(
        "001A",
        0,
        Phone="p0",
        BillingAddress={"Street": "1 Main", "City": "Lyon", "PostalCode": None, "Country": "FR"},
    )
    first.create("001B", 0, Phone="b0")
    first.update("001A", 5, Phone="p1")
    env.land(first)
    silver_version = env.engine.version(SILVER)
    (result,) = env.gold().objects
    assert (result.changes, result.records, result.applied, result.skipped) == (3, 2, 3, False)
    assert result.merge is not None and result.merge.inserted == 2
    assert env.engine.txn_version(GOLD, app_id(env.conf.objects[0])) == silver_version
    assert_rows(
        env.engine,
        env.read(),
        ["Id", "Phone", "BillingAddress", "_cdc_updated_at"],
        [("001A", "p1", ("1 Main", "Lyon", None, "FR"), NOW), ("001B", "b0", None, NOW)],
    )
    version = env.engine.version(GOLD)

    (again,) = env.gold().objects
    assert again.skipped and env.engine.version(GOLD) == version

    second = first.next_batch()
    second.add(
        "001A",
        "UPDATE",
        9,
        changed=["BillingAddress.City"],
        BillingAddress={"Street": None, "City": "Paris", "PostalCode": None, "Country": None},
    )
    second.add("001B", "DELETE", 9)
    second.update("001A", 3, Phone="late")  # older than what gold holds
    env.land(second)
    (result,) = env.gold().objects
    assert (result.changes, result.applied, result.ignored) == (3, 2, 1)
    assert result.merge is not None and (result.merge.inserted, result.merge.updated) == (0, 2)
    assert_rows(
        env.engine,
        env.read(),
        ["Id", "Phone", "BillingAddress", "_cdc_is_deleted", "_cdc_deleted_at"],
        [
            ("001A", "p1", ("1 Main", "Paris", None, "FR"), False, None),
            ("001B", "b0", None, True, T0 + timedelta(seconds=9)),
        ],
    )


def test_hard_deletes_leave_tombstones_that_keep_late_changes_out(lake: LakeFactory) -> None:
    env = lake(gold="gold: {deletes: hard}\n")
    first = Silver()
    first.create("001A", 0, Phone="p0")
    first.create("001B", 0, Phone="b0")
    first.add("001A", "DELETE", 5)
    env.land(first)
    env.gold()
    stones = tombstone_table(env.conf.objects[0])
    assert_rows(env.engine, env.read(), ["Id"], [("001B",)])
    assert_rows(env.engine, env.read(stones), ["Id", "_cdc_is_deleted"], [("001A", True)])

    late = first.next_batch()
    late.update("001A", 3, Phone="stale")  # before the delete: ignored
    env.land(late)
    env.gold()
    assert_rows(env.engine, env.read(), ["Id"], [("001B",)])

    back = late.next_batch()
    back.add("001A", "UNDELETE", 8, Name="Company 001A", Phone="restored")
    env.land(back)
    env.gold()
    assert_rows(env.engine, env.read(), ["Id", "Phone"], [("001A", "restored"), ("001B", "b0")])
    assert env.engine.count(env.read(stones)) == 0


def test_scd2_history_through_the_engine(lake: LakeFactory) -> None:
    env = lake(gold="gold: {scd2: {enabled: true, track: [Phone]}}\n")
    first = Silver()
    first.create("001A", 0, Phone="p0")
    first.update("001A", 1, NumberOfEmployees=50)  # untracked
    env.land(first)
    env.gold()
    second = first.next_batch()
    second.update("001A", 5, Phone="p1")
    env.land(second)
    env.gold()
    env.gold()  # nothing new: the history stays as it is
    history = env.read(history_table(env.conf.objects[0]))
    assert_rows(
        env.engine,
        history,
        ["Id", "Phone", "_scd_valid_from", "_scd_valid_to", "_scd_is_current", "_scd_change_type"],
        [
            ("001A", "p0", T0, T0 + timedelta(seconds=5), False, "CREATE"),
            ("001A", "p1", T0 + timedelta(seconds=5), None, True, "UPDATE"),
        ],
    )


def test_deletion_vectors_change_how_gold_is_written_not_what_it_holds(
    lake: LakeFactory, tmp_path: Path
) -> None:
    options = "deletes: hard, scd2: {enabled: true, track: [Phone]}"
    tables: dict[bool, list[list[tuple[object, ...]]]] = {}
    for vectors in (False, True):
        env = lake(
            gold=f"gold: {{deletion_vectors: {str(vectors).lower()}, {options}}}\n",
            root=tmp_path / str(vectors),
        )
        first = Silver()
        for rid in ("001A", "001B", "001C"):
            first.create(rid, 0, Phone=f"{rid}-0")
        env.land(first)
        env.gold()
        second = first.next_batch()
        second.update("001A", 5, Phone="001A-1")
        second.add("001B", "DELETE", 6)
        env.land(second)
        env.gold()
        history = history_table(env.conf.objects[0])
        tables[vectors] = [
            sorted(tuple(r[c] for c in ("Id", "Phone", *extra)) for r in rows_of(env.engine, table))
            for table, extra in ((GOLD, ()), (history, ("_scd_is_current",)))
        ]
        if vectors and isinstance(env.engine, SparkEngine):
            for table in (GOLD, history):
                assert env.engine.properties(table)["delta.enableDeletionVectors"] == "true"
            merge = next(h for h in env.engine.history(GOLD) if h.operation == "MERGE")
            assert int(merge.metrics["numTargetDeletionVectorsAdded"]) >= 1
    assert tables[True] == tables[False]
    assert tables[True][0] == [("001A", "001A-1"), ("001C", "001C-0")]


def test_gaps_are_listed_and_resolved_by_a_later_full_image(lake: LakeFactory) -> None:
    env = lake()
    first = Silver()
    first.create("001A", 0)
    gap = first.add("001A", "GAP_DELETE", 2)
    first.add(None, "GAP_OVERFLOW", 3, record_count=0)
    env.land(first)
    env.gold()
    assert_rows(
        env.engine,
        env.read(RESYNC_TABLE),
        ["object", "record_id", "change_type", "reason", "event_id", "resolved_at"],
        [
            ("Account", "001A", "GAP_DELETE", "gap", gap["_cdc_event_id"], None),
            ("Account", None, "GAP_OVERFLOW", "overflow", first.rows[-1]["_cdc_event_id"], None),
        ],
    )
    later = first.next_batch()
    undelete = later.add("001A", "UNDELETE", 7, Name="Company 001A", Phone="known again")
    env.land(later)
    resolved_at = NOW + timedelta(hours=1)
    env.gold(now=resolved_at)
    assert_rows(
        env.engine,
        env.read(RESYNC_TABLE),
        ["record_id", "reason", "resolved_at", "resolved_by"],
        [
            ("001A", "gap", resolved_at, undelete["_cdc_event_id"]),
            (None, "overflow", None, None),  # only a re-bootstrap resolves a whole object
        ],
    )
    assert_rows(
        env.engine,
        env.read(),
        ["Id", "Phone", "_cdc_needs_resync"],
        [("001A", "known again", False)],
    )


def test_replay_gaps_become_whole_object_resyncs_once(lake: LakeFactory) -> None:
    env = lake()
    silver = Silver()
    silver.create("001A", 0)
    env.land(silver)
    checkpoints = pa.Table.from_pylist(
        [
            {
                "topic": topic,
                "batch_id": batch_id,
                "kind": kind,
                "gap_requested": requested,
                "gap_resumed": resumed,
                "detail": detail,
                "committed_at": NOW,
            }
            for topic, batch_id, kind, requested, resumed, detail in [
                ("/data/AccountChangeEvent", 4, "replay_gap", "after:0a0b", "earliest", "expired"),
                ("/data/AccountChangeEvent", 3, "events", None, None, None),
                ("/data/ContactChangeEvent", 5, "replay_gap", "after:0c", "latest", None),
            ]
        ],
        schema=pa.schema(
            [
                ("topic", pa.string()),
                ("batch_id", pa.int64()),
                ("kind", pa.string()),
                ("gap_requested", pa.string()),
                ("gap_resumed", pa.string()),
                ("detail", pa.string()),
                ("committed_at", pa.timestamp("us", tz="UTC")),
            ]
        ),
    )
    env.engine.append(CHECKPOINTS, checkpoints)
    first = env.gold()
    assert first.replay_gaps == 1
    assert_rows(
        env.engine,
        env.read(RESYNC_TABLE),
        ["object", "record_id", "reason", "bronze_batch_id", "resolved_at"],
        [("Account", None, "replay_gap", 4, None)],
    )
    (row,) = rows_of(env.engine, RESYNC_TABLE)
    assert "after:0a0b" in row["detail"] and "earliest" in row["detail"]
    version = env.engine.version(RESYNC_TABLE)
    assert env.gold().replay_gaps == 0
    assert env.engine.version(RESYNC_TABLE) == version


def test_gold_follows_a_new_silver_column(lake: LakeFactory) -> None:
    env = lake()
    first = Silver()
    first.create("001A", 0, Phone="p0")
    env.land(first)
    env.gold()
    register(env.engine, account_schema_json(), account_schema_json(extra=[RATING]))
    from pipelines.silver.columns import FieldLayout

    second = Silver(extra=(FieldLayout("Rating__c", "leaf", "double"),), batch=2)
    second.update("001A", 4, Rating__c=4.5)
    env.land(second)
    env.gold()
    assert_rows(env.engine, env.read(), ["Id", "Phone", "Rating__c"], [("001A", "p0", 4.5)])


def test_changing_sequence_by_on_a_built_table_is_refused(
    lake: LakeFactory, tmp_path: Path
) -> None:
    env = lake()
    silver = Silver()
    silver.create("001A", 0)
    env.land(silver)
    env.gold()
    env.land(silver.next_batch())
    changed = make_conf(tmp_path / "changed", "gold: {sequence_by: [_cdc_commit_timestamp]}\n")
    changed = Conf(env.conf.pipeline, changed.objects, env.conf.conf_dir)
    with pytest.raises(ConfigError, match="was built with sequence_by"):
        run_gold(env.engine, changed)


def test_unknown_columns_in_the_gold_section_are_reported(
    lake: LakeFactory, tmp_path: Path
) -> None:
    env = lake(gold="gold: {sequence_by: [_cdc_commit_timestamp, Rank__c]}\n")
    silver = Silver()
    silver.create("001A", 0)
    env.land(silver)
    with pytest.raises(ConfigError, match=r"sequence_by names \['Rank__c'\]"):
        env.gold()
    env = lake("gold: {scd2: {enabled: true, track: [Rank__c]}}\n", root=tmp_path / "other")
    env.land(silver)
    with pytest.raises(ConfigError, match=r"scd2.track names \['Rank__c'\]"):
        env.gold()


def test_the_gold_command(lake: LakeFactory, capsys: pytest.CaptureFixture[str]) -> None:
    env = lake()
    silver = Silver()
    silver.create("001A", 0)
    silver.add("001B", "GAP_CREATE", 1)
    env.land(silver)
    conf_dir = str(env.conf.conf_dir)
    assert main(["-q", "gold", "--conf", conf_dir, "--objects", "Account"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Account: 2 changes of 2 records -> gold.account (2 inserted")
    assert out[1] == f"re-sync: 1 rows added or resolved in {RESYNC_TABLE}"
    assert main(["-q", "gold", "--conf", conf_dir]) == 0
    assert capsys.readouterr().out.startswith("Account: up to date")
    assert main(["-q", "gold", "--conf", conf_dir, "--objects", "Nope"]) == 2
    assert "no object 'Nope'" in capsys.readouterr().err


def test_a_field_a_later_schema_dropped_keeps_its_last_value_on_every_record(
    lake: LakeFactory,
) -> None:
    from ingest.schema import schema_id
    from pipelines.silver.columns import FieldLayout

    env = lake()
    old, new = account_schema_json(extra=[RATING]), account_schema_json()  # new drops Rating__c
    register(env.engine, old, new)
    rating = (FieldLayout("Rating__c", "leaf", "double"),)
    first = Silver(extra=rating)
    for record, value in (("001A", 4.0), ("001B", 4.5)):
        first.create(record, 0, Rating__c=value)["_cdc_schema_id"] = schema_id(old)
    env.land(first)
    env.gold()

    second = Silver(extra=rating, batch=2)
    second.add("001A", "DELETE", 5)["_cdc_schema_id"] = schema_id(new)
    undelete = second.add("001A", "UNDELETE", 6, Name="Company 001A", Phone="p2")
    undelete["_cdc_schema_id"] = schema_id(new)  # a full image without Rating__c
    created = second.create("001C", 7, Phone="c0")
    created["_cdc_schema_id"] = schema_id(new)
    env.land(second)
    env.gold()
    # Every record keeps the last value it had; a record first seen after the drop has none.
    assert_rows(
        env.engine,
        env.read(),
        ["Id", "Phone", "Rating__c", "_cdc_is_deleted"],
        [
            ("001A", "p2", 4.0, False),
            ("001B", "555-0100", 4.5, False),
            ("001C", "c0", None, False),
        ],
    )
