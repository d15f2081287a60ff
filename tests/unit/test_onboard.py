"""Object files rendered from event schemas load as the objects those schemas describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.emulator.catalogue import schema_files
from ingest.schema import EventSchema, parse_event_schema
from pipelines.onboard import object_file_name, object_yaml
from pipelines.spec import load_object

SCHEMAS = Path(__file__).resolve().parents[2] / "ingest" / "emulator" / "schemas"
CONF_OBJECTS = Path(__file__).resolve().parents[2] / "conf" / "objects"


def _schema(filename: str) -> EventSchema:
    return parse_event_schema((SCHEMAS / filename).read_text())


@pytest.mark.parametrize("filename", schema_files())
def test_every_shipped_schema_renders_a_file_equal_to_the_shipped_one(
    filename: str, tmp_path: Path
) -> None:
    schema = _schema(filename)
    path = tmp_path / object_file_name(schema)
    path.write_text(object_yaml(schema))
    generated = load_object(path)
    shipped = load_object(CONF_OBJECTS / object_file_name(schema))
    assert generated == shipped


def test_the_file_names_the_fields_and_their_kinds() -> None:
    text = object_yaml(_schema("Invoice__ChangeEvent.avsc"))
    lines = text.splitlines()
    assert lines[0] == "# yaml-language-server: $schema=../schema/object.schema.json"
    assert "object: Invoice__c" in lines
    assert "kind: change_events" in lines
    assert not any(line.startswith("topic:") for line in lines)
    assert "Ship_To__c (compound)" in text
    assert "Notes__c (long_text)" in text
    assert "ChangeEventHeader" not in text
    assert all(len(line) <= 100 for line in lines if line.startswith("#   ") and "(" in line)


def test_a_channel_is_written_as_the_topic(tmp_path: Path) -> None:
    schema = _schema("Order_Shipped__e.avsc")
    path = tmp_path / "order_shipped.yml"
    path.write_text(object_yaml(schema, topic="/event/Logistics__chn"))
    obj = load_object(path)
    assert (obj.api_name, obj.kind, obj.topic) == (
        "Order_Shipped__e",
        "platform_event",
        "/event/Logistics__chn",
    )
    assert obj.tables.bronze == "logistics__chn"
    assert "no gold table" in path.read_text()
