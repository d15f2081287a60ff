"""The drift rules of reconciliation, on small explicit Arrow tables: which records are missing
from gold, extra in gold, stale, or in flight, with soft and hard deletes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from pipelines.reconcile import find_drift, salesforce_table

UTC = timezone.utc
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _sf(*rows: tuple[str, int | None, bool], rest: bool = True) -> pa.Table:
    def stamp(seconds: int | None) -> str | None:
        if seconds is None:
            return None
        text = (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.000")
        return text + ("+0000" if rest else "Z")

    return salesforce_table(
        iter([{"Id": i, "SystemModstamp": stamp(s), "IsDeleted": d} for i, s, d in rows])
    )


def _gold(*rows: tuple[str, float, bool], tz: bool = True) -> pa.Table:
    kind = pa.timestamp("us", tz="UTC" if tz else None)
    return pa.table(
        {
            "Id": pa.array([r[0] for r in rows], pa.string()),
            "_cdc_is_deleted": pa.array([r[2] for r in rows], pa.bool_()),
            "_cdc_last_commit_ts": pa.array(
                [(T0 + timedelta(seconds=r[1])).replace(tzinfo=UTC if tz else None) for r in rows],
                kind,
            ),
            "Name": pa.array(["x"] * len(rows), pa.string()),
        }
    )


def _kinds(drift: pa.Table) -> dict[str, str]:
    return dict(zip(drift["Id"].to_pylist(), drift["kind"].to_pylist(), strict=True))


@pytest.mark.parametrize("tz", [True, False])
def test_every_kind_of_drift(tz: bool) -> None:
    salesforce = _sf(
        ("same", 10, False),
        ("newer", 20, False),  # gold saw 10: a save was lost
        ("lost_create", 5, False),
        ("lost_delete", 30, True),
        ("lost_undelete", 40, False),
        ("in_bin", 8, True),  # gold has it deleted: fine
        ("bin_not_in_gold", 9, True),
        ("subsecond", 10, False),  # gold's 10.4 s is not older than Salesforce's 10 s
    )
    gold = _gold(
        ("same", 10, False),
        ("newer", 10, False),
        ("lost_delete", 25, False),
        ("lost_undelete", 35, True),
        ("in_bin", 8, True),
        ("purged_live", 3, False),  # hard-deleted in Salesforce, live in gold
        ("purged_deleted", 3, True),  # hard-deleted, gold keeps the deleted row: fine
        ("subsecond", 10.4, False),
        tz=tz,
    )
    drift, in_flight = find_drift(salesforce, gold, hard_deletes=False, horizon=None)
    assert in_flight == 0
    assert _kinds(drift) == {
        "newer": "stale",
        "lost_create": "missing",
        "bin_not_in_gold": "missing",
        "lost_delete": "extra",
        "purged_live": "extra",
        "lost_undelete": "stale",
    }
    details = dict(zip(drift["Id"].to_pylist(), drift["detail"].to_pylist(), strict=True))
    assert "hard-deleted" in details["purged_live"]
    assert "older than SystemModstamp 2025-01-01T00:00:20.000Z" in details["newer"]


def test_hard_deletes_do_not_want_recycle_bin_rows_in_gold() -> None:
    salesforce = _sf(("bin", 9, True), ("live", 5, False), rest=False)
    drift, _ = find_drift(salesforce, _gold(), hard_deletes=True, horizon=None)
    assert _kinds(drift) == {"live": "missing"}


def test_records_saved_after_the_horizon_are_in_flight() -> None:
    salesforce = _sf(("old", 10, False), ("new", 100, False), ("new_missing", 101, False))
    gold = _gold(("old", 5, False), ("new", 50, False))
    drift, in_flight = find_drift(
        salesforce, gold, hard_deletes=False, horizon=T0 + timedelta(seconds=60)
    )
    assert _kinds(drift) == {"old": "stale"}
    assert in_flight == 2


def test_nothing_to_compare() -> None:
    drift, in_flight = find_drift(_sf(), _gold(), hard_deletes=False, horizon=None)
    assert drift.num_rows == 0 and in_flight == 0
