"""Silver's batch functions around decoding, on small explicit Arrow batches: decoded rows
taken apart into silver and quarantine rows, bronze rows no object decodes, and the filters and
counts the job runs over bronze."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import BatchFunction
from pipelines.silver.decode import BRONZE_COLUMNS
from pipelines.silver.quarantine import (
    COUNTS_SCHEMA,
    ERROR_COLUMNS,
    QUARANTINE_KEYS,
    QUARANTINE_SCHEMA,
    AfterBatch,
    QuarantinePart,
    SchemaCounts,
    SilverPart,
    Undecodable,
    WithoutKeys,
)
from pipelines.silver.shape import ERROR_TYPES
from tests.unit.silver.support import bronze_batch

UTC = timezone.utc
AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
QUARANTINE = spark_schema_to_arrow(QUARANTINE_SCHEMA)


def run(function: BatchFunction, data: pa.Table | pa.RecordBatch) -> pa.Table:
    """``function`` over ``data``'s batches, collected (with the schema of its first batch, or
    of the data when it yields none)."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    batches = list(function(iter(table.to_batches())))
    return pa.Table.from_batches(batches) if batches else table.schema.empty_table()


# Shaped rows of a platform event object with one field: silver columns, then the errors.
SHAPED = pa.schema(
    [
        ("_cdc_bronze_batch_id", pa.int64()),
        ("_cdc_bronze_batch_seq", pa.int32()),
        ("_cdc_event_id", pa.string()),
        ("_cdc_replay_id", pa.binary()),
        ("_cdc_schema_id", pa.string()),
        ("Note__c", pa.string()),
        ("_cdc_error", pa.string()),
        ("_cdc_error_kind", pa.string()),
        ("_cdc_payload", pa.binary()),
    ]
)
SILVER_NAMES = SHAPED.names[: -len(ERROR_COLUMNS)]


def shaped_rows() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "_cdc_bronze_batch_id": 4,
                "_cdc_bronze_batch_seq": 0,
                "_cdc_event_id": "e0",
                "_cdc_replay_id": b"\x00",
                "_cdc_schema_id": "sid",
                "Note__c": "ok",
            },
            {
                "_cdc_bronze_batch_id": 4,
                "_cdc_bronze_batch_seq": 1,
                "_cdc_event_id": "e1",
                "_cdc_replay_id": b"\x01",
                "_cdc_schema_id": "sid",
                "_cdc_error": "truncated",
                "_cdc_error_kind": "corrupt_payload",
                "_cdc_payload": b"\xff",
            },
            {
                "_cdc_bronze_batch_id": 4,
                "_cdc_bronze_batch_seq": 2,
                "_cdc_event_id": "e2",
                "_cdc_replay_id": b"\x02",
                "_cdc_schema_id": "sid",
                "Note__c": "fine",
            },
        ],
        schema=SHAPED,
    )


def test_error_columns_are_the_shaped_rows_last_columns() -> None:
    assert [name for name, _ in ERROR_TYPES] == list(ERROR_COLUMNS)
    assert set(QUARANTINE_KEYS) <= set(QUARANTINE.names)


def test_silver_part_keeps_the_rows_that_decoded() -> None:
    silver = run(SilverPart(SILVER_NAMES), shaped_rows())
    assert silver.column_names == SILVER_NAMES
    assert silver.to_pylist() == [
        {
            "_cdc_bronze_batch_id": 4,
            "_cdc_bronze_batch_seq": 0,
            "_cdc_event_id": "e0",
            "_cdc_replay_id": b"\x00",
            "_cdc_schema_id": "sid",
            "Note__c": "ok",
        },
        {
            "_cdc_bronze_batch_id": 4,
            "_cdc_bronze_batch_seq": 2,
            "_cdc_event_id": "e2",
            "_cdc_replay_id": b"\x02",
            "_cdc_schema_id": "sid",
            "Note__c": "fine",
        },
    ]
    # A batch without errors passes whole; one of errors only yields nothing.
    good = shaped_rows().filter(pa.array([True, False, True]))
    assert run(SilverPart(SILVER_NAMES), good).num_rows == 2
    assert run(SilverPart(SILVER_NAMES), shaped_rows().slice(1, 1)).num_rows == 0


def test_quarantine_part_keeps_what_the_quarantine_needs() -> None:
    function = QuarantinePart(
        bronze_table="widget__change_event", topic="/data/W", at=AT, entity="Widget__c"
    )
    bad = run(function, shaped_rows())
    assert bad.schema.equals(QUARANTINE)
    assert bad.to_pylist() == [
        {
            "bronze_table": "widget__change_event",
            "topic": "/data/W",
            "bronze_batch_id": 4,
            "bronze_batch_seq": 1,
            "replay_id": b"\x01",
            "event_id": "e1",
            "schema_id": "sid",
            "entity": "Widget__c",
            "reason_kind": "corrupt_payload",
            "reason": "truncated",
            "payload": b"\xff",
            "quarantined_at": AT,
            "resolved_at": None,
        }
    ]
    # The entity is the object whose decoder refused the rows (platform event rows carry none).
    named = QuarantinePart(
        bronze_table="widget__change_event", topic="/data/W", at=AT, entity="Gadget__c"
    )
    (row,) = run(named, shaped_rows()).to_pylist()
    assert row["entity"] == "Gadget__c"
    # Rows that all decoded: no quarantine rows.
    good = shaped_rows().filter(pa.array([True, False, True]))
    assert run(function, good).num_rows == 0


def bronze(events: list[tuple[Any, bytes]], batch_id: int = 0) -> pa.Table:
    table = bronze_batch([(sid or "", p) for sid, p in events], batch_id=batch_id)
    ids = pa.array([sid for sid, _ in events], pa.string())
    return table.set_column(table.schema.get_field_index("schema_id"), "schema_id", ids).select(
        list(BRONZE_COLUMNS)
    )


def undecodable(**options: Any) -> Undecodable:
    defaults: dict[str, Any] = {
        "decodable": set(),
        "reasons": {},
        "registry": "bronze.sfcdc_schemas",
        "bronze_table": "account_change_event",
        "topic": "/data/AccountChangeEvent",
        "at": AT,
    }
    return Undecodable(**{**defaults, **options})


def test_undecodable_rows_from_bronze() -> None:
    rows = bronze(
        [
            ("good", b"a"),
            ("other-object", b"b"),
            ("broken", b"c"),
            ("stranger", b"d"),
            ("", b"e"),
            (None, b"f"),
        ],
        batch_id=9,
    )
    out = run(
        undecodable(
            decodable={"good", "other-object"},
            reasons={
                "broken": ("invalid_schema", "schema broken does not parse"),
                "wrongly": ("wrong_entity", "not ours"),
            },
        ),
        rows,
    )
    assert out.schema.equals(QUARANTINE)
    by_seq = {r["bronze_batch_seq"]: r for r in out.to_pylist()}
    assert sorted(by_seq) == [2, 3, 4, 5]
    assert (by_seq[2]["reason_kind"], by_seq[2]["reason"]) == (
        "invalid_schema",
        "schema broken does not parse",
    )
    assert by_seq[3]["reason_kind"] == "unknown_schema"
    assert by_seq[3]["reason"].startswith(
        "unknown schema id 'stranger': not in bronze.sfcdc_schemas"
    )
    for seq in (4, 5):  # an empty and a missing schema id
        assert (by_seq[seq]["reason_kind"], by_seq[seq]["reason"]) == (
            "unknown_schema",
            "the bronze row has no schema id",
        )
    row = by_seq[3]
    assert (row["bronze_batch_id"], row["payload"], row["quarantined_at"]) == (9, b"d", AT)
    assert (row["bronze_table"], row["topic"], row["entity"]) == (
        "account_change_event",
        "/data/AccountChangeEvent",
        None,
    )
    assert (row["event_id"], row["replay_id"]) == ("evt-9-3", rows.column("replay_id")[3].as_py())


def test_undecodable_rows_without_known_reasons() -> None:
    out = run(undecodable(decodable={"good"}), bronze([("good", b"a"), ("stranger", b"b")]))
    assert [(r["schema_id"], r["reason_kind"]) for r in out.to_pylist()] == [
        ("stranger", "unknown_schema")
    ]
    # A listed reason wins over the schema id being decodable.
    listed = undecodable(decodable={"good"}, reasons={"good": ("wrong_entity", "not ours")})
    (row,) = run(listed, bronze([("good", b"a")])).to_pylist()
    assert (row["reason_kind"], row["reason"]) == ("wrong_entity", "not ours")
    # Nothing to quarantine: no batch at all.
    assert run(undecodable(decodable={"good"}), bronze([("good", b"a")])).num_rows == 0


def quarantine_rows(keys: list[tuple[str, int, int]]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"bronze_table": t, "bronze_batch_id": b, "bronze_batch_seq": s, "reason": "r"}
            for t, b, s in keys
        ],
        schema=QUARANTINE,
    )


def test_without_keys_drops_rows_already_quarantined() -> None:
    rows = quarantine_rows([("a", 1, 0), ("a", 1, 1), ("b", 1, 0), ("a", 2, 0)])
    out = run(WithoutKeys({("a", 1, 1), ("b", 1, 0)}), rows)
    keys = list(zip(*(out.column(k).to_pylist() for k in QUARANTINE_KEYS), strict=True))
    assert keys == [("a", 1, 0), ("a", 2, 0)]
    assert run(WithoutKeys(set()), rows).num_rows == 4


def test_after_batch_keeps_the_batches_not_yet_processed() -> None:
    rows = pa.table({"batch_id": pa.array([3, 4, None, 5, 4], pa.int64()), "n": list(range(5))})
    assert run(AfterBatch(4), rows).column("n").to_pylist() == [3]
    assert run(AfterBatch(2), rows).column("n").to_pylist() == [0, 1, 3, 4]
    assert run(AfterBatch(5), rows).num_rows == 0


def test_schema_counts_per_batch() -> None:
    first = bronze([("a", b"1"), ("b", b"2"), ("a", b"3")], batch_id=7)
    second = bronze([("a", b"4"), (None, b"5")], batch_id=9)
    counts = pa.Table.from_batches(
        list(SchemaCounts()(iter([*first.to_batches(), *second.to_batches()])))
    )
    assert counts.schema.equals(spark_schema_to_arrow(COUNTS_SCHEMA))
    assert sorted(
        (tuple(r.values()) for r in counts.to_pylist()), key=lambda r: (r[0] or "", r[2])
    ) == [(None, 1, 9), ("a", 2, 7), ("a", 1, 9), ("b", 1, 7)]
