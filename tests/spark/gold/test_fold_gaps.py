"""Gap events, overflow, wildcard record ids and unsupported change types."""

from __future__ import annotations

from datetime import timedelta

from pipelines.engines import LakeEngine
from pipelines.gold.plan import FOLD_GOLD, FOLD_RESOLVED_BY
from tests.spark.gold.conftest import (
    RUN_AT,
    T0,
    Silver,
    fold,
    gold_changes,
    gold_of,
    resync_entries,
)
from tests.spark.gold.helpers import assert_rows


def test_gap_events_flag_records_and_list_them(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001U", 0, Phone="555")
    first.create("001D", 0, Phone="555")
    first.create("001R", 0, Phone="555")
    first.add("001R", "DELETE", 1)
    gold = gold_of(engine, first)
    batch = first.next_batch()
    created = batch.add("001C", "GAP_CREATE", 5)
    batch.add("001U", "GAP_UPDATE", 5)
    batch.add("001D", "GAP_DELETE", 5)
    batch.add("001R", "GAP_UNDELETE", 5)
    folded = fold(engine, batch, gold=gold)
    assert_rows(
        engine,
        folded,
        [
            "Id",
            "Phone",
            "_cdc_is_deleted",
            "_cdc_deleted_at",
            "_cdc_needs_resync",
            "_cdc_resync_reason",
        ],
        [
            ("001C", None, False, None, True, "gap"),  # a placeholder
            ("001U", "555", False, None, True, "gap"),  # values kept, unknown now
            ("001D", "555", True, T0 + timedelta(seconds=5), True, "gap"),
            ("001R", "555", False, None, True, "gap"),
        ],
    )
    assert_rows(
        engine,
        resync_entries(engine, folded),
        [
            "object",
            "record_id",
            "change_type",
            "reason",
            "commit_timestamp",
            "detected_at",
            "resolved_at",
        ],
        [
            ("Account", rid, change, "gap", T0 + timedelta(seconds=5), RUN_AT, None)
            for rid, change in [
                ("001C", "GAP_CREATE"),
                ("001U", "GAP_UPDATE"),
                ("001D", "GAP_DELETE"),
                ("001R", "GAP_UNDELETE"),
            ]
        ],
    )
    entries = engine.to_arrow(resync_entries(engine, folded)).to_pylist()
    (row,) = [r for r in entries if r["record_id"] == "001C"]
    assert (row["event_id"], row["replay_id"]) == (
        created["_cdc_event_id"],
        created["_cdc_replay_id"],
    )


def test_a_full_image_after_a_gap_clears_the_flag(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    first.add("001A", "GAP_DELETE", 1)
    gold = gold_of(engine, first)
    batch = first.next_batch()
    batch.add("001B", "GAP_UPDATE", 2)
    batch.create("001B", 3, Phone="new")  # in the same batch: its re-sync row comes resolved
    undelete = batch.add("001A", "UNDELETE", 4, Name="Company 001A", Phone="restored")
    folded = fold(engine, batch, gold=gold)
    assert_rows(
        engine,
        folded,
        [
            "Id",
            "Phone",
            "_cdc_is_deleted",
            "_cdc_needs_resync",
            "_cdc_resync_reason",
            FOLD_RESOLVED_BY,
        ],
        [
            ("001A", "restored", False, False, None, undelete["_cdc_event_id"]),
            ("001B", "new", False, False, None, None),
        ],
    )
    assert_rows(
        engine,
        resync_entries(engine, folded),
        ["record_id", "reason", "resolved_at"],
        [("001B", "gap", RUN_AT)],
    )


def test_overflow_asks_for_a_whole_object_resync(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0)
    silver.add(None, "GAP_OVERFLOW", 5, record_count=0)
    folded = fold(engine, silver)
    assert_rows(
        engine,
        resync_entries(engine, folded),
        ["object", "record_id", "change_type", "reason", "commit_timestamp"],
        [("Account", None, "GAP_OVERFLOW", "overflow", T0 + timedelta(seconds=5))],
    )
    assert_rows(
        engine, gold_changes(engine, folded), ["Id", "_cdc_needs_resync"], [("001A", False)]
    )


def test_wildcard_applies_to_every_record_existing_at_that_point(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001G", 0, Phone="gold, live", LastModifiedDate=T0)
    first.create("001D", 0, Phone="gold, deleted", LastModifiedDate=T0)
    first.add("001D", "DELETE", 1)
    first.create("001L", 0, Phone="gold, changed later", LastModifiedDate=T0)
    gold = gold_of(engine, first)
    batch = first.next_batch()
    batch.create("001E", 2, Phone="created before")
    batch.add(
        "001*", "UPDATE", 5, changed=["Phone"], nulled=["Phone"], wildcard=True, record_count=1
    )
    batch.create("001F", 6, Phone="created after")
    batch.update("001L", 7, Phone="set after")
    assert_rows(
        engine,
        gold_of(engine, batch, gold=gold),
        ["Id", "Phone", "LastModifiedDate", "_cdc_is_deleted", "_cdc_needs_resync"],
        [
            ("001G", None, T0, False, False),
            ("001D", None, T0, True, False),
            ("001L", "set after", T0, False, False),
            ("001E", None, None, False, False),
            ("001F", "created after", None, False, False),
        ],
    )


def test_unsupported_change_type_flags_the_record(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0, Phone="555")
    silver.add("001A", "SNAPSHOT", 1, Phone="ignored")
    assert_rows(
        engine,
        fold(engine, silver),
        ["Id", "Phone", "_cdc_needs_resync", "_cdc_resync_reason", FOLD_GOLD],
        [("001A", "555", True, "unsupported_change_type", "upsert")],
    )
