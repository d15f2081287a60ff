"""The MERGE clause conditions the local engine evaluates itself: SQL's three-valued logic
over the matched target rows and their source rows, and a refusal (so delta-rs runs the
MERGE) for anything outside the subset."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines.engines.merge_predicate import UnsupportedCondition, parse_condition

SCHEMA = pa.schema(
    [
        ("Id", pa.string()),
        ("_cdc_order_key", pa.string()),
        ("_cdc_is_deleted", pa.bool_()),
        ("resolved_at", pa.timestamp("us", tz="UTC")),
        ("Amount", pa.float64()),
    ]
)


def rows(**columns: list[object]) -> pa.Table:
    n = len(next(iter(columns.values())))
    return pa.table(
        {f.name: pa.array(columns.get(f.name, [None] * n), f.type) for f in SCHEMA}, schema=SCHEMA
    )


def holds(text: str, target: pa.Table, source: pa.Table) -> list[bool]:
    return parse_condition(text, SCHEMA, SCHEMA)(target, source).to_pylist()


def test_the_gold_order_guard_treats_a_missing_target_key_as_older() -> None:
    newer = "(target._cdc_order_key IS NULL OR source._cdc_order_key > target._cdc_order_key)"
    target = rows(_cdc_order_key=["b", "b", None, "b"])
    source = rows(_cdc_order_key=["c", "a", "a", None])
    # A null source key compares to null: not newer, so the clause does not apply.
    assert holds(newer, target, source) == [True, False, True, False]


def test_and_with_a_boolean_literal_and_null_tests() -> None:
    target = rows(resolved_at=[None, None, 1, None], _cdc_is_deleted=[True, False, True, None])
    source = rows(resolved_at=[1, None, 1, 1], _cdc_is_deleted=[True, True, None, False])
    assert holds(
        "source.resolved_at IS NOT NULL AND target.resolved_at IS NULL", target, source
    ) == [True, False, False, True]
    assert holds("source._cdc_is_deleted = true", target, source) == [True, True, False, False]
    assert holds("NOT source._cdc_is_deleted", target, source) == [False, False, False, True]
    assert holds("true", target, source) == [True] * 4
    assert holds("false", target, source) == [False] * 4


def test_names_quoted_or_in_another_case_and_literals_of_each_kind() -> None:
    target = rows(Id=["a", "b"], Amount=[1.5, None])
    source = rows(Id=["a", "x"], Amount=[2.0, 3.0])
    assert holds('target."Id" = source.`Id`', target, source) == [True, False]
    assert holds("source.amount >= 2 AND target.Amount <> 1.5", target, source) == [
        False,
        False,
    ]
    assert holds("target.Id = 'b' OR source.Amount > 2.5", target, source) == [False, True]


@pytest.mark.parametrize(
    "text",
    [
        "source.Amount + 1 > target.Amount",  # arithmetic
        "source.Missing IS NULL",  # no such column
        "other.Id = source.Id",  # neither side
        "source.Id = 1",  # text against a number does not compare
        "source.resolved_at > '2024-01-01'",  # needs a cast delta-rs would do
        "coalesce(source.Amount, 0) > 1",  # functions
        "source.Id IN ('a', 'b')",
        "(source.Id = 'a'",
    ],
)
def test_anything_outside_the_subset_is_refused(text: str) -> None:
    with pytest.raises(UnsupportedCondition):
        parse_condition(text, SCHEMA, SCHEMA)
