"""The SCD2 merge rows (:class:`~pipelines.gold.scd2.HistoryChanges`) on explicit Arrow rows,
with a tracked compound column (a struct)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
from pyspark.sql import types as T

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.gold.scd2 import (
    CURRENT_VERSION,
    HISTORY_ROLE,
    NEW_VERSION,
    HistoryChanges,
    history_input_schema,
    history_schema,
)

ADDRESS = T.StructType([T.StructField("City", T.StringType())])
SCHEMA = history_schema([T.StructField("MailingAddress", ADDRESS)])
T1, T2, T3 = (datetime(2025, 1, d, tzinfo=timezone.utc) for d in (1, 2, 3))


def version(rid: str, city: str, at: datetime, key: str, *, current: bool) -> dict[str, object]:
    return {
        "Id": rid,
        "MailingAddress": {"City": city},
        "_scd_valid_from": at,
        "_scd_valid_to": None,
        "_scd_is_current": current,
        "_scd_is_deleted": False,
        "_scd_change_type": "UPDATE",
        "_scd_order_key": key,
        "_scd_event_id": f"ev-{key}",
    }


def test_the_current_version_closes_at_the_first_new_one() -> None:
    rows = [
        {**version("1", "Paris", T1, "a", current=True), HISTORY_ROLE: CURRENT_VERSION},
        {**version("2", "Rome", T1, "a", current=True), HISTORY_ROLE: CURRENT_VERSION},
        {**version("1", "Lyon", T2, "b", current=False), HISTORY_ROLE: NEW_VERSION},
        {**version("1", "Nice", T3, "c", current=True), HISTORY_ROLE: NEW_VERSION},
    ]
    table = pa.Table.from_pylist(rows, schema=spark_schema_to_arrow(history_input_schema(SCHEMA)))
    out = HistoryChanges(SCHEMA)(table).to_pylist()
    by_key = {(r["Id"], r["_scd_order_key"]): r for r in out}
    assert set(by_key) == {("1", "a"), ("1", "b"), ("1", "c")}  # record 2 has nothing new
    closed = by_key[("1", "a")]
    assert closed["_scd_valid_to"] == T2 and closed["_scd_is_current"] is False
    assert closed["MailingAddress"] == {"City": "Paris"}
    assert by_key[("1", "c")]["_scd_is_current"] is True
