from __future__ import annotations

import base64
import hashlib
import json

import pytest

from ingest.schema import parse_event_schema, schema_id

HEADER = {
    "name": "ChangeEventHeader",
    "doc": "Data:ComplexValueType",
    "type": {
        "type": "record",
        "name": "ChangeEventHeader",
        "fields": [
            {"name": "entityName", "type": "string"},
            {"name": "recordIds", "type": {"type": "array", "items": "string"}},
            {
                "name": "changeType",
                "type": {
                    "type": "enum",
                    "name": "ChangeType",
                    "namespace": "",
                    "symbols": ["CREATE", "UPDATE", "DELETE", "UNDELETE"],
                },
            },
            {"name": "changedFields", "type": {"type": "array", "items": "string"}},
        ],
    },
}


def _opt(name: str, t: object, doc: str | None = None) -> dict[str, object]:
    f: dict[str, object] = {"name": name, "type": ["null", t], "default": None}
    if doc:
        f["doc"] = doc
    return f


ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [_opt("Street", "string"), _opt("City", "string"), _opt("Latitude", "double")],
}

SCHEMA = {
    "type": "record",
    "name": "WidgetChangeEvent",
    "namespace": "com.sforce.eventbus",
    "fields": [
        HEADER,
        {
            "name": "Name",
            "type": [
                "null",
                "string",
                {
                    "type": "record",
                    "name": "Switchable_PersonName",
                    "fields": [_opt("FirstName", "string"), _opt("LastName", "string")],
                },
            ],
            "doc": "Data:Switchable_PersonName",
            "default": None,
        },
        _opt("BillingAddress", ADDRESS, "Data:Address"),
        _opt("ShippingAddress", "Address", "Data:Address"),
        _opt("Ship_Date__c", "long", "Data:DateOnly:00N000000000001"),
        _opt("CreatedDate", "long", "CreatedDate:DateTime"),
        _opt("Open_At__c", "long", "Data:TimeOnly:00N000000000002"),
        _opt("Description", "string", "Data:StringPlusClob"),
        _opt("OwnerId", "string", "ForeignKey:EntityId"),
        _opt("Amount", "double", "Data:Currency"),
        _opt("Tags__c", "string", "Data:MultiEnum"),
        _opt("Employees", "int", "Data:Integer"),
        _opt("Active__c", "boolean", "Data:Boolean"),
    ],
}


def test_fields_are_indexed_in_declaration_order_with_kinds_from_doc() -> None:
    es = parse_event_schema(json.dumps(SCHEMA))
    assert es.is_change_event
    assert es.entity_name == "Widget"
    assert es.name == "com.sforce.eventbus.WidgetChangeEvent"
    kinds = {f.name: (f.index, f.kind) for f in es.fields}
    assert kinds == {
        "ChangeEventHeader": (0, "header"),
        "Name": (1, "switchable_name"),
        "BillingAddress": (2, "compound"),
        "ShippingAddress": (3, "compound"),
        "Ship_Date__c": (4, "date"),
        "CreatedDate": (5, "datetime"),
        "Open_At__c": (6, "time"),
        "Description": (7, "long_text"),
        "OwnerId": (8, "id"),
        "Amount": (9, "double"),
        "Tags__c": (10, "multi_picklist"),
        "Employees": (11, "int"),
        "Active__c": (12, "boolean"),
    }


def test_named_records_referenced_later_resolve_to_their_children() -> None:
    es = parse_event_schema(json.dumps(SCHEMA))
    shipping = es.field("ShippingAddress")
    assert [(c.index, c.name) for c in shipping.children] == [
        (0, "Street"),
        (1, "City"),
        (2, "Latitude"),
    ]
    assert shipping.is_compound and not es.field("ChangeEventHeader").is_compound
    assert [c.name for c in es.field("Name").children] == ["FirstName", "LastName"]
    assert es.field("Description").is_diffable
    with pytest.raises(KeyError, match="no field 'Nope'"):
        es.field("Nope")


def test_schema_id_is_unpadded_base64url_md5_of_the_canonical_form() -> None:
    # Canonical form by hand for a tiny record: full names, no doc/default, no whitespace.
    schema = {
        "type": "record",
        "name": "E",
        "namespace": "n",
        "doc": "ignored",
        "fields": [{"name": "a", "type": "long", "doc": "x", "default": 1}],
    }
    canonical = '{"name":"n.E","type":"record","fields":[{"name":"a","type":"long"}]}'
    expected = base64.urlsafe_b64encode(hashlib.md5(canonical.encode()).digest()).decode()
    assert schema_id(schema) == expected.rstrip("=")
    assert len(schema_id(schema)) == 22
    # doc-only edits keep the id; a new field changes it
    assert schema_id({**schema, "doc": "other"}) == schema_id(schema)
    grown = {**schema, "fields": [*schema["fields"], {"name": "b", "type": "string"}]}
    assert schema_id(grown) != schema_id(schema)


def test_parsed_schema_is_cached_on_the_instance() -> None:
    es = parse_event_schema(json.dumps(SCHEMA))
    assert es.parsed is es.parsed


def test_not_a_record_is_rejected() -> None:
    with pytest.raises(ValueError, match="must be an Avro record"):
        parse_event_schema('{"type": "enum", "name": "X", "symbols": ["A"]}')
