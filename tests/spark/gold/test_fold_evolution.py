"""Gold follows silver's schema evolution: a column silver gains becomes a gold column."""

from __future__ import annotations

from pipelines.engines import LakeEngine
from pipelines.gold.columns import CONTROL_COLUMNS, gold_schema
from pipelines.silver.columns import FieldLayout
from tests.spark.gold.conftest import Silver, fold, gold_changes, gold_of, layout
from tests.spark.gold.helpers import assert_rows

RATING = FieldLayout("Rating__c", "leaf", "double")


def test_a_new_silver_column_becomes_a_gold_column(engine: LakeEngine) -> None:
    before = Silver()
    before.create("001A", 0, Phone="555")
    before.create("001B", 0, Phone="555")
    gold = gold_of(engine, before)  # written before the field existed
    after = Silver(extra=(RATING,), batch=2)
    after.update("001A", 5, Rating__c=4.5)
    after.create("001C", 6, Rating__c=1.0)
    changed = gold_changes(engine, fold(engine, after, gold=gold))
    columns = engine.to_arrow(changed).column_names
    assert (
        columns
        == gold_schema(
            [
                f
                for f in layout(extra=(RATING,)).silver_schema().fields
                if not f.name.startswith("_") and f.name != "Id"
            ]
        ).names
    )
    assert_rows(
        engine,
        changed,
        ["Id", "Phone", "Rating__c"],
        [("001A", "555", 4.5), ("001C", "555-0100", 1.0)],
    )
    assert columns[-len(CONTROL_COLUMNS) - 1] == "Rating__c"


def test_gold_schema_types() -> None:
    schema = gold_schema(
        [
            f
            for f in layout().silver_schema().fields
            if f.name != "Id" and not f.name.startswith("_")
        ]
    )
    assert schema.names[:3] == ["Id", "Name", "Name_PersonName"]
    assert schema["BillingAddress"].dataType.simpleString() == (
        "struct<Street:string,City:string,PostalCode:string,Country:string>"
    )
    assert schema["SLAExpirationDate__c"].dataType.simpleString() == "date"
    assert schema["LastModifiedDate"].dataType.simpleString() == "timestamp"
    assert [
        (f.name, f.dataType.simpleString()) for f in schema.fields[-len(CONTROL_COLUMNS) :]
    ] == [
        ("_cdc_is_deleted", "boolean"),
        ("_cdc_deleted_at", "timestamp"),
        ("_cdc_needs_resync", "boolean"),
        ("_cdc_resync_reason", "string"),
        ("_cdc_last_change_type", "string"),
        ("_cdc_last_commit_ts", "timestamp"),
        ("_cdc_last_commit_number", "bigint"),
        ("_cdc_last_replay_id", "binary"),
        ("_cdc_last_event_id", "string"),
        ("_cdc_order_key", "string"),
        ("_cdc_updated_at", "timestamp"),
    ]
