"""DELETE and UNDELETE, soft and hard: values kept or row removed, tombstones remembering the
delete, late changes never resurrecting a record."""

from __future__ import annotations

from datetime import timedelta

from pipelines.engines import LakeEngine
from pipelines.gold.plan import FOLD_GOLD, FOLD_TOMBSTONE
from tests.spark.gold.conftest import (
    T0,
    Silver,
    computed,
    fold,
    gold_changes,
    gold_of,
    plan,
    tombstone_changes,
)
from tests.spark.gold.helpers import assert_rows

HARD = plan(deletes="hard")


def test_soft_delete_keeps_the_values(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0, Phone="555")
    silver.add("001A", "DELETE", 5)
    assert_rows(
        engine,
        gold_of(engine, silver),
        ["Id", "Phone", "_cdc_is_deleted", "_cdc_deleted_at", "_cdc_last_change_type"],
        [("001A", "555", True, T0 + timedelta(seconds=5), "DELETE")],
    )


def test_undelete_restores_the_full_row(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555", NumberOfEmployees=4)
    first.add("001A", "DELETE", 5)
    gold = gold_of(engine, first)
    batch = first.next_batch()
    batch.add("001A", "UNDELETE", 9, Name="Company 001A", Phone="555", NumberOfEmployees=None)
    assert_rows(
        engine,
        gold_of(engine, batch, gold=gold),
        ["Id", "Phone", "NumberOfEmployees", "_cdc_is_deleted", "_cdc_deleted_at"],
        [("001A", "555", None, False, None)],
    )


def test_update_after_a_delete_does_not_resurrect(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    first.create("001B", 0, Phone="555")
    first.add("001A", "DELETE", 5)
    first.add("001B", "DELETE", 5)
    gold = gold_of(engine, first)
    batch = first.next_batch()
    batch.update("001A", 3, Phone="late")  # older than the delete: ignored
    batch.update("001B", 8, Phone="newer")  # newer: applied, still deleted, flagged
    assert_rows(
        engine,
        fold(engine, batch, gold=gold),
        ["Id", "Phone", "_cdc_is_deleted", "_cdc_needs_resync", "_cdc_resync_reason", FOLD_GOLD],
        [
            ("001A", "555", True, False, None, None),
            ("001B", "newer", True, True, "update_of_deleted", "upsert"),
        ],
    )


def test_hard_delete_removes_the_row_and_leaves_a_tombstone(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    gold = gold_of(engine, first, the_plan=HARD)
    batch = first.next_batch()
    batch.add("001A", "DELETE", 5)
    batch.create("001N", 6)  # created and deleted in the same batch: never reaches gold
    batch.add("001N", "DELETE", 7)
    folded = fold(engine, batch, gold=gold, the_plan=HARD)
    assert_rows(
        engine,
        folded,
        ["Id", "_cdc_is_deleted", FOLD_GOLD, FOLD_TOMBSTONE],
        [("001A", True, "delete", "upsert"), ("001N", True, None, "upsert")],
    )
    assert_rows(
        engine,
        tombstone_changes(engine, folded),
        ["Id", "_cdc_is_deleted", "_cdc_deleted_at", "_cdc_last_change_type"],
        [
            ("001A", True, T0 + timedelta(seconds=5), "DELETE"),
            ("001N", True, T0 + timedelta(seconds=7), "DELETE"),
        ],
    )


def test_a_tombstone_keeps_late_changes_out(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    first.add("001A", "DELETE", 5)
    tombstones = computed(engine, tombstone_changes(engine, fold(engine, first, the_plan=HARD)))
    batch = first.next_batch()
    batch.update("001A", 3, Phone="late")
    batch.add("001A", "UPDATE", 4, changed=["Phone"], Phone="late too")
    folded = fold(engine, batch, tombstones=tombstones, the_plan=HARD)
    assert engine.count(gold_changes(engine, folded)) == 0
    assert engine.count(tombstone_changes(engine, folded)) == 0


def test_hard_undelete_brings_the_row_back_and_drops_the_tombstone(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    first.add("001A", "DELETE", 5)
    tombstones = computed(engine, tombstone_changes(engine, fold(engine, first, the_plan=HARD)))
    batch = first.next_batch()
    batch.add("001A", "UNDELETE", 9, Name="Company 001A", Phone="555")
    folded = fold(engine, batch, tombstones=tombstones, the_plan=HARD)
    assert_rows(
        engine,
        folded,
        ["Id", "Phone", "_cdc_is_deleted", FOLD_GOLD, FOLD_TOMBSTONE],
        [("001A", "555", False, "upsert", "delete")],
    )


def test_a_tombstone_newer_than_the_gold_row_wins(engine: LakeEngine) -> None:
    # A run that committed the tombstone but died before the gold MERGE: the re-run deletes
    # the gold row even though the DELETE event itself is now "already applied".
    first = Silver()
    first.create("001A", 0, Phone="555")
    gold = gold_of(engine, first, the_plan=HARD)
    batch = first.next_batch()
    batch.add("001A", "DELETE", 5)
    tombstones = computed(
        engine, tombstone_changes(engine, fold(engine, batch, gold=gold, the_plan=HARD))
    )
    rerun = fold(engine, batch, gold=gold, tombstones=tombstones, the_plan=HARD)
    assert_rows(engine, rerun, ["Id", FOLD_GOLD, FOLD_TOMBSTONE], [("001A", "delete", None)])


def test_delete_of_a_record_gold_never_saw(engine: LakeEngine) -> None:
    silver = Silver()
    silver.add("001A", "DELETE", 5)
    assert_rows(
        engine,
        fold(engine, silver),
        ["Id", "Phone", "_cdc_is_deleted", "_cdc_needs_resync", "_cdc_resync_reason", FOLD_GOLD],
        [("001A", None, True, True, "missing_base", "upsert")],
    )
    assert_rows(
        engine,
        fold(engine, silver, the_plan=HARD),
        ["Id", "_cdc_is_deleted", "_cdc_needs_resync", FOLD_GOLD, FOLD_TOMBSTONE],
        [("001A", True, False, None, "upsert")],
    )
