"""The snapshot side of bootstrap and re-sync without a JVM: the order key of a snapshot row
(checked with gold's own fold), REST values as gold's typed columns, and the SOQL emitted."""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.errors import RestError
from ingest.schema import FieldInfo
from pipelines.bootstrap import SNAPSHOT_CHANGE_TYPE, rest_row, snapshot_key, snapshot_soql
from pipelines.gold.columns import LAST_CHANGE_TYPE, ORDER_KEY
from pipelines.gold.order_keys import encode_order_key
from pipelines.gold.plan import FoldPlan, Target, order_columns
from pipelines.silver.columns import FieldLayout, LeafLayout, SilverLayout
from pipelines.spec import DEFAULT_SEQUENCE_BY
from tests.unit.gold.fold_reference import fold_record

UTC = timezone.utc
AT = datetime(2026, 5, 1, tzinfo=UTC)

_keys = st.tuples(
    st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
    st.integers(min_value=0, max_value=2**62),
    st.text(max_size=6),
    st.integers(min_value=0, max_value=100),
    st.integers(min_value=1, max_value=10**6),
    st.integers(min_value=0, max_value=10**4),
)


@settings(deadline=None, max_examples=300)
@given(_keys, _keys)
def test_a_snapshot_key_sits_between_its_base_and_every_later_key(
    base: tuple[Any, ...], other: tuple[Any, ...]
) -> None:
    k = encode_order_key(base)
    k2 = encode_order_key(other)
    snap = snapshot_key(k, "UPDATE")
    assert k < snap
    if other > base:
        assert snap < k2
    else:
        assert k2 <= k < snap
    # A snapshot over a snapshot keeps its key; no gold row: below every event.
    assert snapshot_key(snap, SNAPSHOT_CHANGE_TYPE) == snap
    assert snapshot_key(None, None) == "" < k2


def _change(
    ts: int, seq: int, phone: str, *, batch: int, event: str, change: str = "UPDATE"
) -> dict[str, Any]:
    return {
        "Id": "001000000000001AAA",
        "_cdc_change_type": change,
        "_cdc_commit_timestamp": datetime.fromtimestamp(ts, UTC),
        "_cdc_commit_number": ts * 10,
        "_cdc_transaction_key": f"tx-{ts}",
        "_cdc_sequence_number": seq,
        "_cdc_bronze_batch_id": batch,
        "_cdc_bronze_batch_seq": seq,
        "_cdc_event_id": event,
        "_cdc_replay_id": event.encode(),
        "_cdc_changed_fields": ["Phone", "LastModifiedDate"],
        "_cdc_nulled_fields": [],
        "_cdc_diff_fields": [],
        "_cdc_is_wildcard": False,
        "Phone": phone,
    }


def test_gold_folds_later_events_onto_a_snapshot_row_and_ignores_earlier_ones() -> None:
    plan = FoldPlan(
        object_name="Account",
        targets={"Phone": (Target("Phone"),), "LastModifiedDate": (Target("LastModifiedDate"),)},
        processed_at=AT,
    )
    body = ["Phone", "LastModifiedDate"]
    applied = _change(1_700_000_100, 1, "applied before the snapshot", batch=3, event="e1")
    key = encode_order_key(applied.get(c) for c in order_columns(DEFAULT_SEQUENCE_BY))
    snapshot = {
        "Id": applied["Id"],
        "Phone": "read over REST",
        "LastModifiedDate": None,
        "_cdc_is_deleted": False,
        "_cdc_needs_resync": False,
        LAST_CHANGE_TYPE: SNAPSHOT_CHANGE_TYPE,
        ORDER_KEY: snapshot_key(key, "UPDATE"),
        # Kept from the gold row the snapshot replaced.
        "_cdc_last_event_id": "e1",
    }
    earlier = _change(1_700_000_000, 1, "older", batch=2, event="e0")
    # Delivered again (a replay from an older position): at or before the recorded position.
    replayed = {**applied, "_cdc_bronze_batch_id": 9}
    folded = fold_record(
        plan, body, applied["Id"], gold=snapshot, tombstone=None, changes=[earlier, replayed]
    )
    assert folded.gold is None and folded.ignored == 2
    later_same_tx = _change(1_700_000_100, 2, "same transaction, later", batch=4, event="e2")
    later = _change(1_700_000_200, 1, "after the snapshot", batch=5, event="e3")
    folded = fold_record(
        plan, body, applied["Id"], gold=snapshot, tombstone=None, changes=[later_same_tx]
    )
    assert folded.gold == "upsert" and folded.row is not None
    assert folded.row["Phone"] == "same transaction, later"
    folded = fold_record(
        plan,
        body,
        applied["Id"],
        gold=snapshot,
        tombstone=None,
        changes=[earlier, replayed, later, later_same_tx],
    )
    assert folded.row is not None and folded.row["Phone"] == "after the snapshot"
    assert folded.applied == 2 and folded.ignored == 2


ADDRESS = FieldLayout(
    "BillingAddress",
    "struct",
    children=(LeafLayout("City", "string"), LeafLayout("Latitude", "double")),
)
NAME = FieldLayout(
    "Name",
    "switchable",
    "string",
    (LeafLayout("FirstName", "string"), LeafLayout("LastName", "string")),
)
LEAVES = (
    FieldLayout("Phone", "leaf", "string"),
    FieldLayout("NumberOfEmployees", "leaf", "int"),
    FieldLayout("AnnualRevenue", "leaf", "double"),
    FieldLayout("CreatedDate", "leaf", "timestamp"),
    FieldLayout("PersonBirthdate", "leaf", "date"),
    FieldLayout("Opens__c", "leaf", "time"),
    FieldLayout("IsVip__c", "leaf", "boolean"),
)
INFOS = {
    "Name": FieldInfo("Name", 1, None, kind="switchable_name", sf_type="Switchable_PersonName"),
    "BillingAddress": FieldInfo("BillingAddress", 2, None, kind="compound", sf_type="Address"),
}


def _layout(compounds: str = "struct") -> SilverLayout:
    return SilverLayout("Account", True, (NAME, *LEAVES, ADDRESS), compounds)  # type: ignore[arg-type]


def _record(**values: Any) -> dict[str, Any]:
    record = {
        "attributes": {"type": "Account", "url": "/services/data/v62.0/sobjects/Account/x"},
        "Id": "001000000000001AAA",
        "IsDeleted": False,
        "Name": "Acme",
        "FirstName": None,
        "LastName": None,
        "IsPersonAccount": False,
        "Phone": "+1 555",
        "NumberOfEmployees": 12,
        "AnnualRevenue": 5,
        "CreatedDate": "2024-03-05T10:11:12.000+0000",
        "PersonBirthdate": "1990-07-08",
        "Opens__c": "08:30:00.000Z",
        "IsVip__c": True,
        "BillingAddress": {"city": "Lyon", "latitude": 45.76},
    }
    record.update(values)
    return record


def test_rest_values_become_gold_columns() -> None:
    row = rest_row(_layout(), INFOS, _record())
    assert row == {
        "Id": "001000000000001AAA",
        "Name": "Acme",
        "Name_PersonName": None,
        "Phone": "+1 555",
        "NumberOfEmployees": 12,
        "AnnualRevenue": 5.0,
        "CreatedDate": datetime(2024, 3, 5, 10, 11, 12, tzinfo=UTC),
        "PersonBirthdate": date(1990, 7, 8),
        "Opens__c": "08:30:00.000",
        "IsVip__c": True,
        "BillingAddress": {"City": "Lyon", "Latitude": 45.76},
    }
    person = rest_row(
        _layout(),
        INFOS,
        _record(
            Name="Ada Lovelace",
            FirstName="Ada",
            LastName="Lovelace",
            IsPersonAccount=True,
            BillingAddress=None,
        ),
    )
    assert person["Name"] is None
    assert person["Name_PersonName"] == {"FirstName": "Ada", "LastName": "Lovelace"}
    assert person["BillingAddress"] is None


def test_flattened_compounds_land_in_their_own_columns() -> None:
    row = rest_row(_layout("flattened"), INFOS, _record(FirstName="x", IsPersonAccount=True))
    assert row["BillingAddress_City"] == "Lyon"
    assert row["BillingAddress_Latitude"] == 45.76
    assert row["Name"] is None and row["Name_FirstName"] == "x" and row["Name_LastName"] is None


def test_a_value_of_the_wrong_shape_is_an_error_naming_it() -> None:
    with pytest.raises(RestError, match=r"Account.NumberOfEmployees .* expected a int .*'many'"):
        rest_row(_layout(), INFOS, _record(NumberOfEmployees="many"))
    with pytest.raises(RestError, match="expected a nested object"):
        rest_row(_layout(), INFOS, _record(BillingAddress="Lyon"))


def test_the_soql_reads_every_column_and_only_the_ids_asked() -> None:
    soql = snapshot_soql(_layout(), INFOS)
    assert soql == (
        "SELECT Id, IsDeleted, Name, FirstName, LastName, IsPersonAccount, Phone, "
        "NumberOfEmployees, AnnualRevenue, CreatedDate, PersonBirthdate, Opens__c, IsVip__c, "
        "BillingAddress FROM Account"
    )
    ids = ["001000000000001AAA", "001000000000002AAA"]
    assert snapshot_soql(_layout(), INFOS, ids).endswith(
        "FROM Account WHERE Id IN ('001000000000001AAA', '001000000000002AAA')"
    )
    with pytest.raises(ValueError, match="alphanumeric"):
        snapshot_soql(_layout(), INFOS, ["x') OR Name LIKE ('%"])
