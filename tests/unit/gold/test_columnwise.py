"""The column-wise fold equals its reference model (folding every record one by one), on
random batches.

Each seed builds a gold state (a first batch folded) and a second batch mixing everything a
batch holds: updates of text, numbers, dates, whole compounds and their children (struct and
flattened), nulled fields, the person-name union, long-text diffs, creates with later updates,
deletes (soft and hard), changes gold already reflects, events delivered twice, gaps. Folding it
with the production fold and with the reference model must give the same rows, in every
column.
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.local import LocalEngine
from pipelines.gold.columns import body_fields, tombstone_schema
from pipelines.gold.dataflow import batch_diffs
from pipelines.gold.fold import fold_table
from pipelines.gold.folding import FoldTable, GoldPart, TombstonePart
from pipelines.gold.job import fold_rows
from pipelines.gold.plan import kept_columns
from tests.spark.gold.conftest import ADDRESS, PERSON, Silver, plan
from tests.unit.gold.fold_reference import (
    kept_by_merge,
    reference_fold_rows,
    without_set_flags,
)

ENGINE = LocalEngine(location="/nonexistent/sfcdc-columnwise-tests")
TEXT = ("Phone", "Description")


def _update(
    silver: Silver, rng: random.Random, rid: str, at: float, compounds: str, *, plain: bool
) -> None:
    values: dict[str, Any] = {}
    changed: list[str] = []
    for _ in range(rng.randint(1, 3)):
        pick = rng.random()
        if pick < 0.3:
            column = rng.choice(TEXT)
            values[column] = None if rng.random() < 0.2 else f"v{rng.randint(0, 99)}"
            changed.append(column)
        elif pick < 0.45:
            values["NumberOfEmployees"] = rng.choice([None, rng.randint(1, 999)])
            changed.append("NumberOfEmployees")
        elif pick < 0.7:
            child = rng.choice(ADDRESS)
            value = None if rng.random() < 0.3 else f"{child}-{rng.randint(0, 9)}"
            if compounds == "struct":
                values["BillingAddress"] = {
                    **dict.fromkeys(ADDRESS),
                    **(values.get("BillingAddress") or {}),
                    child: value,
                }
            else:
                values[f"BillingAddress_{child}"] = value
            changed.append(f"BillingAddress.{child}")
        elif pick < 0.8:
            whole = None if rng.random() < 0.3 else {c: f"{c}{rng.randint(0, 9)}" for c in ADDRESS}
            if compounds == "struct":
                values["BillingAddress"] = whole
            else:
                for c in ADDRESS:
                    values[f"BillingAddress_{c}"] = None if whole is None else whole[c]
            changed.append("BillingAddress")
        elif pick < 0.9 and not plain:
            child = rng.choice(PERSON)
            if compounds == "struct":
                values["Name_PersonName"] = {**dict.fromkeys(PERSON), child: f"{child}!"}
            else:
                values[f"Name_{child}"] = f"{child}!"
            changed.append(f"Name.{child}")
        elif plain:
            values["Phone"] = f"p{rng.randint(0, 99)}"
            changed.append("Phone")
        else:
            values["Description"] = "@@ -1 +1 @@"
            silver.add(rid, "UPDATE", at, changed=["Description"], diff=["Description"], **values)
            return
    changed = list(dict.fromkeys(changed))
    nulled = [
        c
        for c in changed
        if "." not in c and c in values and values[c] is None and c != "BillingAddress"
    ]
    silver.add(rid, "UPDATE", at, changed=changed, nulled=nulled, **values)


def _batch(seed: int, compounds: str, *, plain: bool) -> tuple[Silver, Silver]:
    """Two batches; ``plain``: only creates, updates of plain fields and compounds, deletes."""
    rng = random.Random(seed)
    first = Silver(compounds=compounds)
    ids = [f"001{seed:04d}{i:06d}" for i in range(40)]
    for i, rid in enumerate(ids[:30]):
        first.create(rid, i)
        if rng.random() < 0.3:
            _update(first, rng, rid, i + 0.5, compounds, plain=plain)
        if rng.random() < 0.1:
            first.add(rid, "DELETE", i + 0.7)
    second = first.next_batch()
    at = 100.0
    for _ in range(120):
        at += 1
        rid = rng.choice(ids)
        roll = rng.random()
        if roll < 0.1:
            second.create(rid, at)
        elif roll < 0.17:
            second.add(rid, "DELETE", at)
        elif roll < 0.2 and not plain:
            second.add(rid, rng.choice(["GAP_UPDATE", "UNDELETE"]), at)
        elif roll < 0.25 and first.rows and not plain:
            # A change gold already reflects, or an event delivered twice.
            old = dict(rng.choice(first.rows))
            old["_cdc_bronze_batch_id"] = second.batch
            second.rows.append(old)
        else:
            _update(second, rng, rid, at, compounds, plain=plain)
    return first, second


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    rows = without_set_flags(table).to_pylist()
    return sorted(rows, key=lambda r: (r["Id"] or "", repr(r)))


@pytest.mark.parametrize("mix", ["plain", "mixed"])
@pytest.mark.parametrize("compounds", ["struct", "flattened"])
@pytest.mark.parametrize("deletes", ["soft", "hard"])
@pytest.mark.parametrize("seed", range(8))
def test_the_columnwise_fold_equals_the_record_fold(
    seed: int, compounds: str, deletes: str, mix: str
) -> None:
    first, second = _batch(seed, compounds, plain=mix == "plain")
    the_plan = plan(compounds, deletes=deletes)
    schema = first.schema

    def fold(silver: Silver, gold: pa.Table | None, stones: pa.Table | None, on: bool) -> pa.Table:
        if not on:
            return reference_fold_rows(
                the_plan, schema, silver.table(), gold=gold, tombstones=stones
            )
        return ENGINE.to_arrow(
            fold_rows(
                ENGINE,
                silver.table(),
                schema=schema,
                plan=the_plan,
                gold=gold,
                tombstones=stones,
            )
        )

    state = fold(first, None, None, True)
    assert _sorted(state) == _sorted(fold(first, None, None, False))
    gold_names = [n for n in state.column_names if not n.startswith("_fold_")]
    gold = ENGINE.to_arrow(ENGINE.map_batches(state, GoldPart(gold_names), _gold_type(state)))
    stones = ENGINE.to_arrow(ENGINE.map_batches(state, TombstonePart(), tombstone_schema()))
    fast = fold(second, gold, stones, True)
    slow = fold(second, gold, stones, False)
    assert _sorted(fast) == _sorted(slow)
    # With gold read without the columns the MERGE keeps, the rows it merges are the same.
    body = [f.name for f in body_fields(schema)]
    kept = set(kept_columns(the_plan, body, batch_diffs(ENGINE, second.table())))
    assert kept  # the test reads some columns only where they change
    slim = fold(second, gold.drop_columns(sorted(kept)), stones, True)
    assert _sorted(kept_by_merge(slim, gold, body)) == _sorted(slow)
    # Whatever it reads, a record keeps a column exactly where no change set it.
    assert _sorted(kept_by_merge(fast, gold, body)) == _sorted(fast)


def _gold_type(state: pa.Table) -> Any:
    from pipelines.engines.arrow import arrow_schema_to_spark

    names = [n for n in state.column_names if not n.startswith("_fold_")]
    return arrow_schema_to_spark(state.select(names).schema)


def test_the_columnwise_fold_takes_every_record() -> None:
    # The plain records and those that once needed a fold of their own alike.
    first = Silver()
    for i, rid in enumerate("ABCDEG"):
        first.create(rid, i)
    the_plan = plan("struct", deletes="soft")
    state = ENGINE.to_arrow(fold_rows(ENGINE, first.table(), schema=first.schema, plan=the_plan))
    gold = state.select([n for n in state.column_names if not n.startswith("_fold_")])
    stones = ENGINE.to_arrow(ENGINE.map_batches(state, TombstonePart(), tombstone_schema()))
    second = first.next_batch()
    second.update("A", 10, Phone="555-0101")
    twice = second.update("B", 11, Phone="555-0102")
    second.update("B", 12, NumberOfEmployees=None)
    second.rows.append(dict(twice))  # an event delivered twice
    second.add("C", "DELETE", 13)
    second.add("D", "UPDATE", 14, changed=["Description"], diff=["Description"], Description="@")
    second.add("E", "GAP_UPDATE", 15)
    second.create("F", 16)
    second.update("F", 17, Phone=None)
    second.update("G", 18, Phone="555-0103")
    second.update("G", 19, NumberOfEmployees=7)
    changes = second.table()
    table = FoldTable(the_plan, second.schema)
    folded = fold_table(
        changes.select(table.columns),
        gold,
        stones,
        plan=the_plan,
        body=table.body,
        schema=spark_schema_to_arrow(table.output),
    )
    rows = {r["Id"]: r for r in folded.to_pylist()}
    assert set(rows) == set("ABCDEFG")
    assert rows["B"]["_fold_changes"] == 3 and rows["B"]["_fold_applied"] == 2
    assert rows["E"]["_cdc_needs_resync"] is True
    assert rows["A"]["Phone"] == "555-0101" and rows["A"]["NumberOfEmployees"] == 10
    assert rows["C"]["_cdc_is_deleted"] is True
    assert rows["F"]["Phone"] is None and rows["F"]["_fold_applied"] == 2
    assert rows["G"]["Phone"] == "555-0103" and rows["G"]["NumberOfEmployees"] == 7
