"""A polled object's columns from its describes, its bronze rows as silver rows, and gold's fold of
them: a full record, live or in the Recycle Bin, ordered by SystemModstamp, and a record read
twice unchanged recognised as applied."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from pipelines.gold.plan import fold_plan
from pipelines.polled.layout import (
    calculated_fields,
    describe_fingerprint,
    layout_of_describes,
    record_infos_of,
)
from pipelines.polled.poll import _commit_rows, poll_soql
from pipelines.polled.rows import PolledRows
from pipelines.polled.tables import POLLED_SCHEMA
from pipelines.spec import ObjectSpec
from tests.unit.gold.fold_reference import fold_record

UTC = timezone.utc
T0 = datetime(2025, 3, 1, 12, tzinfo=UTC)
OBJ = ObjectSpec(api_name="Lead", kind="polled")


def _field(name: str, type_: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "calculated": False, "compoundFieldName": None, **more}


DESCRIBE = {
    "name": "Lead",
    "fields": [
        _field("Id", "id"),
        _field("IsDeleted", "boolean"),
        _field("SystemModstamp", "datetime"),
        _field("Name", "string"),
        _field("FirstName", "string", compoundFieldName="Name"),
        _field("LastName", "string", compoundFieldName="Name"),
        _field("Address", "address"),
        _field("City", "string", compoundFieldName="Address"),
        _field("Latitude", "double", compoundFieldName="Address"),
        _field("Score", "int"),
        _field("Close", "date"),
        _field("Score_Doubled__c", "double", calculated=True),
    ],
}
# A later describe: a field added, Score widened.
LATER = {
    **DESCRIBE,
    "fields": [
        *(f for f in DESCRIBE["fields"] if f["name"] != "Score"),
        _field("Score", "double"),
        _field("Rating", "picklist"),
    ],
}


def test_the_columns_are_a_change_event_objects() -> None:
    layout = layout_of_describes(OBJ, [DESCRIBE])
    names = [name for name, _ in layout.field_columns()]
    # SystemModstamp is the commit time, a formula field is refreshed apart: neither a column.
    assert names == ["Name", "Address", "Score", "Close"]
    assert [c.name for c in layout.fields[0].children] == ["FirstName", "LastName"]
    assert layout.metadata_columns()[1][0] == "_cdc_change_type"
    assert [f["name"] for f in calculated_fields(DESCRIBE)] == ["Score_Doubled__c"]
    assert set(record_infos_of([DESCRIBE])) == {"Name"}
    widened = layout_of_describes(OBJ, [DESCRIBE, LATER])
    assert [f.name for f in widened.fields] == ["Name", "Address", "Score", "Close", "Rating"]
    assert widened.fields[2].kind == "double"
    assert describe_fingerprint(DESCRIBE) != describe_fingerprint(LATER)
    reordered = {**DESCRIBE, "fields": list(reversed(DESCRIBE["fields"]))}
    assert describe_fingerprint(reordered) == describe_fingerprint(DESCRIBE)


def test_a_poll_query_reads_what_was_saved_since_the_watermark_minus_the_lookback() -> None:
    soql, where = poll_soql(OBJ, DESCRIBE, T0 + timedelta(milliseconds=900))
    assert where == "SystemModstamp >= 2025-03-01T12:00:00Z"
    # A person name is read as its parts, an address whole (REST nests it).
    assert soql == (
        "SELECT Id, IsDeleted, SystemModstamp, FirstName, LastName, Address, Score, Close "
        "FROM Lead WHERE SystemModstamp >= 2025-03-01T12:00:00Z"
    )
    assert "Score_Doubled__c" not in soql
    whole, none = poll_soql(OBJ, DESCRIBE, None)
    assert none is None and "WHERE" not in whole


def _record(record_id: str, *, score: int | str | None, deleted: bool = False) -> dict[str, Any]:
    return {
        "attributes": {"type": "Lead"},
        "Id": record_id,
        "IsDeleted": deleted,
        "SystemModstamp": "2025-03-01T12:00:05.000+0000",
        "Name": "Ada Lovelace",
        "FirstName": "Ada",
        "LastName": "Lovelace",
        "Address": {"city": "London", "latitude": 51.5},
        "Score": score,
        "Close": "2025-04-01",
    }


def _bronze(records: list[dict[str, Any]], *, batch: int = 1) -> pa.Table:
    stamp = T0 + timedelta(seconds=5)
    return _commit_rows(
        describe=(describe_fingerprint(DESCRIBE), DESCRIBE),
        ids=pa.array([r["Id"] for r in records], pa.string()),
        stamps=pa.array([stamp] * len(records), pa.timestamp("us", tz="UTC")),
        deleted=pa.array([bool(r["IsDeleted"]) for r in records]),
        payloads=pa.array([json.dumps(r) for r in records]),
        fingerprint=describe_fingerprint(DESCRIBE),
        api="rest",
        polled_at=T0,
        batch=batch,
        watermark=stamp,
        since=None,
    )


def test_a_poll_is_one_set_of_rows_with_its_describe_and_watermark() -> None:
    table = _bronze([_record("00Q1", score=3), _record("00Q2", score=4)])
    assert table.schema == POLLED_SCHEMA
    assert table.column("kind").to_pylist() == ["describe", "record", "record", "watermark"]
    assert table.column("batch_seq").to_pylist() == [0, 1, 2, 3]
    assert table.column("records").to_pylist()[-1] == 2


def test_records_become_full_image_rows_and_bad_values_errors() -> None:
    layout = layout_of_describes(OBJ, [DESCRIBE])
    rows = PolledRows(layout, record_infos_of([DESCRIBE]))
    records = [
        _record("00Q1", score=3),
        _record("00Q2", score=None, deleted=True),
        _record("00Q3", score="many"),
    ]
    out = pa.Table.from_batches(list(rows(iter(_bronze(records).to_batches())))).to_pylist()
    assert [r["Id"] for r in out] == ["00Q1", "00Q2", "00Q3"]
    live, deleted, bad = out
    assert live["_cdc_change_type"] == "POLLED" and deleted["_cdc_change_type"] == "POLLED_DELETED"
    assert live["_cdc_commit_timestamp"] == T0 + timedelta(seconds=5)
    ms = int((T0.timestamp() + 5) * 1000)
    assert live["_cdc_event_id"] == f"poll:00Q1:{ms}:{describe_fingerprint(DESCRIBE)[:12]}"
    assert live["_cdc_changed_fields"] == [] and live["_cdc_change_origin"] == "sfcdc poll (rest)"
    assert live["Name"] == {"FirstName": "Ada", "LastName": "Lovelace"}
    assert live["Address"] == {"City": "London", "Latitude": 51.5}
    assert live["Score"] == 3 and str(live["Close"]) == "2025-04-01"
    assert live["_cdc_error"] is None
    assert bad["_cdc_error_kind"] == "bad_value" and "Score" in bad["_cdc_error"]
    assert json.loads(bad["_cdc_payload"])["Id"] == "00Q3"


def test_the_fold_takes_polled_rows_as_full_images_in_modstamp_order() -> None:
    layout = layout_of_describes(OBJ, [DESCRIBE])
    plan = fold_plan(layout, processed_at=T0)
    body = [name for name, _ in layout.field_columns()]

    def change(
        kind: str, seconds: int, score: int | None, batch: int, describe: str = "d1"
    ) -> dict[str, Any]:
        stamp = T0 + timedelta(seconds=seconds)
        return {
            "Id": "00Q1",
            "_cdc_change_type": kind,
            "_cdc_commit_timestamp": stamp,
            "_cdc_event_id": f"poll:00Q1:{seconds}:{describe}",
            "_cdc_bronze_batch_id": batch,
            "_cdc_bronze_batch_seq": 1,
            "Score": score,
            "Name": None,
        }

    first = fold_record(
        plan, body, "00Q1", gold=None, tombstone=None, changes=[change("POLLED", 5, 3, 1)]
    )
    assert first.gold == "upsert" and first.row is not None and first.row["Score"] == 3
    # Read again unchanged (the look-back), in a later poll: already applied.
    again = fold_record(
        plan, body, "00Q1", gold=first.row, tombstone=None, changes=[change("POLLED", 5, 3, 2)]
    )
    assert again.gold is None and again.ignored == 1
    # Read again after the describe changed (a type conversion emptied Score everywhere without
    # moving SystemModstamp): applied.
    retyped = fold_record(
        plan,
        body,
        "00Q1",
        gold=first.row,
        tombstone=None,
        changes=[change("POLLED", 5, None, 2, describe="d2")],
    )
    assert retyped.gold == "upsert" and retyped.row is not None and retyped.row["Score"] is None
    # Deleted later, with its values; a stale read of the live record does not undo it.
    gone = fold_record(
        plan,
        body,
        "00Q1",
        gold=first.row,
        tombstone=None,
        changes=[change("POLLED_DELETED", 9, 4, 3), change("POLLED", 7, 9, 3)],
    )
    assert gone.row is not None
    assert gone.row["_cdc_is_deleted"] and gone.row["Score"] == 4
    assert gone.row["_cdc_deleted_at"] == T0 + timedelta(seconds=9)
    assert gone.row["_cdc_last_change_type"] == "POLLED_DELETED"
    hard = fold_plan(layout, processed_at=T0, deletes="hard")
    removed = fold_record(
        hard,
        body,
        "00Q1",
        gold=first.row,
        tombstone=None,
        changes=[change("POLLED_DELETED", 9, 4, 3)],
    )
    assert removed.gold == "delete" and removed.tombstone == "upsert"
