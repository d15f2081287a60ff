"""SCD2 history: a version per change of a tracked column, chained, and the current version
of the table closed when new ones arrive."""

from __future__ import annotations

from datetime import timedelta

from pipelines.engines import LakeEngine
from pipelines.gold.job import history_changes
from pipelines.gold.scd2 import history_schema
from tests.spark.gold.conftest import (
    T0,
    Silver,
    computed,
    fold,
    gold_changes,
    history_versions,
    plan,
)
from tests.spark.gold.helpers import assert_rows

TRACKED = plan(track=["Phone", "NumberOfEmployees"])
HISTORY = history_schema([f for f in Silver().schema.fields if f.name in TRACKED.track])
VERSION = [
    "Id",
    "Phone",
    "NumberOfEmployees",
    "_scd_valid_from",
    "_scd_valid_to",
    "_scd_is_current",
    "_scd_is_deleted",
    "_scd_change_type",
]


def s(seconds: int):
    return T0 + timedelta(seconds=seconds)


def test_a_version_per_change_of_a_tracked_column(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0, Phone="p0", NumberOfEmployees=1)
    silver.update("001A", 1, Description="untracked: no version")
    silver.update("001A", 2, Phone="p1")
    silver.update("001A", 3, Phone="p1", changed=["Phone"])  # same value: no version
    silver.add("001A", "DELETE", 4)
    silver.add("001A", "UNDELETE", 5, Name="Company 001A", Phone="p1", NumberOfEmployees=2)
    assert_rows(
        engine,
        history_versions(engine, fold(engine, silver, the_plan=TRACKED)),
        VERSION,
        [
            ("001A", "p0", 1, s(0), s(2), False, False, "CREATE"),
            ("001A", "p1", 1, s(2), s(4), False, False, "UPDATE"),
            ("001A", "p1", 1, s(4), s(5), False, True, "DELETE"),
            ("001A", "p1", 2, s(5), None, True, False, "UNDELETE"),
        ],
    )


def test_track_all_follows_every_body_column(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0)
    silver.update("001A", 1, Description="now tracked")
    versions = history_versions(engine, fold(engine, silver, the_plan=plan(track="all")))
    assert_rows(
        engine,
        versions,
        ["Id", "Description", "_scd_change_type"],
        [("001A", None, "CREATE"), ("001A", "now tracked", "UPDATE")],
    )
    columns = engine.to_arrow(versions).column_names
    assert {"BillingAddress", "Name_PersonName", "SLAExpirationDate__c"} <= set(columns)


def test_new_versions_close_the_current_one(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="p0")
    first.create("001B", 0, Phone="b0")
    gold = computed(engine, gold_changes(engine, fold(engine, first, the_plan=TRACKED)))
    history = computed(engine, history_versions(engine, fold(engine, first, the_plan=TRACKED)))
    batch = first.next_batch()
    batch.update("001A", 7, Phone="p1")
    folded = fold(engine, batch, gold=gold, the_plan=TRACKED)
    assert_rows(
        engine,
        history_changes(engine, history_versions(engine, folded), history, schema=HISTORY),
        VERSION,
        [
            ("001A", "p0", 10, s(0), s(7), False, False, "CREATE"),  # closed
            ("001A", "p1", 10, s(7), None, True, False, "UPDATE"),  # new
        ],
    )
    # Re-running the batch: its version is already current, nothing is closed twice.
    current = computed(
        engine, history_changes(engine, history_versions(engine, folded), history, schema=HISTORY)
    )
    rerun = history_changes(engine, history_versions(engine, folded), current, schema=HISTORY)
    assert_rows(engine, rerun, ["Id", "_scd_change_type"], [("001A", "UPDATE")])
