from __future__ import annotations

import io
import json
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.emulator.avrowriter import AvroWriter, HeaderEncoder
from ingest.emulator.catalogue import load_schema
from ingest.schema import parse_event_schema
from tests.unit.emulator.conftest import Run

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Everything",
    "namespace": "com.example",
    "fields": [
        {"name": "flag", "type": "boolean"},
        {"name": "small", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "ratio", "type": "float"},
        {"name": "amount", "type": "double"},
        {"name": "blob", "type": "bytes"},
        {"name": "text", "type": "string"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {
            "name": "home",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Place",
                    "fields": [
                        {"name": "city", "type": ["null", "string"], "default": None},
                        {"name": "lat", "type": ["null", "double"], "default": None},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "work", "type": ["null", "Place"], "default": None},
        {"name": "who", "type": ["null", "string", "Place"], "default": None},
        {"name": "either", "type": ["null", "long", "string"], "default": None},
        {"name": "nothing", "type": "null"},
        {"name": "later", "type": ["null", "string"], "default": None},
    ],
}

places = st.none() | st.fixed_dictionaries(
    {"city": st.none() | st.text(), "lat": st.none() | st.floats(allow_nan=False)}
)
records = st.fixed_dictionaries(
    {
        "flag": st.booleans(),
        "small": st.integers(-(2**31), 2**31 - 1),
        "big": st.integers(-(2**63), 2**63 - 1),
        "ratio": st.floats(width=32, allow_nan=False),
        "amount": st.floats(allow_nan=False) | st.integers(-(2**40), 2**40),
        "blob": st.binary(max_size=300),
        "text": st.text(max_size=300),
        "kind": st.sampled_from(["A", "B", "C"]),
        "tags": st.lists(st.text(max_size=20), max_size=5),
        "counts": st.dictionaries(
            st.text(max_size=10), st.integers(-(2**63), 2**63 - 1), max_size=4
        ),
        "home": places,
        "work": places,
        "who": st.none() | st.text(max_size=20) | places.filter(lambda p: p is not None),
        "either": st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
        "nothing": st.none(),
    }
)
PARSED = parse_schema(SCHEMA)
WRITER = AvroWriter(SCHEMA)


def fastavro_bytes(schema: Any, record: Any) -> bytes:
    buffer = io.BytesIO()
    schemaless_writer(buffer, schema, record)
    return buffer.getvalue()


@settings(max_examples=300)
@given(records)
def test_byte_identical_to_fastavro_for_every_type(record: dict[str, Any]) -> None:
    assert WRITER.write(record) == fastavro_bytes(PARSED, record)


def test_byte_identical_to_fastavro_for_every_generated_event(run: Run) -> None:
    writers: dict[str, AvroWriter] = {}
    for event in run.events:
        schema = run.workload.catalogue.schema(event.schema_id)
        record = schemaless_reader(io.BytesIO(event.payload), schema.parsed, schema.parsed)
        assert fastavro_bytes(schema.parsed, record) == event.payload
        if event.schema_id not in writers:
            writers[event.schema_id] = AvroWriter(schema)
        assert writers[event.schema_id].write(record) == event.payload


def test_body_only_writer_and_header_pieces_make_the_whole_record() -> None:
    schema = load_schema("ContactChangeEvent.avsc")
    header = {
        "entityName": "Contact",
        "recordIds": ["003000000000001AAA", "003000000000002AAA"],
        "changeType": "UPDATE",
        "changeOrigin": "com/salesforce/api/soap/62.0;client=SfdcInternalAPI",
        "transactionKey": "0004e0ff-6171-7b9d-bd5e-cc3e5f3b0c1f",
        "sequenceNumber": 3,
        "commitTimestamp": 1_735_689_600_000,
        "commitNumber": 1_709_303_151_782_928_388,
        "commitUser": "005000000000001AAA",
        "nulledFields": [],
        "diffFields": [],
        "changedFields": ["0x080020", "3-0x02"],
    }
    body = {"Title": "CFO", "MailingAddress": {"City": "Zürich"}, "LastModifiedDate": 1}
    encoder = HeaderEncoder.for_schema(schema)
    assert encoder is not None
    pieces = b"".join(
        [
            encoder.string(header["entityName"]),
            encoder.strings(header["recordIds"]),
            encoder.change_type("UPDATE"),
            encoder.string(header["changeOrigin"]),
            encoder.string(header["transactionKey"]),
            encoder.long(3),
            encoder.long(header["commitTimestamp"]),
            encoder.long(header["commitNumber"]),
            encoder.string(header["commitUser"]),
            encoder.strings([]),
            encoder.strings([]),
            encoder.strings(header["changedFields"]),
            AvroWriter(schema, first_field=1).write(body),
        ]
    )
    assert pieces == fastavro_bytes(schema.parsed, {**body, "ChangeEventHeader": header})
    assert HeaderEncoder.for_schema(load_schema("Order_Shipped__e.avsc")) is None
    odd = json.loads(schema.json)
    odd["fields"][0]["type"]["fields"].reverse()
    assert HeaderEncoder.for_schema(parse_event_schema(json.dumps(odd))) is None
    with pytest.raises(TypeError, match=r"changeType.*CREATE"):
        encoder.change_type("MERGE")


def test_bad_values_are_reported_with_field_and_expectation() -> None:
    good = {
        "flag": True,
        "small": 1,
        "big": 2,
        "ratio": 1.5,
        "amount": 2.5,
        "blob": b"x",
        "text": "t",
        "kind": "A",
        "tags": [],
        "counts": {},
        "nothing": None,
    }
    assert WRITER.write(good) == fastavro_bytes(PARSED, good)
    with pytest.raises(
        TypeError, match=r"com\.example\.Everything\.small: expected .*int.*got 2147483648"
    ):
        WRITER.write({**good, "small": 2**31})
    with pytest.raises(TypeError, match=r"flag: expected .*boolean.*got 1"):
        WRITER.write({**good, "flag": 1})
    with pytest.raises(TypeError, match=r"text: expected .*string"):
        WRITER.write({**good, "text": b"bytes"})
    with pytest.raises(TypeError, match=r"kind: expected .*\['A', 'B', 'C'\].*got 'D'"):
        WRITER.write({**good, "kind": "D"})
    with pytest.raises(TypeError, match=r"Place\.lat: expected .*double.*got 'north'"):
        WRITER.write({**good, "home": {"lat": "north"}})
    with pytest.raises(ValueError, match=r"'colour' not a field of the record"):
        WRITER.write({**good, "colour": "red"})
    with pytest.raises(ValueError, match=r"no value for field 'text'"):
        WRITER.write({k: v for k, v in good.items() if k != "text"})
    with pytest.raises(TypeError, match=r"who: expected .*union"):
        WRITER.write({**good, "who": 3.5})
    with pytest.raises(ValueError, match="writes records"):
        AvroWriter({"type": "string"})  # type: ignore[arg-type]
