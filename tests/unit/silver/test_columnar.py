"""The columnar decoder against the row decoder: the same values, and each bad row reported
on its own with the row decoder's reason."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.decoding import EventDecoder
from ingest.schema import EventSchema, parse_event_schema
from pipelines.silver.columnar import ColumnarDecoder, UnionColumn, expanded_bitmaps, to_pylist
from tests.unit.silver.support import ACCOUNT_V1, ACCOUNT_V2, change_event, encode

EVERYTHING = parse_event_schema(
    json.dumps(
        {
            "type": "record",
            "name": "Everything__e",
            "namespace": "com.sforce.eventbus",
            "fields": [
                {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
                {"name": "Flag", "type": "boolean"},
                {"name": "Count", "type": ["null", "int"], "default": None},
                {"name": "Ratio", "type": ["float", "null"]},
                {"name": "Amount", "type": ["null", "double"], "default": None},
                {"name": "Blob", "type": ["null", "bytes"], "default": None},
                {"name": "Code", "type": {"type": "fixed", "name": "Code", "size": 3}},
                {
                    "name": "Level",
                    "type": ["null", {"type": "enum", "name": "Level", "symbols": ["LOW", "HIGH"]}],
                    "default": None,
                },
                {"name": "Tags", "type": {"type": "array", "items": "string"}},
                {
                    "name": "Scores",
                    "type": ["null", {"type": "array", "items": ["null", "long"]}],
                    "default": None,
                },
                {
                    "name": "Point",
                    "type": [
                        "null",
                        {
                            "type": "record",
                            "name": "Point",
                            "fields": [
                                {"name": "X", "type": ["null", "double"], "default": None},
                                {"name": "Label", "type": ["null", "string"], "default": None},
                            ],
                        },
                    ],
                    "default": None,
                },
                {"name": "Other", "type": ["null", "Point"], "default": None},
                {"name": "Choice", "type": ["null", "string", "Point"], "default": None},
                {"name": "Text", "type": "string"},
            ],
        },
        separators=(",", ":"),
    )
)

_LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_TEXT = st.text(max_size=40)
_POINT = st.fixed_dictionaries(
    {"X": st.none() | st.floats(allow_nan=False), "Label": st.none() | _TEXT}
)
_EVERYTHING = st.fixed_dictionaries(
    {
        "CreatedDate": _LONGS,
        "Flag": st.booleans(),
        "Count": st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1),
        "Ratio": st.none() | st.floats(width=32, allow_nan=False),
        "Amount": st.none() | st.floats(allow_nan=False),
        "Blob": st.none() | st.binary(max_size=30),
        "Code": st.binary(min_size=3, max_size=3),
        "Level": st.none() | st.sampled_from(["LOW", "HIGH"]),
        "Tags": st.lists(_TEXT, max_size=4),
        "Scores": st.none() | st.lists(st.none() | _LONGS, max_size=5),
        "Point": st.none() | _POINT,
        "Other": st.none() | _POINT,
        "Choice": st.none() | _TEXT | _POINT,
        "Text": _TEXT,
    }
)


def payload(schema: EventSchema, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(json.loads(schema.json)), record)
    return buf.getvalue()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def assert_agrees(schema: EventSchema, payloads: list[bytes]) -> None:
    columnar = ColumnarDecoder.for_schema(schema)
    assert columnar is not None
    decoded = columnar.decode(pa.array(payloads, pa.binary()))
    assert not decoded.errors, "the columnar decoder refused valid payloads"
    columns, header = decoded.columns, decoded.header
    reference = EventDecoder(schema).decode_batch(payloads)
    assert not reference.errors
    assert set(columns) == set(reference.columns)
    assert set(header) == set(reference.header)
    for name, values in [*reference.columns.items(), *reference.header.items()]:
        got = to_pylist(columns[name] if name in columns else header[name])
        mismatches = [k for k in range(len(values)) if not same(got[k], values[k])]
        assert not mismatches, (name, got[mismatches[0]], values[mismatches[0]])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EVERYTHING, min_size=1, max_size=30))
def test_every_avro_type_decodes_as_the_row_decoder_does(records: list[dict[str, Any]]) -> None:
    assert_agrees(EVERYTHING, [payload(EVERYTHING, r) for r in records])


def test_change_events_of_every_shape_decode_as_the_row_decoder_does() -> None:
    s = ACCOUNT_V2
    events = [
        change_event(
            s,
            "CREATE",
            ["001000000000001AAA"],
            {
                "Name": "Acme",
                "BillingAddress": {"City": "Paris", "Latitude": 48.85},
                "Tier__c": "Gold",
                "Phone": "+33 1 23 45 67 89",
                "AnnualRevenue": 1.5e9,
                "NumberOfEmployees": -3,
                "IsActive__c": True,
                "Description": "é😀" * 50,
                "SLA_Date__c": -86_400_000,
                "Open_At__c": 30_600_000,
                "LastModifiedDate": 2**62,
                "ShippingAddress": {"Street": "1 Main"},
            },
            changed=["Name", "BillingAddress.City"],
        ),
        change_event(
            s,
            "UPDATE",
            ["001000000000002AAA", "001000000000003AAA", "001*"],
            {"Name": {"FirstName": "Ada", "LastName": "Lovelace"}},
            changed=["Name.FirstName", "Name.LastName", "Phone"],
            nulled=["Phone"],
            diffed=["Description"],
            commit_number=2**63 - 1,
            sequence=2**31 - 1,
        ),
        change_event(s, "GAP_OVERFLOW", [], {}),
    ]
    assert_agrees(s, events * 5)


def test_maps_and_unions_inside_records_decode_as_the_row_decoder_does() -> None:
    inner = {"type": "record", "name": "Inner", "fields": [{"name": "X", "type": "long"}]}
    schema = parse_event_schema(
        json.dumps(
            {
                "type": "record",
                "name": "Mapped__e",
                "fields": [
                    {"name": "Attrs", "type": {"type": "map", "values": "string"}},
                    {
                        "name": "Nested",
                        "type": {
                            "type": "record",
                            "name": "Outer",
                            "fields": [
                                {"name": "Either", "type": ["null", "string", inner]},
                                {
                                    "name": "Many",
                                    "type": {"type": "map", "values": ["long", "Inner"]},
                                },
                            ],
                        },
                    },
                ],
            }
        )
    )
    records = [
        {"Attrs": {}, "Nested": {"Either": None, "Many": {}}},
        {"Attrs": {"a": "1", "b": "é"}, "Nested": {"Either": "s", "Many": {"k": 3}}},
        {"Attrs": {"z": ""}, "Nested": {"Either": {"X": -1}, "Many": {"k": {"X": 2}, "j": 5}}},
    ]
    assert_agrees(schema, [payload(schema, r) for r in records * 3])


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p[:-1],  # truncated
        lambda p: p + b"\x00",  # a byte left over
        lambda p: b"\x09" + p[1:],  # first string length made negative
        lambda p: p[:1] + b"\xff\xfe" + p[3:],  # invalid UTF-8 inside entityName
    ],
    ids=["truncated", "trailing", "negative-length", "utf8"],
)
def test_a_batch_with_a_damaged_payload_goes_back_to_the_row_decoder(damage: Any) -> None:
    s = ACCOUNT_V1
    good = [encode(s, {"ChangeEventHeader": _header(s)}) for _ in range(4)]
    columnar = ColumnarDecoder.for_schema(s)
    assert columnar is not None
    assert not columnar.decode(pa.array(good, pa.binary())).errors
    damaged = [*good[:2], damage(good[2]), good[3]]
    decoded = columnar.decode(pa.array(damaged, pa.binary()))
    reference = EventDecoder(s).decode_batch(damaged)
    assert [i for i, _ in reference.errors] == [2]
    assert decoded.errors == dict(reference.errors)
    assert decoded.rows.tolist() == [0, 1, 3]


def test_irregular_but_valid_encodings_are_decoded() -> None:
    # A null written as a two-byte union index: valid Avro that no writer produces.
    s = EVERYTHING
    record = {**_minimal(), "Count": None}
    regular = payload(s, record)
    at = 2  # Count's union index, after CreatedDate (one byte) and Flag
    assert regular[at] == 0
    irregular = regular[:at] + b"\x80\x00" + regular[at + 1 :]
    assert EventDecoder(s).decode_batch([irregular]).errors == []
    assert_agrees(s, [regular, irregular])


@pytest.mark.parametrize("index", [b"\x01", b"\x03", b"\x06"], ids=["-1", "-2", "3"])
def test_a_union_index_out_of_range_is_reported_as_the_row_decoder_does(index: bytes) -> None:
    s = EVERYTHING
    regular = payload(s, {**_minimal(), "Count": None})
    at = 2  # Count's union index, after CreatedDate (one byte) and Flag
    corrupt = regular[:at] + index + regular[at + 1 :]
    reference = EventDecoder(s).decode_batch([regular, corrupt]).errors
    assert [i for i, _ in reference] == [1]
    columnar = ColumnarDecoder.for_schema(s)
    assert columnar is not None
    decoded = columnar.decode(pa.array([regular, corrupt], pa.binary()))
    assert decoded.errors == dict(reference)
    assert "union branch index" in reference[0][1]


def test_a_null_payload_is_reported_as_the_row_decoder_does() -> None:
    s = ACCOUNT_V1
    columnar = ColumnarDecoder.for_schema(s)
    assert columnar is not None
    good = encode(s, {"ChangeEventHeader": _header(s)})
    decoded = columnar.decode(pa.array([good, None], pa.binary()))
    assert decoded.errors == dict(EventDecoder(s).decode_batch([good, None]).errors)
    assert decoded.rows.tolist() == [0]


def test_a_union_of_several_values_is_one_array_per_branch() -> None:
    s = ACCOUNT_V1
    events = [
        encode(s, {"ChangeEventHeader": _header(s), "Name": "Acme"}),
        encode(s, {"ChangeEventHeader": _header(s), "Name": {"LastName": "Doe"}}),
        encode(s, {"ChangeEventHeader": _header(s)}),
    ]
    columnar = ColumnarDecoder.for_schema(s)
    assert columnar is not None
    decoded = columnar.decode(pa.array(events, pa.binary()))
    assert not decoded.errors
    name = decoded.columns["Name"]
    assert isinstance(name, UnionColumn)
    assert name.branch.tolist() == [0, 1, -1]
    assert name.values[0].to_pylist() == ["Acme", None, None]
    assert name.to_pylist() == [
        "Acme",
        {"Salutation": None, "FirstName": None, "LastName": "Doe"},
        None,
    ]


def test_bitmaps_are_expanded_once_per_distinct_value() -> None:
    calls: list[tuple[str, ...]] = []

    def expand(bitmap: tuple[str, ...]) -> tuple[str, ...]:
        calls.append(bitmap)
        return tuple(f"field{b}" for b in bitmap)

    bitmaps = pa.array([["0x02"], [], ["0x02"], ["0x0A", "3-0x01"], [""]], pa.list_(pa.string()))
    names, errors = expanded_bitmaps(bitmaps, expand)
    assert not errors
    assert names.to_pylist() == [
        ["field0x02"],
        [],
        ["field0x02"],
        ["field0x0A", "field3-0x01"],
        ["field"],
    ]
    assert sorted(calls) == sorted([("0x02",), (), ("0x0A", "3-0x01"), ("",)])
    # An element holding the separator the distinct bitmaps are grouped by: one at a time.
    names, errors = expanded_bitmaps(pa.array([["a\x00b"]], pa.list_(pa.string())), expand)
    assert names.to_pylist() == [["fielda\x00b"]] and not errors


def _header(schema: EventSchema) -> dict[str, Any]:
    from tests.unit.silver.support import header

    return header(schema, "CREATE", ["001000000000001AAA"])


def _minimal() -> dict[str, Any]:
    return {
        "CreatedDate": 5,
        "Flag": True,
        "Count": 1,
        "Ratio": 0.5,
        "Amount": None,
        "Blob": None,
        "Code": b"abc",
        "Level": None,
        "Tags": [],
        "Scores": None,
        "Point": None,
        "Other": None,
        "Choice": None,
        "Text": "t",
    }
