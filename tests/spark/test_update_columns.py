"""Columns refreshed apart from the rest of a row (formula fields), on both lake engines: a MERGE
that sets only some columns (``update_columns``), and whole-row MERGEs that leave the columns
their source does not have as they are (the gold fold's, the direct merge's and delta-rs's on
the local engine, the spark engine's)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ingest.errors import LakeError
from pipelines.engines import Kept, LakeEngine, TableRef, Txn
from tests.lake_helpers import rows_of

GOLD = TableRef("gold", "invoice")
UTC = timezone.utc
AT = datetime(2025, 3, 1, 12, tzinfo=UTC)
_TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        ("Id", pa.string()),
        ("Amount__c", pa.float64()),
        ("_cdc_order_key", pa.string()),
        ("Total__c", pa.float64()),
        ("_cdc_formulas_refreshed_at", _TS),
    ]
)


def _start(engine: LakeEngine) -> None:
    engine.append(
        GOLD,
        pa.Table.from_pylist(
            [
                {"Id": "a", "Amount__c": 1.0, "_cdc_order_key": "1", "Total__c": 1.1},
                {"Id": "b", "Amount__c": 2.0, "_cdc_order_key": "1", "Total__c": 2.2},
                {"Id": "c", "Amount__c": 3.0, "_cdc_order_key": "1", "Total__c": None},
            ],
            schema=SCHEMA,
        ),
    )


def _by_id(engine: LakeEngine) -> dict[str, dict[str, object]]:
    return {r["Id"]: r for r in rows_of(engine, GOLD)}


def test_update_columns_sets_only_those_columns(lake_engine: LakeEngine) -> None:
    _start(lake_engine)
    source = pa.table(
        {
            "Id": ["a", "c", "zz"],
            "Total__c": [9.9, 3.3, 7.7],
            "_cdc_formulas_refreshed_at": pa.array([AT] * 3, _TS),
            # Not named: ignored even though the source has it.
            "Amount__c": [100.0, 100.0, 100.0],
        }
    )
    metrics = lake_engine.update_columns(
        GOLD,
        source,
        on=["Id"],
        columns=["Total__c", "_cdc_formulas_refreshed_at"],
        txn=Txn("sfcdc.formulas:Invoice__c", 1),
    )
    assert (metrics.inserted, metrics.updated, metrics.deleted) == (0, 2, 0)
    rows = _by_id(lake_engine)
    assert set(rows) == {"a", "b", "c"}, "an unmatched source row was inserted"
    assert rows["a"]["Total__c"] == 9.9 and rows["c"]["Total__c"] == 3.3
    assert rows["b"]["Total__c"] == 2.2 and rows["b"]["_cdc_formulas_refreshed_at"] is None
    assert rows["a"]["_cdc_formulas_refreshed_at"] == AT
    assert [rows[k]["Amount__c"] for k in "abc"] == [1.0, 2.0, 3.0]
    assert [rows[k]["_cdc_order_key"] for k in "abc"] == ["1", "1", "1"]
    # The same txn again is skipped.
    again = lake_engine.update_columns(
        GOLD,
        source.select(["Id", "Total__c"]),
        on=["Id"],
        columns=["Total__c"],
        txn=Txn("sfcdc.formulas:Invoice__c", 1),
    )
    assert again.skipped
    with pytest.raises(LakeError, match=r"\['Nope__c'\] are not columns of the table"):
        lake_engine.update_columns(
            GOLD, pa.table({"Id": ["a"], "Nope__c": [1]}), on=["Id"], columns=["Nope__c"]
        )
    with pytest.raises(LakeError, match="are the merge keys"):
        lake_engine.update_columns(GOLD, source, on=["Id"], columns=["Id"])


def test_whole_row_merges_leave_columns_the_source_lacks(lake_engine: LakeEngine) -> None:
    _start(lake_engine)
    lake_engine.update_columns(
        GOLD,
        pa.table({"Id": ["a", "b"], "_cdc_formulas_refreshed_at": pa.array([AT, AT], _TS)}),
        on=["Id"],
        columns=["_cdc_formulas_refreshed_at"],
    )
    # The gold fold's MERGE: rows of the object's own columns, guarded by the order key.
    fold = pa.table(
        {
            "Id": ["a", "b", "d"],
            "Amount__c": [10.0, 20.0, 40.0],
            "_cdc_order_key": ["2", "0", "2"],
        }
    )
    lake_engine.merge(
        GOLD,
        fold,
        on=["Id"],
        update_condition="(target._cdc_order_key IS NULL OR source._cdc_order_key > "
        "target._cdc_order_key)",
    )
    rows = _by_id(lake_engine)
    assert rows["a"]["Amount__c"] == 10.0 and rows["a"]["Total__c"] == 1.1
    assert rows["a"]["_cdc_formulas_refreshed_at"] == AT
    assert rows["b"]["Amount__c"] == 2.0 and rows["b"]["Total__c"] == 2.2
    assert rows["d"]["Amount__c"] == 40.0 and rows["d"]["Total__c"] is None
    assert rows["d"]["_cdc_formulas_refreshed_at"] is None
    # An unconditional whole-row MERGE (a snapshot's), and one with a delete clause.
    lake_engine.merge(
        GOLD,
        pa.table({"Id": ["c", "d"], "Amount__c": [30.0, 41.0], "_cdc_order_key": ["3", "3"]}),
        on=["Id"],
        delete_condition="source.Amount__c > 40.5",
    )
    rows = _by_id(lake_engine)
    assert set(rows) == {"a", "b", "c"}
    assert rows["c"]["Amount__c"] == 30.0 and rows["c"]["Total__c"] is None
    assert rows["a"]["Total__c"] == 1.1 and rows["b"]["_cdc_formulas_refreshed_at"] == AT


def test_a_merge_keeps_the_columns_its_flags_say(lake_engine: LakeEngine) -> None:
    _start(lake_engine)
    keep = Kept("_fold_set", ("Amount__c", "Total__c"))
    # What the gold fold sends when it read gold without those columns: values only where a
    # change set them, and per row which of the two the row keeps ("0").
    fold = pa.table(
        {
            "Id": ["a", "b", "c", "d"],
            "Amount__c": [None, 20.0, 30.0, 40.0],
            "_cdc_order_key": ["2", "2", "2", "2"],
            "Total__c": [9.9, None, None, 4.4],
            "_fold_set": ["01", "10", None, "00"],
        }
    )
    metrics = lake_engine.merge(
        GOLD,
        fold,
        on=["Id"],
        update_condition="(target._cdc_order_key IS NULL OR source._cdc_order_key > "
        "target._cdc_order_key)",
        txn=Txn("sfcdc.gold:Invoice__c", 1),
        keep=keep,
    )
    assert (metrics.inserted, metrics.updated, metrics.deleted) == (1, 3, 0)
    rows = _by_id(lake_engine)
    assert set(rows) == {"a", "b", "c", "d"}
    assert "_fold_set" not in rows["a"], "the flags column was written"
    assert (rows["a"]["Amount__c"], rows["a"]["Total__c"]) == (1.0, 9.9)
    assert (rows["b"]["Amount__c"], rows["b"]["Total__c"]) == (20.0, 2.2)
    # No flags: every value from the source.
    assert (rows["c"]["Amount__c"], rows["c"]["Total__c"]) == (30.0, None)
    # Inserted: the source's values, whatever its flags say.
    assert (rows["d"]["Amount__c"], rows["d"]["Total__c"]) == (40.0, 4.4)
    assert [rows[k]["_cdc_order_key"] for k in "abcd"] == ["2", "2", "2", "2"]
    # A source column the table lacks fails before anything is written.
    with pytest.raises(LakeError, match="not columns of the table"):
        lake_engine.merge(
            GOLD,
            fold.append_column("Extra__c", pa.array([1.0] * 4)),
            on=["Id"],
            keep=keep,
        )
    assert lake_engine.history(GOLD, limit=1)[0].version == metrics.version


def test_local_merges_with_every_column_and_without_agree(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The local engine runs a MERGE whose source has exactly the table's columns itself
    (the direct merge) and any other through delta-rs: both keep what the source lacks."""
    from pipelines.engines.local import LocalEngine

    engine = LocalEngine(location=tmp_path / "lake")
    _start(engine)
    full = pa.Table.from_pylist(
        [{"Id": "a", "Amount__c": 5.0, "_cdc_order_key": "2", "Total__c": 5.5}], schema=SCHEMA
    )
    before = DeltaTable(str(tmp_path / "lake" / "gold" / "invoice")).version()
    engine.merge(GOLD, full, on=["Id"])
    engine.merge(
        GOLD, pa.table({"Id": ["b"], "Amount__c": [6.0], "_cdc_order_key": ["2"]}), on=["Id"]
    )
    rows = _by_id(engine)
    assert rows["a"]["Total__c"] == 5.5 and rows["b"]["Total__c"] == 2.2
    assert rows["b"]["Amount__c"] == 6.0 and rows["c"]["Total__c"] is None
    assert DeltaTable(str(tmp_path / "lake" / "gold" / "invoice")).version() == before + 2
