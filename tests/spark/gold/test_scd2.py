"""SCD2 history: a version per change of a tracked column, chained, and the current version
of the table closed when new ones arrive."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pyspark.sql import SparkSession

from pipelines.gold.fold import history_versions
from pipelines.gold.scd2 import history_changes
from tests.spark.gold.conftest import T0, Silver, fold, plan
from tests.spark.gold.helpers import assert_rows

pytestmark = pytest.mark.spark

TRACKED = plan(track=["Phone", "NumberOfEmployees"])
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


def test_a_version_per_change_of_a_tracked_column(spark: SparkSession) -> None:
    silver = Silver()
    silver.create("001A", 0, Phone="p0", NumberOfEmployees=1)
    silver.update("001A", 1, Description="untracked: no version")
    silver.update("001A", 2, Phone="p1")
    silver.update("001A", 3, Phone="p1", changed=["Phone"])  # same value: no version
    silver.add("001A", "DELETE", 4)
    silver.add("001A", "UNDELETE", 5, Name="Company 001A", Phone="p1", NumberOfEmployees=2)
    assert_rows(
        history_versions(fold(spark, silver, the_plan=TRACKED)),
        VERSION,
        [
            ("001A", "p0", 1, s(0), s(2), False, False, "CREATE"),
            ("001A", "p1", 1, s(2), s(4), False, False, "UPDATE"),
            ("001A", "p1", 1, s(4), s(5), False, True, "DELETE"),
            ("001A", "p1", 2, s(5), None, True, False, "UNDELETE"),
        ],
    )


def test_track_all_follows_every_body_column(spark: SparkSession) -> None:
    silver = Silver()
    silver.create("001A", 0)
    silver.update("001A", 1, Description="now tracked")
    versions = history_versions(fold(spark, silver, the_plan=plan(track="all")))
    assert_rows(
        versions,
        ["Id", "Description", "_scd_change_type"],
        [("001A", None, "CREATE"), ("001A", "now tracked", "UPDATE")],
    )
    assert {"BillingAddress", "Name_PersonName", "SLAExpirationDate__c"} <= set(versions.columns)


def test_new_versions_close_the_current_one(spark: SparkSession) -> None:
    first = Silver()
    first.create("001A", 0, Phone="p0")
    first.create("001B", 0, Phone="b0")
    gold = fold(spark, first, the_plan=TRACKED).drop("_fold_versions").localCheckpoint()
    history = history_versions(fold(spark, first, the_plan=TRACKED)).localCheckpoint()
    batch = first.next_batch()
    batch.update("001A", 7, Phone="p1")
    folded = fold(spark, batch, gold=gold, the_plan=TRACKED)
    assert_rows(
        history_changes(history_versions(folded), history),
        VERSION,
        [
            ("001A", "p0", 10, s(0), s(7), False, False, "CREATE"),  # closed
            ("001A", "p1", 10, s(7), None, True, False, "UPDATE"),  # new
        ],
    )
    # Re-running the batch: its version is already current, nothing is closed twice.
    current = history_changes(history_versions(folded), history).localCheckpoint()
    rerun = history_changes(history_versions(folded), current)
    assert_rows(rerun, ["Id", "_scd_change_type"], [("001A", "UPDATE")])
