"""Silver columns from schema versions: types, union over versions, and where each changed
field name lands (struct and flattened modes)."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import types as T

from ingest.schema import parse_event_schema
from pipelines.silver.columns import (
    CDC_COLUMNS,
    FieldLayout,
    LeafLayout,
    SilverLayout,
    build_layout,
    widen,
)
from tests.unit.silver.support import (
    ACCOUNT_V1,
    ACCOUNT_V2,
    ADDRESS,
    HEADER,
    ORDER_SHIPPED,
    change_schema,
    opt,
)

ADDRESS_STRUCT = T.StructType(
    [
        T.StructField("Street", T.StringType()),
        T.StructField("City", T.StringType()),
        T.StructField("PostalCode", T.StringType()),
        T.StructField("Latitude", T.DoubleType()),
        T.StructField("Longitude", T.DoubleType()),
    ]
)
PERSON_STRUCT = T.StructType(
    [T.StructField(n, T.StringType()) for n in ("Salutation", "FirstName", "LastName")]
)


def columns(layout: SilverLayout) -> dict[str, T.DataType]:
    return {f.name: f.dataType for f in layout.silver_schema().fields}


def test_struct_mode_types_and_order() -> None:
    layout = build_layout("Account", [ACCOUNT_V1])
    schema = layout.silver_schema()
    names = schema.names
    assert names[0] == "Id"
    assert names[1 : 1 + len(CDC_COLUMNS)] == [n for n, _ in CDC_COLUMNS]
    assert names[1 + len(CDC_COLUMNS) :] == [
        "Name",
        "Name_PersonName",
        "BillingAddress",
        "Phone",
        "AnnualRevenue",
        "NumberOfEmployees",
        "IsActive__c",
        "Description",
        "SLA_Date__c",
        "Open_At__c",
        "LastModifiedDate",
    ]
    types = columns(layout)
    assert types["Name"] == T.StringType()
    assert types["Name_PersonName"] == PERSON_STRUCT
    assert types["BillingAddress"] == ADDRESS_STRUCT
    assert types["AnnualRevenue"] == T.DoubleType()
    assert types["NumberOfEmployees"] == T.IntegerType()
    assert types["IsActive__c"] == T.BooleanType()
    assert types["SLA_Date__c"] == T.DateType()
    assert types["Open_At__c"] == T.StringType()  # Delta has no time-of-day type
    assert types["LastModifiedDate"] == T.TimestampType()
    assert types["_cdc_commit_timestamp"] == T.TimestampType()
    assert types["_cdc_commit_number"] == T.LongType()  # never floating point
    assert types["_cdc_replay_id"] == T.BinaryType()
    assert types["_cdc_changed_fields"] == T.ArrayType(T.StringType())
    # Decoding leaves dates and times as epoch milliseconds for Spark to convert.
    raw = dict(layout.raw_columns())
    assert raw["SLA_Date__c"] == raw["Open_At__c"] == raw["LastModifiedDate"] == T.LongType()
    assert layout.epoch_columns() == {
        "SLA_Date__c": "date",
        "Open_At__c": "time",
        "LastModifiedDate": "timestamp",
    }


def test_flattened_mode_has_one_column_per_child() -> None:
    layout = build_layout("Account", [ACCOUNT_V1], compounds="flattened")
    types = columns(layout)
    assert "BillingAddress" not in types and "Name_PersonName" not in types
    assert types["BillingAddress_City"] == T.StringType()
    assert types["BillingAddress_Latitude"] == T.DoubleType()
    assert types["Name"] == T.StringType()
    assert types["Name_FirstName"] == T.StringType()
    names = layout.silver_schema().names
    assert (
        names.index("Name") < names.index("Name_Salutation") < names.index("BillingAddress_Street")
    )


def test_union_over_versions_appends_new_fields() -> None:
    layout = build_layout("Account", [ACCOUNT_V1, ACCOUNT_V2])
    fields = [f.name for f in layout.fields]
    # Fields of the oldest version keep their place; what v2 adds comes last.
    assert fields[-2:] == ["Tier__c", "ShippingAddress"]
    assert fields[: len(fields) - 2] == [f.name for f in ACCOUNT_V1.fields[1:]]
    assert layout.schema_ids == (ACCOUNT_V1.schema_id, ACCOUNT_V2.schema_id)


def test_column_for_in_both_modes() -> None:
    struct = build_layout("Account", [ACCOUNT_V1, ACCOUNT_V2])
    flat = build_layout("Account", [ACCOUNT_V1, ACCOUNT_V2], compounds="flattened")
    assert struct.column_for("Phone") == flat.column_for("Phone") == "Phone"
    assert struct.column_for("BillingAddress.City") == "BillingAddress.City"
    assert flat.column_for("BillingAddress.City") == "BillingAddress_City"
    assert struct.column_for("Name") == flat.column_for("Name") == "Name"
    assert struct.column_for("Name.FirstName") == "Name_PersonName.FirstName"
    assert flat.column_for("Name.FirstName") == "Name_FirstName"
    assert struct.columns_for("Name") == ("Name", "Name_PersonName")
    assert flat.columns_for("Name") == (
        "Name",
        "Name_Salutation",
        "Name_FirstName",
        "Name_LastName",
    )
    assert struct.columns_for("ShippingAddress") == ("ShippingAddress",)
    assert flat.columns_for("ShippingAddress")[0] == "ShippingAddress_Street"
    assert flat.columns_for("ShippingAddress.City") == ("ShippingAddress_City",)
    with pytest.raises(KeyError, match="use columns_for"):
        flat.column_for("BillingAddress")
    with pytest.raises(KeyError, match="Account has no field 'Fax'"):
        struct.column_for("Fax")
    with pytest.raises(KeyError, match="BillingAddress has no child 'Zip'"):
        struct.column_for("BillingAddress.Zip")
    with pytest.raises(KeyError, match=r"Account\.Phone is not a compound field"):
        struct.column_for("Phone.Area")


def test_every_flattened_column_is_a_silver_column() -> None:
    for compounds in ("struct", "flattened"):
        layout = build_layout("Account", [ACCOUNT_V2], compounds=compounds)  # type: ignore[arg-type]
        names = set(layout.silver_schema().names)
        for f in ACCOUNT_V2.fields[1:]:
            for column in layout.columns_for(f.name):
                assert column.split(".")[0] in names
            for child in f.children:
                assert layout.column_for(f"{f.name}.{child.name}").split(".")[0] in names


def test_platform_event_columns() -> None:
    layout = build_layout("Order_Shipped__e", [ORDER_SHIPPED])
    assert not layout.change_events
    assert layout.silver_schema().names == [
        "_cdc_event_id",
        "_cdc_replay_id",
        "_cdc_schema_id",
        "_cdc_bronze_batch_id",
        "_cdc_bronze_batch_seq",
        "CreatedDate",
        "CreatedById",
        "Weight__c",
        "Delivery_Date__c",
    ]
    types = columns(layout)
    assert types["CreatedDate"] == T.TimestampType()
    assert types["Delivery_Date__c"] == T.DateType()


def test_types_widen_when_versions_disagree() -> None:
    header = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}
    v1 = change_schema(
        "Widget__c",
        [
            header,
            opt("Count__c", "int", "Data:Integer"),
            opt("Flag__c", "boolean", "Data:Boolean"),
            opt("When__c", "long", "Data:DateOnly"),
        ],
    )
    v2 = change_schema(
        "Widget__c",
        [
            header,
            opt("Count__c", "double", "Data:Double"),
            opt("Flag__c", "string", "Data:DynamicEnum"),  # a checkbox turned picklist
            opt("When__c", "long", "Data:DateTime"),
        ],
    )
    types = columns(build_layout("Widget__c", [v1, v2]))
    assert types["Count__c"] == T.DoubleType()
    assert types["Flag__c"] == T.StringType()
    assert types["When__c"] == T.TimestampType()
    assert widen("int", "long") == "long"
    assert widen("boolean", "date") == "string"


def test_compound_children_are_the_union_over_versions() -> None:
    header = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}
    older = dict(ADDRESS, fields=[*ADDRESS["fields"], {"name": "Xyz", "type": ["null", "string"]}])
    v1 = change_schema("Widget__c", [header, opt("Where__c", older, "Data:Address")])
    v2 = change_schema("Widget__c", [header, opt("Where__c", ADDRESS, "Data:Address")])
    (where,) = build_layout("Widget__c", [v1, v2]).fields
    assert where.child_names() == ("Street", "City", "PostalCode", "Latitude", "Longitude", "Xyz")


def test_refuses_layouts_that_cannot_be_tables() -> None:
    with pytest.raises(ValueError, match="no schema version"):
        build_layout("Account", [])
    with pytest.raises(ValueError, match="mix change events and platform events"):
        build_layout("Account", [ACCOUNT_V1, ORDER_SHIPPED])
    with pytest.raises(ValueError, match="compounds must be 'struct' or 'flattened'"):
        build_layout("Account", [ACCOUNT_V1], compounds="nested")  # type: ignore[arg-type]
    # Two fields that flatten to one column name (Delta names are case-insensitive).
    clash = (
        FieldLayout("Billing", "struct", children=(LeafLayout("City", "string"),)),
        FieldLayout("billing_city", "leaf", "string"),
    )
    SilverLayout("Widget__c", True, clash)  # fine as structs
    with pytest.raises(ValueError, match="both become column 'billing_city'"):
        SilverLayout("Widget__c", True, clash, "flattened")
    with pytest.raises(ValueError, match="reserves for its own columns"):
        SilverLayout("Widget__c", True, (FieldLayout("_cdc_entity", "leaf", "string"),))


def test_a_schema_without_doc_annotations_still_maps() -> None:
    raw = {
        "type": "record",
        "name": "Thing__e",
        "fields": [
            {"name": "Blob__c", "type": ["null", "bytes"], "default": None},
            {"name": "Level__c", "type": ["null", {"type": "enum", "name": "L", "symbols": ["A"]}]},
            {"name": "Ratio__c", "type": ["null", "float"], "default": None},
            {"name": "Tags__c", "type": ["null", {"type": "array", "items": "string"}]},
        ],
    }
    layout = build_layout("Thing__e", [parse_event_schema(json.dumps(raw))])
    types = columns(layout)
    assert types["Blob__c"] == T.BinaryType()
    assert types["Level__c"] == T.StringType()
    assert types["Ratio__c"] == T.DoubleType()
    assert types["Tags__c"] == T.StringType()  # kept as JSON text
