"""Wildcard changes on a table of records that have no other change in the batch.

A wildcard applies to every record of the table that exists at its point of the order;
:func:`tests.spark.gold.conftest.fold` checks every case on both engines and against the
reference model, so these cases cover the records a wildcard sets and those it must leave as
they are or set only in part (a record already newer than the wildcard, one that saw the same
event, a tombstone, a child of a compound, a diff).
"""

from __future__ import annotations

import pytest

from pipelines.engines import LakeEngine, Rows
from tests.spark.gold.conftest import (
    T0,
    Silver,
    fold,
    gold_changes,
    gold_of,
    plan,
    tombstone_changes,
)
from tests.spark.gold.helpers import assert_rows

ADDRESS = {"Street": "1 Main", "City": "Paris", "PostalCode": None, "Country": "FR"}


def _gold(engine: LakeEngine) -> tuple[Silver, Rows]:
    first = Silver()
    for n in range(6):
        first.create(f"001{n}", 0, Phone=f"p{n}", BillingAddress=ADDRESS, LastModifiedDate=T0)
    first.add("0013", "DELETE", 1)
    first.update("0014", 20, Phone="newer than the wildcards")
    first.update("0015", 2, Phone="saw the event", event="ev-wild-1")
    return first, gold_of(engine, first)


def test_wildcards_on_untouched_records_match_the_per_record_fold(engine: LakeEngine) -> None:
    first, gold = _gold(engine)
    batch = first.next_batch()
    batch.update("0011", 3, Phone="changed in the batch")
    batch.add(
        "001*",
        "UPDATE",
        5,
        changed=["Phone", "BillingAddress"],
        nulled=["BillingAddress"],
        wildcard=True,
        event="ev-wild-1",
        Phone="everyone",
    )
    batch.add(
        "001*", "UPDATE", 6, changed=["NumberOfEmployees"], wildcard=True, NumberOfEmployees=7
    )
    assert_rows(
        engine,
        gold_of(engine, batch, gold=gold),
        ["Id", "Phone", "BillingAddress", "NumberOfEmployees", "_cdc_is_deleted"],
        [
            ("0010", "everyone", None, 7, False),
            ("0011", "everyone", None, 7, False),
            ("0012", "everyone", None, 7, False),
            ("0013", "everyone", None, 7, True),
            ("0015", "saw the event", ADDRESS, 7, False),
        ],
    )


@pytest.mark.parametrize("compounds", ["struct", "flattened"])
def test_wildcards_under_hard_deletes_leave_tombstoned_records_alone(
    engine: LakeEngine, compounds: str
) -> None:
    first = Silver(compounds=compounds)
    for n in range(4):
        first.create(f"001{n}", 0, Phone=f"p{n}")
    first.add("0012", "DELETE", 1)
    hard = plan(compounds, deletes="hard")
    folded = fold(engine, first, the_plan=hard)
    gold, stones = gold_changes(engine, folded), tombstone_changes(engine, folded)
    batch = first.next_batch()
    batch.add("001*", "UPDATE", 5, changed=["Phone"], wildcard=True, Phone="all")
    batch.add("0013", "DELETE", 6)
    assert_rows(
        engine,
        gold_of(engine, batch, gold=gold, tombstones=stones, the_plan=hard),
        ["Id", "Phone", "_cdc_is_deleted"],
        [("0010", "all", False), ("0011", "all", False), ("0013", "all", True)],
    )


def test_a_wildcard_needing_the_records_values_is_folded_record_by_record(
    engine: LakeEngine,
) -> None:
    first, gold = _gold(engine)
    batch = first.next_batch()
    batch.add(
        "001*", "UPDATE", 5, changed=["BillingAddress.City"], wildcard=True, BillingAddress=None
    )
    assert_rows(
        engine,
        gold_of(engine, batch, gold=gold),
        ["Id", "BillingAddress"],
        [
            (f"001{n}", {"Street": "1 Main", "City": None, "PostalCode": None, "Country": "FR"})
            for n in (0, 1, 2, 3, 5)
        ],
    )
