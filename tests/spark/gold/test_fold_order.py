"""Order of changes: commit order whatever the delivery order; late, replayed and duplicated
events are ignored; several changes of a record in one batch fold into one row."""

from __future__ import annotations

from datetime import timedelta

from ingest.emulator.textdiff import unified_diff
from pipelines.engines import LakeEngine
from pipelines.gold.object_run import merge_conditions
from pipelines.gold.plan import FOLD_IGNORED
from tests.spark.gold.conftest import T0, Silver, fold, gold_changes, gold_of, plan
from tests.spark.gold.helpers import assert_rows


def test_changes_apply_in_commit_order_whatever_the_delivery_order(engine: LakeEngine) -> None:
    silver = Silver()
    # Delivered newest first: the fold sorts by commit time, not by stream position.
    silver.update("001A", 20, Phone="third")
    silver.update("001A", 10, Phone="second")
    silver.create("001A", 0, Phone="first")
    gold = gold_of(engine, silver)
    assert_rows(
        engine,
        gold,
        ["Id", "Phone", "_cdc_last_change_type", "_cdc_last_commit_ts"],
        [("001A", "third", "UPDATE", T0 + timedelta(seconds=20))],
    )


def test_commit_number_orders_changes_of_the_same_second(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0)
    silver.update("001A", 5, Phone="later", commit_number=2_000)
    silver.update("001A", 5, Phone="earlier", commit_number=1_000)
    assert_rows(engine, gold_of(engine, silver), ["Id", "Phone"], [("001A", "later")])


def test_sequence_number_orders_changes_within_a_transaction(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0)
    shared = {"commit_number": 7_000, "tx": "tx-shared"}
    silver.update("001A", 5, Phone="seq 2", seq=2, **shared)
    silver.update("001A", 5, Phone="seq 1", seq=1, **shared)
    assert_rows(engine, gold_of(engine, silver), ["Id", "Phone"], [("001A", "seq 2")])


def test_stream_order_is_the_final_tie_break(engine: LakeEngine) -> None:
    # Ordering by commit timestamp only (a coarse sequence_by): equal timestamps fall back to
    # bronze batch and position.
    silver = Silver()
    silver.create("001A", 0, batch=1, batch_seq=1)
    silver.update("001A", 5, Phone="batch 2", batch=2, batch_seq=1)
    silver.update("001A", 5, Phone="batch 1, pos 9", batch=1, batch_seq=9)
    coarse = plan(sequence_by=("_cdc_commit_timestamp",))
    assert_rows(
        engine, gold_of(engine, silver, the_plan=coarse), ["Id", "Phone"], [("001A", "batch 2")]
    )


def test_sequence_by_is_configurable(engine: LakeEngine) -> None:
    # Ordering by the record's own LastModifiedDate instead of the commit header.
    silver = Silver()
    silver.create("001A", 0, LastModifiedDate=T0)
    silver.update("001A", 50, Phone="older save", LastModifiedDate=T0 + timedelta(seconds=2))
    silver.update("001A", 40, Phone="newer save", LastModifiedDate=T0 + timedelta(seconds=9))
    by_lmd = plan(sequence_by=("LastModifiedDate",))
    assert_rows(
        engine, gold_of(engine, silver, the_plan=by_lmd), ["Id", "Phone"], [("001A", "newer save")]
    )


def test_several_updates_in_one_batch_fold_into_one_row(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0, Phone="p0", NumberOfEmployees=1, Description="d0")
    silver.update("001A", 1, Phone="p1")
    silver.update("001A", 2, NumberOfEmployees=2)
    silver.update("001A", 3, Description=None)
    # Each UPDATE row carries nulls for the fields it did not change: taking the latest row
    # would wipe Phone and NumberOfEmployees.
    gold = gold_of(engine, silver)
    assert_rows(
        engine,
        gold,
        ["Id", "Phone", "NumberOfEmployees", "Description"],
        [("001A", "p1", 2, None)],
    )
    assert engine.count(gold) == 1


def test_late_event_is_ignored(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="created")
    first.update("001A", 30, Phone="newest")
    gold = gold_of(engine, first)
    late = first.next_batch()
    late.update("001A", 20, Phone="stale", NumberOfEmployees=99)
    folded = fold(engine, late, gold=gold)
    assert_rows(
        engine,
        folded,
        ["Id", "Phone", "NumberOfEmployees", FOLD_IGNORED],
        [("001A", "newest", 10, 1)],
    )
    assert engine.count(gold_changes(engine, folded)) == 0


def test_replaying_a_batch_changes_nothing(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0, Description="x" * 1200)
    silver.update("001A", 1, Phone="p1")
    silver.add("001B", "DELETE", 2)
    gold = gold_of(engine, silver)
    again = fold(engine, silver, gold=gold)
    assert engine.count(gold_changes(engine, again)) == 0
    assert_rows(engine, again, ["Id", FOLD_IGNORED], [("001A", 2), ("001B", 1)])


def test_duplicate_delivery_is_applied_once(engine: LakeEngine) -> None:
    # A diff applied twice would fail its SHA-256 the second time: a duplicate must not reach
    # the record at all.
    old = "\n".join(f"line {i}" for i in range(200))
    new = old.replace("line 17", "line seventeen")
    diff = unified_diff(old, new, newline="\n")
    silver = Silver()
    silver.create("001A", 0, Description=old)
    first = silver.update("001A", 1, Description=diff, diff=["Description"], batch_seq=50)
    duplicate = dict(first, _cdc_bronze_batch_seq=51)
    silver.rows.append(duplicate)
    gold = gold_of(engine, silver)
    assert_rows(engine, gold, ["Id", "Description", "_cdc_needs_resync"], [("001A", new, False)])


def test_redelivery_of_the_last_event_in_a_later_batch_is_ignored(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0)
    update = silver.update("001A", 1, Phone="p1")
    gold = gold_of(engine, silver)
    redelivered = silver.next_batch()
    redelivered.rows.append(dict(update, _cdc_bronze_batch_id=2, _cdc_bronze_batch_seq=1))
    folded = fold(engine, redelivered, gold=gold)
    assert engine.count(gold_changes(engine, folded)) == 0
    assert_rows(engine, folded, ["Id", FOLD_IGNORED], [("001A", 1)])


def test_merge_conditions_guard_by_order_key() -> None:
    update, delete = merge_conditions("soft")
    assert update == (
        "(target._cdc_order_key IS NULL OR source._cdc_order_key > target._cdc_order_key)"
    )
    assert delete is None
    update, delete = merge_conditions("hard")
    assert delete == f"source._cdc_is_deleted = true AND {update}"
