"""What a CREATE and an UPDATE write: full rows, changed fields only, nulled vs unchanged,
compound children (struct and flattened), Account's Name union, diff-encoded long text."""

from __future__ import annotations

from datetime import timedelta

from ingest.emulator.textdiff import unified_diff
from pipelines.engines import LakeEngine
from tests.spark.gold.conftest import T0, Silver, day, fold, gold_of, resync_entries
from tests.spark.gold.helpers import assert_rows

OLD_TEXT = "\r\n".join(
    f"Paragraph {i}: the account's history, as typed in a browser." for i in range(60)
)
NEW_TEXT = OLD_TEXT.replace("Paragraph 7:", "Paragraph seven:")
LATER_TEXT = NEW_TEXT.replace("Paragraph 40:", "Paragraph forty:")


def test_create_writes_the_full_row_nulls_included(engine: LakeEngine) -> None:
    silver = Silver()
    silver.update("001A", 0, Phone="from an update of an unknown record")
    silver.create(
        "001A",
        1,
        Phone=None,
        NumberOfEmployees=5,
        LastModifiedDate=T0,
        SLAExpirationDate__c=day(2025, 12, 31),
        BillingAddress={"Street": "1 Main St", "City": "Lyon", "PostalCode": None, "Country": "FR"},
    )
    assert_rows(
        engine,
        gold_of(engine, silver),
        [
            "Id",
            "Phone",
            "NumberOfEmployees",
            "LastModifiedDate",
            "SLAExpirationDate__c",
            "BillingAddress",
            "_cdc_needs_resync",
        ],
        [
            (
                "001A",
                None,
                5,
                T0,
                day(2025, 12, 31),
                ("1 Main St", "Lyon", None, "FR"),
                False,
            )
        ],
    )


def test_update_changes_only_changed_fields(engine: LakeEngine) -> None:
    first = Silver()
    first.create("001A", 0, Phone="555-0100", NumberOfEmployees=10, Description="about")
    gold = gold_of(engine, first)
    batch = first.next_batch()
    # The event carries null for every field it did not change: they keep their values.
    batch.add("001A", "UPDATE", 5, changed=["NumberOfEmployees"], NumberOfEmployees=11)
    assert_rows(
        engine,
        gold_of(engine, batch, gold=gold),
        ["Id", "Phone", "NumberOfEmployees", "Description", "_cdc_last_change_type"],
        [("001A", "555-0100", 11, "about", "UPDATE")],
    )


def test_nulled_field_becomes_null_but_a_null_not_flagged_stays(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0, Phone="555-0100", Description="about")
    # Both null in the event; only Phone is in nulledFields.
    silver.add(
        "001A",
        "UPDATE",
        1,
        changed=["Phone", "LastModifiedDate"],
        nulled=["Phone"],
        LastModifiedDate=T0 + timedelta(seconds=1),
    )
    assert_rows(
        engine,
        gold_of(engine, silver),
        ["Id", "Phone", "Description", "LastModifiedDate"],
        [("001A", None, "about", T0 + timedelta(seconds=1))],
    )


def test_compound_children_update_individually(engine: LakeEngine) -> None:
    address = {"Street": "1 Main St", "City": "Lyon", "PostalCode": "69001", "Country": "FR"}
    silver = Silver()
    silver.create("001A", 0, BillingAddress=address)
    silver.create("001B", 0, BillingAddress=address)
    silver.create("001C", 0, BillingAddress=None)
    # The struct in the event holds only the changed children; the others are null there.
    moved = {"Street": None, "City": "Paris", "PostalCode": "75001", "Country": None}
    silver.add(
        "001A",
        "UPDATE",
        1,
        changed=["BillingAddress.City", "BillingAddress.PostalCode"],
        BillingAddress=moved,
    )
    silver.add(
        "001B",
        "UPDATE",
        1,
        changed=["BillingAddress.PostalCode"],
        nulled=["BillingAddress.PostalCode"],
    )
    silver.add(
        "001C",
        "UPDATE",
        1,
        changed=["BillingAddress.City"],
        BillingAddress={"Street": None, "City": "Nice", "PostalCode": None, "Country": None},
    )
    assert_rows(
        engine,
        gold_of(engine, silver),
        ["Id", "BillingAddress"],
        [
            ("001A", ("1 Main St", "Paris", "75001", "FR")),
            ("001B", ("1 Main St", "Lyon", None, "FR")),
            ("001C", (None, "Nice", None, None)),
        ],
    )


def test_a_compound_whose_children_all_become_null_is_null(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create(
        "001A",
        0,
        BillingAddress={"Street": None, "City": "Lyon", "PostalCode": None, "Country": "FR"},
    )
    silver.add(
        "001A",
        "UPDATE",
        1,
        changed=["BillingAddress.City", "BillingAddress.Country"],
        nulled=["BillingAddress.City", "BillingAddress.Country"],
    )
    assert_rows(engine, gold_of(engine, silver), ["Id", "BillingAddress"], [("001A", None)])


def test_flattened_compound_children_update_individually(engine: LakeEngine) -> None:
    silver = Silver(compounds="flattened")
    silver.create(
        "001A",
        0,
        BillingAddress_Street="1 Main St",
        BillingAddress_City="Lyon",
        BillingAddress_Country="FR",
    )
    silver.add("001A", "UPDATE", 1, changed=["BillingAddress.City"], BillingAddress_City="Paris")
    silver.add(
        "001A",
        "UPDATE",
        2,
        changed=["BillingAddress.Country"],
        nulled=["BillingAddress.Country"],
    )
    assert_rows(
        engine,
        gold_of(engine, silver),
        [
            "Id",
            "BillingAddress_Street",
            "BillingAddress_City",
            "BillingAddress_PostalCode",
            "BillingAddress_Country",
        ],
        [("001A", "1 Main St", "Paris", None, None)],
    )


def test_account_name_union(engine: LakeEngine) -> None:
    person = {"Salutation": "Ms.", "FirstName": "Ada", "LastName": "Lovelace"}
    silver = Silver()
    silver.create("001B", 0, Name="Acme")  # business account: the string branch
    silver.create("001P", 0, Name=None, Name_PersonName=person)  # person account
    silver.create("001S", 0, Name="Soon A Person")
    # A business account renamed: the top-level Name bit sets both branches from the event.
    silver.add("001B", "UPDATE", 1, changed=["Name"], Name="Acme Corp")
    # A person account's first name: only that child changes.
    silver.add(
        "001P",
        "UPDATE",
        1,
        changed=["Name.FirstName"],
        Name_PersonName={"Salutation": None, "FirstName": "Augusta", "LastName": None},
    )
    # A person name child on a business account: the record branch is in use now.
    silver.add(
        "001S",
        "UPDATE",
        1,
        changed=["Name.LastName"],
        Name_PersonName={"Salutation": None, "FirstName": None, "LastName": "Person"},
    )
    assert_rows(
        engine,
        gold_of(engine, silver),
        ["Id", "Name", "Name_PersonName"],
        [
            ("001B", "Acme Corp", None),
            ("001P", None, ("Ms.", "Augusta", "Lovelace")),
            ("001S", None, (None, None, "Person")),
        ],
    )


def test_account_name_union_flattened(engine: LakeEngine) -> None:
    silver = Silver(compounds="flattened")
    silver.create("001P", 0, Name_FirstName="Ada", Name_LastName="Lovelace")
    silver.add("001P", "UPDATE", 1, changed=["Name.FirstName"], Name_FirstName="Augusta")
    silver.create("001B", 0, Name="Acme")
    silver.add("001B", "UPDATE", 1, changed=["Name"], Name="Acme Corp")
    assert_rows(
        engine,
        gold_of(engine, silver),
        ["Id", "Name", "Name_Salutation", "Name_FirstName", "Name_LastName"],
        [("001P", None, None, "Augusta", "Lovelace"), ("001B", "Acme Corp", None, None, None)],
    )


def test_diff_is_rebuilt_from_gold_and_from_an_earlier_change_of_the_batch(
    engine: LakeEngine,
) -> None:
    first = Silver()
    first.create("001A", 0, Description=OLD_TEXT)
    gold = gold_of(engine, first)
    batch = first.next_batch()
    batch.update(
        "001A",
        1,
        Description=unified_diff(OLD_TEXT, NEW_TEXT, newline="\r\n"),
        diff=["Description"],
    )
    # The second diff's base is the value the first one produced in this same batch.
    batch.update(
        "001A",
        2,
        Description=unified_diff(NEW_TEXT, LATER_TEXT, newline="\r\n"),
        diff=["Description"],
    )
    folded = fold(engine, batch, gold=gold)
    assert_rows(
        engine,
        folded,
        ["Id", "Description", "_cdc_needs_resync", "_cdc_resync_reason"],
        [("001A", LATER_TEXT, False, None)],
    )
    assert engine.count(resync_entries(engine, folded)) == 0


def test_diff_without_a_previous_value_keeps_it_and_flags_the_record(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0, Description=None, Phone="555")
    update = silver.update(
        "001A",
        1,
        Description=unified_diff(OLD_TEXT, NEW_TEXT, newline="\r\n"),
        diff=["Description"],
    )
    folded = fold(engine, silver)
    assert_rows(
        engine,
        folded,
        ["Id", "Description", "Phone", "_cdc_needs_resync", "_cdc_resync_reason"],
        [("001A", None, "555", True, "diff_missing_base")],
    )
    assert_rows(
        engine,
        resync_entries(engine, folded),
        ["object", "record_id", "change_type", "reason", "event_id", "resolved_at"],
        [("Account", "001A", "UPDATE", "diff_missing_base", update["_cdc_event_id"], None)],
    )


def test_diff_whose_hash_does_not_match_keeps_the_previous_value(engine: LakeEngine) -> None:
    # Gold holds a value the diff was not made against (a missed change): the rebuilt text
    # fails the SHA-256, and gold keeps what it had rather than a wrong value.
    silver = Silver()
    edited = OLD_TEXT.replace("Paragraph 7:", "Paragraph 7 (edited):")
    silver.create("001A", 0, Description=edited)
    silver.update(
        "001A",
        1,
        Description=unified_diff(OLD_TEXT, NEW_TEXT, newline="\r\n"),
        diff=["Description"],
    )
    folded = fold(engine, silver)
    assert_rows(
        engine,
        folded,
        ["Id", "Description", "_cdc_needs_resync", "_cdc_resync_reason"],
        [("001A", edited, True, "diff_failed")],
    )
    (entry,) = engine.to_arrow(resync_entries(engine, folded)).to_pylist()
    assert entry["reason"] == "diff_failed"
    assert entry["detail"].startswith("Description: ")


def test_update_of_a_record_gold_never_saw_writes_what_it_knows(engine: LakeEngine) -> None:
    silver = Silver()
    silver.update("001A", 1, Phone="555-0199", NumberOfEmployees=3)
    folded = fold(engine, silver)
    assert_rows(
        engine,
        folded,
        [
            "Id",
            "Name",
            "Phone",
            "NumberOfEmployees",
            "_cdc_is_deleted",
            "_cdc_needs_resync",
            "_cdc_resync_reason",
        ],
        [("001A", None, "555-0199", 3, False, True, "missing_base")],
    )
    assert_rows(
        engine, resync_entries(engine, folded), ["record_id", "reason"], [("001A", "missing_base")]
    )


def test_unknown_changed_field_flags_the_record(engine: LakeEngine) -> None:
    silver = Silver()
    silver.create("001A", 0)
    silver.add("001A", "UPDATE", 1, changed=["Phone", "Nonexistent__c"], Phone="555")
    folded = fold(engine, silver)
    assert_rows(
        engine,
        folded,
        ["Id", "Phone", "_cdc_needs_resync", "_cdc_resync_reason"],
        [("001A", "555", True, "unknown_field")],
    )
    (entry,) = engine.to_arrow(resync_entries(engine, folded)).to_pylist()
    assert "Nonexistent__c" in entry["detail"]
