from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
from typing import Any

import pytest

from ingest.emulator.catalogue import (
    default_catalogue,
    load_schema,
    schema_files,
    schema_versions,
    topic_for_schema,
)
from ingest.emulator.topics import CHANGE_EVENTS_CHANNEL
from ingest.schema import schema_id

HEADER_FIELDS = [
    ("entityName", "string"),
    ("recordIds", {"type": "array", "items": "string"}),
    ("changeType", "ChangeType"),
    ("changeOrigin", "string"),
    ("transactionKey", "string"),
    ("sequenceNumber", "int"),
    ("commitTimestamp", "long"),
    ("commitNumber", "long"),
    ("commitUser", "string"),
    ("nulledFields", {"type": "array", "items": "string"}),
    ("diffFields", {"type": "array", "items": "string"}),
    ("changedFields", {"type": "array", "items": "string"}),
]
CHANGE_TYPES = [
    "CREATE",
    "UPDATE",
    "DELETE",
    "UNDELETE",
    "GAP_CREATE",
    "GAP_UPDATE",
    "GAP_DELETE",
    "GAP_UNDELETE",
    "GAP_OVERFLOW",
    "SNAPSHOT",
]
DOC = re.compile(
    r"^(Data|ForeignKey|CreatedDate|CreatedBy|ExternalForeignKey):[A-Za-z_]+(:00N\w{12})?$"
)


def raw(filename: str) -> dict[str, Any]:
    text = resources.files("ingest.emulator").joinpath("schemas", filename).read_text()
    return json.loads(text)  # type: ignore[no-any-return]


CHANGE_EVENT_FILES = [f for f in schema_files() if "ChangeEvent" in f]


def test_shipped_files() -> None:
    assert schema_files() == (
        "AccountChangeEvent.avsc",
        "AccountChangeEvent.v2.avsc",
        "ContactChangeEvent.avsc",
        "Invoice__ChangeEvent.avsc",
        "OpportunityChangeEvent.avsc",
        "Order_Shipped__e.avsc",
    )


@pytest.mark.parametrize("filename", CHANGE_EVENT_FILES)
def test_change_event_shape(filename: str) -> None:
    schema = raw(filename)
    assert schema["type"] == "record"
    assert schema["namespace"] == "com.sforce.eventbus"
    assert schema["name"].endswith("ChangeEvent")
    header = schema["fields"][0]
    assert header["name"] == "ChangeEventHeader"
    assert header["doc"] == "Data:ComplexValueType"
    fields = header["type"]["fields"]
    simplified = [
        (
            f["name"],
            f["type"]["name"] if isinstance(f["type"], dict) and "name" in f["type"] else f["type"],
        )
        for f in fields
    ]
    assert simplified == HEADER_FIELDS
    assert fields[2]["type"]["symbols"] == CHANGE_TYPES
    for f in schema["fields"][1:]:
        assert f["default"] is None, f["name"]
        assert isinstance(f["type"], list) and f["type"][0] == "null", f["name"]
        assert DOC.match(f["doc"]), (f["name"], f["doc"])
        assert f["name"].endswith("__c") == (len(f["doc"].split(":")) == 3), f["name"]
    assert "logicalType" not in json.dumps(schema)


@pytest.mark.parametrize("filename", CHANGE_EVENT_FILES)
def test_named_records_are_defined_once_then_referenced(filename: str) -> None:
    definitions: dict[str, int] = {}
    references: dict[str, int] = {}

    def walk(t: Any) -> None:
        if isinstance(t, list):
            for b in t:
                walk(b)
        elif isinstance(t, dict):
            if t.get("type") in ("record", "enum"):
                definitions[t["name"]] = definitions.get(t["name"], 0) + 1
                for f in t.get("fields", []):
                    walk(f["type"])
            elif t.get("type") == "array":
                walk(t["items"])
        elif isinstance(t, str) and t[0].isupper():
            references[t] = references.get(t, 0) + 1

    walk(raw(filename))
    assert all(count == 1 for count in definitions.values()), definitions
    assert set(references) <= set(definitions)


def test_account_name_switchable_and_compounds() -> None:
    account = {f["name"]: f for f in raw("AccountChangeEvent.avsc")["fields"]}
    name = account["Name"]
    assert name["doc"] == "Data:Switchable_PersonName"
    assert name["type"][:2] == ["null", "string"]
    assert name["type"][2]["name"] == "Switchable_PersonName"
    assert account["BillingAddress"]["type"][1]["name"] == "Address"
    assert account["ShippingAddress"]["type"] == ["null", "Address"]
    assert account["PersonMailingAddress"]["type"] == ["null", "Address"]
    assert account["HQ_Location__c"]["type"][1]["name"] == "Location"
    contact = {f["name"]: f for f in raw("ContactChangeEvent.avsc")["fields"]}
    assert contact["Name"]["type"][1]["name"] == "PersonName"
    assert contact["OtherAddress"]["type"] == ["null", "Address"]


def test_field_types_by_annotation() -> None:
    invoice = load_schema("Invoice__ChangeEvent.avsc")
    kinds = {f.name: (f.kind, f.sf_type) for f in invoice.fields}
    assert kinds["Issue_Date__c"] == ("date", "DateOnly")
    assert kinds["Paid_At__c"] == ("datetime", "DateTime")
    assert kinds["Delivery_Window__c"] == ("time", "TimeOnly")
    assert kinds["Amount__c"] == ("double", "Currency")
    assert kinds["Tax_Rate__c"] == ("double", "Percent")
    assert kinds["Channels__c"] == ("multi_picklist", "MultiEnum")
    assert kinds["Notes__c"] == ("long_text", "StringPlusClob")
    assert kinds["Terms__c"] == ("long_text", "HtmlStringPlusClob")
    assert kinds["Is_Paid__c"] == ("boolean", "Boolean")
    assert kinds["Account__c"] == ("id", "EntityId")
    assert kinds["Ship_To__c"] == ("compound", "Location")
    assert kinds["CreatedDate"] == ("datetime", "DateTime")
    assert invoice.entity_name == "Invoice__c"
    opportunity = {f.name: f for f in load_schema("OpportunityChangeEvent.avsc").fields}
    assert opportunity["CloseDate"].kind == "date"
    assert opportunity["Amount"].sf_type == "Currency"
    assert opportunity["Probability"].sf_type == "Percent"
    assert opportunity["Description"].kind == "long_text"
    contact = {f.name: f for f in load_schema("ContactChangeEvent.avsc").fields}
    assert contact["Birthdate"].kind == "date"
    assert contact["MailingAddress"].kind == "compound"


def test_account_v2_inserts_record_type_and_adds_a_custom_field() -> None:
    v1, v2 = schema_versions("Account")
    names1 = [f.name for f in v1.fields]
    names2 = [f.name for f in v2.fields]
    assert names2.index("RecordTypeId") == 3 < names2.index("ParentId")
    assert names2 == [*names1[:3], "RecordTypeId", *names1[3:], "Tier__c"]
    assert v1.schema_id != v2.schema_id
    assert v2.field("Phone").index == v1.field("Phone").index + 1


def test_platform_event_shape() -> None:
    schema = raw("Order_Shipped__e.avsc")
    assert schema["name"] == "Order_Shipped__e"
    created, created_by, *custom = schema["fields"]
    assert created == {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"}
    assert created_by == {"name": "CreatedById", "type": "string", "doc": "CreatedBy:EntityId"}
    assert all(f["type"][0] == "null" and f["default"] is None for f in custom)
    assert all(f["name"].endswith("__c") for f in custom)
    assert schema["uuid"] == schema_id(schema) == load_schema("Order_Shipped__e.avsc").schema_id


def test_schemas_are_served_compact_and_ids_are_fingerprints() -> None:
    for filename in schema_files():
        schema = load_schema(filename)
        assert " " not in schema.json.replace("Customer - ", "")
        assert schema.schema_id == schema_id(raw(filename))
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", schema.schema_id)
    assert len({load_schema(f).schema_id for f in schema_files()}) == len(schema_files())


# SHA-256 of the files and schema ids of the real-org schemas this catalogue was modelled on
# (recorded here: tests never read the reference material itself).
OBSERVED_FILE_SHA256 = {
    "6d3a9c1d34a4a63c99feb3bb803a37af393fedb68d6a748f39c8c13fbf7c3870",
    "a0202ce29870ef360cfab817805acf0e2e4d8fcd097793255ba0321fb6500a94",
    "8329cc236c72995195ae9707118384e4b656be4456c07e4fd08bd5473891faa3",
    "f0c9f7cac8f2fae97763a7194ae1311e5db1a04bc0006ed1de4b6e1f51f19f90",
    "459dbae83f4c52a9713e29be81053022853c18b0f70a40ab725afe7312ca4ec7",
    "eb68f55bf1d8e7e4537e3d81a58dfaba41702d82cf0db876618c44bd22508e88",
    "4d5f7b10a0fe611a27187b03f7eadc15c0cb8fff7dd2f37468659ad89bf448ef",
    "58f91af070618428d5c34a0ed038b31f3cb7c5c7350c22d5af0327aaa90a88d9",
    "789d58365b867534182b9343e3ff38ca7f83c3aa6bf2728a5cecd82c6d3371f1",
}
OBSERVED_SCHEMA_IDS = {
    "9Qv9Gof5_3c62MYN2QKqyg",
    "i8wgJwwM-AVcDbFkbRl5Nw",
    "YHKH1xWTqwF24lvYNGguGA",
    "Q8gDmo90TsU92qnJqea7RA",
}


def test_schema_files_are_our_own() -> None:
    for filename in schema_files():
        data = resources.files("ingest.emulator").joinpath("schemas", filename).read_bytes()
        assert hashlib.sha256(data).hexdigest() not in OBSERVED_FILE_SHA256, filename
        assert load_schema(filename).schema_id not in OBSERVED_SCHEMA_IDS, filename


def test_default_catalogue_topics_and_fresh_instances() -> None:
    catalogue = default_catalogue()
    assert set(catalogue.topics) == {
        "/data/AccountChangeEvent",
        "/data/ContactChangeEvent",
        "/data/OpportunityChangeEvent",
        "/data/Invoice__ChangeEvent",
        "/event/Order_Shipped__e",
        CHANGE_EVENTS_CHANNEL,
    }
    account = catalogue.topic("/data/AccountChangeEvent")
    assert account.entity == "Account" and account.kind == "change_events"
    assert len(account.schemas) == 1 and account.current_schema == schema_versions("Account")[0]
    event = catalogue.topic("/event/Order_Shipped__e")
    assert event.kind == "platform_event" and event.publishable
    assert catalogue.topic_for_entity("Invoice__c").name == "/data/Invoice__ChangeEvent"
    catalogue.add_version("/data/AccountChangeEvent", schema_versions("Account")[1])
    assert len(default_catalogue().topic("/data/AccountChangeEvent").schemas) == 1
    assert topic_for_schema(load_schema("Order_Shipped__e.avsc")).name == "/event/Order_Shipped__e"


def test_unknown_names_give_clear_errors() -> None:
    with pytest.raises(KeyError, match=r"no shipped schema for entity 'Lead'.*Account"):
        schema_versions("Lead")
    with pytest.raises(ValueError, match=r"<Name>\.avsc"):
        load_schema("notes.txt")
    with pytest.raises(FileNotFoundError, match=r"shipped schemas: AccountChangeEvent.avsc"):
        load_schema("LeadChangeEvent.avsc")
