"""DELETE and UNDELETE, soft and hard: values kept or row removed, tombstones remembering the
delete, late changes never resurrecting a record."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pyspark.sql import SparkSession

from pipelines.gold.fold import FOLD_GOLD, FOLD_TOMBSTONE, gold_changes, tombstone_changes
from tests.spark.gold.conftest import T0, Silver, fold, gold_of, plan
from tests.spark.gold.helpers import assert_rows

pytestmark = pytest.mark.spark

HARD = plan(deletes="hard")


def test_soft_delete_keeps_the_values(spark: SparkSession) -> None:
    silver = Silver()
    silver.create("001A", 0, Phone="555")
    silver.add("001A", "DELETE", 5)
    assert_rows(
        gold_of(spark, silver),
        ["Id", "Phone", "_cdc_is_deleted", "_cdc_deleted_at", "_cdc_last_change_type"],
        [("001A", "555", True, T0 + timedelta(seconds=5), "DELETE")],
    )


def test_undelete_restores_the_full_row(spark: SparkSession) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555", NumberOfEmployees=4)
    first.add("001A", "DELETE", 5)
    gold = gold_of(spark, first)
    batch = first.next_batch()
    batch.add("001A", "UNDELETE", 9, Name="Company 001A", Phone="555", NumberOfEmployees=None)
    assert_rows(
        gold_of(spark, batch, gold=gold),
        ["Id", "Phone", "NumberOfEmployees", "_cdc_is_deleted", "_cdc_deleted_at"],
        [("001A", "555", None, False, None)],
    )


def test_update_after_a_delete_does_not_resurrect(spark: SparkSession) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    first.create("001B", 0, Phone="555")
    first.add("001A", "DELETE", 5)
    first.add("001B", "DELETE", 5)
    gold = gold_of(spark, first)
    batch = first.next_batch()
    batch.update("001A", 3, Phone="late")  # older than the delete: ignored
    batch.update("001B", 8, Phone="newer")  # newer: applied, still deleted, flagged
    assert_rows(
        fold(spark, batch, gold=gold),
        ["Id", "Phone", "_cdc_is_deleted", "_cdc_needs_resync", "_cdc_resync_reason", FOLD_GOLD],
        [
            ("001A", "555", True, False, None, None),
            ("001B", "newer", True, True, "update_of_deleted", "upsert"),
        ],
    )


def test_hard_delete_removes_the_row_and_leaves_a_tombstone(spark: SparkSession) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    gold = gold_of(spark, first, the_plan=HARD)
    batch = first.next_batch()
    batch.add("001A", "DELETE", 5)
    batch.create("001N", 6)  # created and deleted in the same batch: never reaches gold
    batch.add("001N", "DELETE", 7)
    folded = fold(spark, batch, gold=gold, the_plan=HARD)
    assert_rows(
        folded,
        ["Id", "_cdc_is_deleted", FOLD_GOLD, FOLD_TOMBSTONE],
        [("001A", True, "delete", "upsert"), ("001N", True, None, "upsert")],
    )
    assert_rows(
        tombstone_changes(folded),
        ["Id", "_cdc_is_deleted", "_cdc_deleted_at", "_cdc_last_change_type"],
        [
            ("001A", True, T0 + timedelta(seconds=5), "DELETE"),
            ("001N", True, T0 + timedelta(seconds=7), "DELETE"),
        ],
    )


def test_a_tombstone_keeps_late_changes_out(spark: SparkSession) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    first.add("001A", "DELETE", 5)
    tombstones = tombstone_changes(fold(spark, first, the_plan=HARD)).localCheckpoint()
    batch = first.next_batch()
    batch.update("001A", 3, Phone="late")
    batch.add("001A", "UPDATE", 4, changed=["Phone"], Phone="late too")
    folded = fold(spark, batch, tombstones=tombstones, the_plan=HARD)
    assert gold_changes(folded).count() == 0
    assert tombstone_changes(folded).count() == 0


def test_hard_undelete_brings_the_row_back_and_drops_the_tombstone(spark: SparkSession) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555")
    first.add("001A", "DELETE", 5)
    tombstones = tombstone_changes(fold(spark, first, the_plan=HARD)).localCheckpoint()
    batch = first.next_batch()
    batch.add("001A", "UNDELETE", 9, Name="Company 001A", Phone="555")
    folded = fold(spark, batch, tombstones=tombstones, the_plan=HARD)
    assert_rows(
        folded,
        ["Id", "Phone", "_cdc_is_deleted", FOLD_GOLD, FOLD_TOMBSTONE],
        [("001A", "555", False, "upsert", "delete")],
    )


def test_a_tombstone_newer_than_the_gold_row_wins(spark: SparkSession) -> None:
    # A run that committed the tombstone but died before the gold MERGE: the re-run deletes
    # the gold row even though the DELETE event itself is now "already applied".
    first = Silver()
    first.create("001A", 0, Phone="555")
    gold = gold_of(spark, first, the_plan=HARD)
    batch = first.next_batch()
    batch.add("001A", "DELETE", 5)
    tombstones = tombstone_changes(fold(spark, batch, gold=gold, the_plan=HARD)).localCheckpoint()
    rerun = fold(spark, batch, gold=gold, tombstones=tombstones, the_plan=HARD)
    assert_rows(rerun, ["Id", FOLD_GOLD, FOLD_TOMBSTONE], [("001A", "delete", None)])


def test_delete_of_a_record_gold_never_saw(spark: SparkSession) -> None:
    silver = Silver()
    silver.add("001A", "DELETE", 5)
    assert_rows(
        fold(spark, silver),
        ["Id", "Phone", "_cdc_is_deleted", "_cdc_needs_resync", "_cdc_resync_reason", FOLD_GOLD],
        [("001A", None, True, True, "missing_base", "upsert")],
    )
    assert_rows(
        fold(spark, silver, the_plan=HARD),
        ["Id", "_cdc_is_deleted", "_cdc_needs_resync", FOLD_GOLD, FOLD_TOMBSTONE],
        [("001A", True, False, None, "upsert")],
    )
