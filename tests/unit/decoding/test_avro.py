"""The generated decoder is fastavro, only faster: same results, and DecodeError for bad bytes."""

from __future__ import annotations

import json
import pickle
import threading
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ingest.decoding import ChangeEvent, EventDecoder, compile_decoder, field_names
from ingest.errors import DecodeError
from ingest.schema import EventSchema, schema_id

from .support import (
    LOCATION,
    STRINGS,
    SWITCHABLE_NAME,
    account_schema,
    avro_schemas,
    change_events,
    encode,
    event_schema,
    fastavro_decode,
    header,
    opt,
    records,
    same,
    values,
)

ACCOUNT = event_schema(account_schema())
ACCOUNT_DECODER = EventDecoder(ACCOUNT)


def _header_values(**overrides: Any) -> dict[str, Any]:
    values = {
        "entityName": "Account",
        "recordIds": ["001000000000001AAA"],
        "changeType": "UPDATE",
        "changeOrigin": "com/salesforce/api/rest/62.0",
        "transactionKey": "0001a2b3-c4d5",
        "sequenceNumber": 1,
        "commitTimestamp": 1_700_000_000_000,
        "commitNumber": 1_709_303_151_782_928_388,
        "commitUser": "005000000000001AAA",
        "nulledFields": [],
        "diffFields": [],
        "changedFields": ["0x0800"],
    }
    values.update(overrides)
    return values


def _account(**body: Any) -> dict[str, Any]:
    record: dict[str, Any] = {f["name"]: None for f in account_schema()["fields"]}
    record["ChangeEventHeader"] = _header_values()
    record.update(body)
    return record


def _decode_error(decoder: EventDecoder, payload: Any) -> str:
    with pytest.raises(DecodeError) as info:
        decoder.decode(payload)
    return str(info.value)


# --- equivalence with fastavro ----------------------------------------------------------


def test_the_account_schema_is_specialised() -> None:
    assert ACCOUNT_DECODER.specialised
    assert ACCOUNT_DECODER.fallback_reason is None
    assert "def decode_record(buf):" in (ACCOUNT_DECODER.source or "")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(ACCOUNT))
def test_salesforce_shaped_records_decode_exactly_as_fastavro_does(record: Any) -> None:
    payload = encode(ACCOUNT, record)
    assert same(ACCOUNT_DECODER.decode(payload), fastavro_decode(ACCOUNT, payload))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(ACCOUNT))
def test_every_truncation_of_a_payload_is_a_decode_error(record: Any) -> None:
    payload = encode(ACCOUNT, record)
    for end in range(len(payload)):
        with pytest.raises(DecodeError, match="truncated"):
            ACCOUNT_DECODER.decode(payload[:end])
    batch = ACCOUNT_DECODER.decode_batch([payload[:end] for end in range(len(payload))])
    assert len(batch) == 0
    assert [i for i, _ in batch.errors] == list(range(len(payload)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_schemas_decode_exactly_as_fastavro_does(data: st.DataObject) -> None:
    raw = data.draw(avro_schemas(), label="schema")
    schema = event_schema(raw)
    decoder = EventDecoder(schema)
    event("specialised" if decoder.specialised else f"fastavro: {decoder.fallback_reason}")
    parsed = schema.parsed
    for record in data.draw(
        st.lists(values(parsed, parsed["__named_schemas"]), min_size=1, max_size=4)
    ):
        payload = encode(schema, record)
        expected = fastavro_decode(schema, payload)
        assert same(decoder.decode(payload), expected)
        batch = decoder.decode_batch([payload])
        assert batch.errors == []
        assert same(next(batch.records()), expected)
        for end in range(len(payload)):
            with pytest.raises(DecodeError):
                decoder.decode(payload[:end])


@settings(max_examples=150, deadline=None)
@given(records(ACCOUNT), st.data())
def test_corrupted_payloads_decode_as_fastavro_or_raise_decode_error(
    record: Any, data: st.DataObject
) -> None:
    payload = bytearray(encode(ACCOUNT, record))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    try:
        ours = ACCOUNT_DECODER.decode(bytes(payload))
    except DecodeError:
        return  # never IndexError, struct.error, UnicodeDecodeError or anything else
    assert same(ours, fastavro_decode(ACCOUNT, bytes(payload)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_anything_but_decode_error(payload: bytes) -> None:
    try:
        ours = ACCOUNT_DECODER.decode(payload)
    except DecodeError:
        return
    assert same(ours, fastavro_decode(ACCOUNT, payload))


def test_compile_decoder_returns_the_record_decoder() -> None:
    decode = compile_decoder(ACCOUNT)
    payload = encode(ACCOUNT, _account(Phone="+33 1 23"))
    assert decode(payload) == ACCOUNT_DECODER.decode(payload)
    assert decode(payload)["Phone"] == "+33 1 23"


def test_the_three_way_name_union_returns_str_or_dict_as_fastavro_does() -> None:
    business = encode(ACCOUNT, _account(Name="Acme"))
    person = encode(
        ACCOUNT, _account(Name={"Salutation": None, "FirstName": "Zoë", "LastName": "Ü"})
    )
    assert ACCOUNT_DECODER.decode(business)["Name"] == "Acme"
    assert ACCOUNT_DECODER.decode(person)["Name"] == {
        "Salutation": None,
        "FirstName": "Zoë",
        "LastName": "Ü",
    }
    assert ACCOUNT_DECODER.decode(encode(ACCOUNT, _account()))["Name"] is None


def test_named_types_with_an_empty_namespace_resolve_as_fastavro_resolves_them() -> None:
    raw = account_schema()
    raw["fields"][0] = header(enum_namespace=None)
    schema = event_schema(raw)
    payload = encode(schema, _account())
    assert same(EventDecoder(schema).decode(payload), fastavro_decode(schema, payload))


def test_payload_types_other_than_bytes() -> None:
    payload = encode(ACCOUNT, _account(Phone="1"))
    assert ACCOUNT_DECODER.decode(bytearray(payload))["Phone"] == "1"
    assert ACCOUNT_DECODER.decode(memoryview(payload))["Phone"] == "1"
    assert "must be bytes (got str)" in _decode_error(ACCOUNT_DECODER, "0x00")
    assert "got NoneType" in _decode_error(ACCOUNT_DECODER, None)


# --- what is wrong, and where -----------------------------------------------------------

SMALL = event_schema(
    {
        "type": "record",
        "name": "Small",
        "fields": [
            {"name": "flag", "type": "boolean"},
            {"name": "count", "type": "int"},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            opt("label", "string"),
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "when", "type": "long"},
        ],
    }
)
SMALL_DECODER = EventDecoder(SMALL)
GOOD = bytes([0x01, 0x04, 0x02, 0x02, 0x04]) + b"hi" + bytes([0x02, 0x02]) + b"x" + b"\x00\x06"


def test_the_small_fixture_is_valid() -> None:
    assert SMALL_DECODER.decode(GOOD) == {
        "flag": True,
        "count": 2,
        "kind": "B",
        "label": "hi",
        "tags": ["x"],
        "when": 3,
    }
    assert SMALL_DECODER.decode(GOOD) == fastavro_decode(SMALL, GOOD)


@pytest.mark.parametrize(
    ("payload", "reason", "field"),
    [
        (b"\x02" + GOOD[1:], "boolean byte 2 (expected 0 or 1)", "flag"),
        (GOOD[:2] + b"\x06" + GOOD[3:], "enum index 3 out of range (expected 0..1)", "kind"),
        (GOOD[:2] + b"\x01" + GOOD[3:], "enum index -1 out of range", "kind"),
        (
            GOOD[:3] + b"\x06" + GOOD[4:],
            "union branch index 3 out of range (expected 0..1)",
            "label",
        ),
        (GOOD[:3] + b"\x01" + GOOD[4:], "union branch index -1 out of range", "label"),
        (GOOD[:4] + b"\x03" + GOOD[5:], "negative length -2", "label"),
        (GOOD[:4] + b"\x40" + GOOD[5:], "truncated: 32 bytes announced", "label"),
        (GOOD[:5] + b"\xff\xfe" + GOOD[7:], "invalid UTF-8", "label"),
        (GOOD[:7] + b"\x40" + GOOD[8:], "block of 32 items announced", "tags"),
        (GOOD[:1] + b"\xff\xff\xff\xff\x7f" + GOOD[2:], "varint longer than 32 bits", "count"),
        (GOOD[:-1] + b"\xff" * 10 + b"\x01", "varint longer than 64 bits", "when"),
        (GOOD + b"\x00", "1 unread byte(s) after the end of the record", ""),
        (GOOD[:-1], "truncated", "when"),
    ],
)
def test_corrupt_payloads_name_the_reason_and_the_field(
    payload: bytes, reason: str, field: str
) -> None:
    message = _decode_error(SMALL_DECODER, payload)
    assert reason in message
    assert f"{len(payload)}-byte payload of Small ({SMALL.schema_id})" in message
    if field:
        assert f"field {field}" in message
    batch = SMALL_DECODER.decode_batch([GOOD, payload, GOOD])
    assert batch.row_index == [0, 2]
    assert batch.errors == [(1, message)]


def test_error_messages_never_quote_the_payload() -> None:
    payload = encode(ACCOUNT, _account(Phone="secret-phone-123", Description="private notes"))
    for end in range(0, len(payload), 7):
        message = _decode_error(ACCOUNT_DECODER, payload[:end])
        assert "secret" not in message and "private" not in message


def test_the_nested_field_path_is_named() -> None:
    payload = encode(ACCOUNT, _account(BillingAddress={"City": "Paris", "Latitude": 48.8}))
    cut = payload.index(b"Paris") + 2
    assert "field BillingAddress.City" in _decode_error(ACCOUNT_DECODER, payload[:cut])
    header_cut = payload.index(b"0001a2b3") + 3
    assert "field ChangeEventHeader.transactionKey" in _decode_error(
        ACCOUNT_DECODER, payload[:header_cut]
    )


def test_varints_at_the_edges_of_their_ranges() -> None:
    schema = event_schema(
        {
            "type": "record",
            "name": "Edges",
            "fields": [{"name": "i", "type": "int"}, {"name": "l", "type": "long"}],
        }
    )
    decoder = EventDecoder(schema)
    for i, long_value in [(2**31 - 1, 2**63 - 1), (-(2**31), -(2**63)), (0, 0), (-1, 2**53 + 1)]:
        payload = encode(schema, {"i": i, "l": long_value})
        assert decoder.decode(payload) == {"i": i, "l": long_value}
    too_big_int = b"\x80\x80\x80\x80\x10" + b"\x00"  # zigzag 2**32: one bit past 32
    assert "varint longer than 32 bits" in _decode_error(decoder, too_big_int)
    too_big_long = b"\x00" + b"\x80" * 9 + b"\x02"  # one bit past 64
    assert "varint longer than 64 bits" in _decode_error(decoder, too_big_long)


# --- encodings that are valid Avro but that no writer produces ----------------------------


def test_a_union_index_in_more_bytes_than_needed_decodes_as_fastavro_does() -> None:
    padded = GOOD[:3] + b"\x82\x00" + GOOD[4:]  # branch 1 written in two bytes
    assert SMALL_DECODER.decode(padded) == fastavro_decode(SMALL, padded)
    assert SMALL_DECODER.decode(padded)["label"] == "hi"
    batch = SMALL_DECODER.decode_batch([padded])
    assert batch.errors == [] and batch.columns["label"] == ["hi"]


def test_an_array_end_in_more_bytes_than_needed_decodes_as_fastavro_does() -> None:
    padded = GOOD[:-2] + b"\x80\x00" + GOOD[-1:]  # the terminating 0 count in two bytes
    assert SMALL_DECODER.decode(padded) == fastavro_decode(SMALL, padded)
    assert SMALL_DECODER.decode(padded)["tags"] == ["x"]


def test_negative_block_counts_carry_a_byte_size_that_is_skipped() -> None:
    blocked = GOOD[:7] + b"\x01\x04" + GOOD[8:]  # -1 items, 2 bytes, then the item
    assert SMALL_DECODER.decode(blocked) == fastavro_decode(SMALL, blocked)
    assert SMALL_DECODER.decode(blocked)["tags"] == ["x"]


# --- schemas left to fastavro -----------------------------------------------------------


@pytest.mark.parametrize(
    ("field_type", "reason", "value"),
    [
        ({"type": "long", "logicalType": "timestamp-millis"}, "logical type", 1_700_000_000_000),
        ({"type": "array", "items": "null"}, "zero-width", [None, None]),
    ],
)
def test_unspecialised_schemas_fall_back_to_fastavro(
    field_type: Any, reason: str, value: Any
) -> None:
    schema = event_schema(
        {"type": "record", "name": "L", "fields": [{"name": "x", "type": field_type}]}
    )
    decoder = EventDecoder(schema)
    assert not decoder.specialised and decoder.source is None
    assert reason in (decoder.fallback_reason or "")
    assert "fastavro" in repr(decoder)
    payload = encode(schema, {"x": value})
    assert same(decoder.decode(payload), fastavro_decode(schema, payload))
    assert "unread byte(s)" in _decode_error(decoder, payload + b"\x00")
    with pytest.raises(DecodeError, match="cannot decode a 0-byte payload"):
        decoder.decode(b"")
    batch = decoder.decode_batch([payload, b"", payload])
    assert batch.row_index == [0, 2] and [i for i, _ in batch.errors] == [1]
    assert same(batch.columns["x"], [fastavro_decode(schema, payload)["x"]] * 2)


def test_recursive_schemas_fall_back_to_fastavro() -> None:
    node = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "value", "type": "long"}, {"name": "next", "type": ["null", "Node"]}],
    }
    # parse_event_schema cannot describe a self-referencing record's fields (Salesforce
    # never sends one); the decoder only needs the Avro schema.
    schema = _raw_schema(node)
    decoder = EventDecoder(schema)
    assert not decoder.specialised and "recursive" in (decoder.fallback_reason or "")
    record = {"value": 1, "next": {"value": 2, "next": None}}
    assert decoder.decode(encode(schema, record)) == record


def _raw_schema(raw: dict[str, Any]) -> EventSchema:
    text = json.dumps(raw)
    return EventSchema(schema_id(text), text, raw["name"], (), raw)


def _nested_records(depth: int) -> dict[str, Any]:
    t: dict[str, Any] = {"type": "record", "name": f"N{depth}", "fields": [opt("x", "long")]}
    for d in range(depth - 1, -1, -1):
        t = {"type": "record", "name": f"N{d}", "fields": [opt("x", "long"), opt("c", t)]}
    return t


def _nested_arrays(depth: int) -> dict[str, Any]:
    t: Any = "long"
    for _ in range(depth):
        t = {"type": "array", "items": t}
    return {"type": "record", "name": "A", "fields": [{"name": "a", "type": t}]}


@pytest.mark.parametrize(
    ("raw", "value", "specialised"),
    [
        (_nested_records(30), {"x": 5, "c": {"x": -1, "c": None}}, True),
        (_nested_records(60), {"x": 5, "c": {"x": -1, "c": None}}, False),
        (_nested_arrays(8), {"a": [[[[[[[[1, 2]]]]]]]]}, True),
        (_nested_arrays(12), {"a": [[[[[[[[[[[[3]]]]]]]]]]]]}, False),
    ],
)
def test_schemas_nested_beyond_what_python_compiles_fall_back(
    raw: dict[str, Any], value: Any, specialised: bool
) -> None:
    schema = _raw_schema(raw)
    decoder = EventDecoder(schema)
    assert decoder.specialised is specialised
    if not specialised:
        assert decoder.fallback_reason == "schema nested too deeply for generated code"
    payload = encode(schema, value)
    assert decoder.decode(payload) == value
    assert decoder.decode_batch([payload]).columns == {k: [v] for k, v in value.items()}


def test_each_generated_form_is_compiled_when_first_used() -> None:
    decoder = EventDecoder(ACCOUNT)
    compiled = decoder._compiled
    assert compiled is not None and compiled._functions == {}
    payload = encode(ACCOUNT, _account())
    decoder.decode_batch([payload])
    assert set(compiled._functions) == {"batch"}
    decoder.decode(payload)
    decoder.decode_event(payload)
    assert set(compiled._functions) == {"batch", "record", "event"}
    assert compile_decoder(ACCOUNT)(payload) == decoder.decode(payload)


# --- generated code is safe -------------------------------------------------------------


def test_field_names_and_symbols_never_become_code() -> None:
    hostile = "x'] = 1; import os; r['"
    schema = event_schema(
        {
            "type": "record",
            "name": "Hostile",
            "fields": [
                {"name": hostile, "type": ["null", "string"]},
                {"name": "__import__", "type": "long"},
                {"name": "buf", "type": {"type": "enum", "name": "S", "symbols": ["pos", "r"]}},
            ],
        }
    )
    decoder = EventDecoder(schema)
    record = {hostile: "v", "__import__": 5, "buf": "r"}
    payload = encode(schema, record)
    assert decoder.decode(payload) == record
    assert list(decoder.decode(payload)) == [hostile, "__import__", "buf"]
    assert "import os" not in (decoder.source or "").replace(repr(hostile), "")


# --- columns ------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(change_events(ACCOUNT), max_size=6), st.sets(st.integers(0, 7)))
def test_batch_columns_hold_the_decoded_records(batch_records: list[Any], broken: set[int]) -> None:
    payloads: list[Any] = [encode(ACCOUNT, r) for r in batch_records]
    for i in sorted(broken):
        if i <= len(payloads):
            payloads.insert(i, b"\x07")
    batch = ACCOUNT_DECODER.decode_batch(payloads)
    good = [i for i, p in enumerate(payloads) if p != b"\x07"]
    assert batch.row_index == good
    assert [i for i, _ in batch.errors] == [i for i, p in enumerate(payloads) if p == b"\x07"]
    assert all("ChangeEventHeader.entityName" in reason for _, reason in batch.errors)
    assert len(batch) == len(good)
    decoded = [ACCOUNT_DECODER.decode(payloads[i]) for i in good]
    assert same(list(batch.records()), decoded)
    assert list(batch.header) == [
        f["name"] for f in account_schema()["fields"][0]["type"]["fields"]
    ]
    assert list(batch.columns) == [f["name"] for f in account_schema()["fields"][1:]]
    for name, column in batch.columns.items():
        assert same(column, [d[name] for d in decoded])
    assert batch.schema_id == ACCOUNT.schema_id


def test_batch_expands_the_bitmaps_of_every_row() -> None:
    payloads = [
        encode(ACCOUNT, _account(Phone="1")),
        encode(
            ACCOUNT,
            _account(
                ChangeEventHeader=_header_values(
                    changedFields=["0x10", "4-0x2"], nulledFields=["4-0x02"], diffFields=[]
                )
            ),
        ),
        encode(ACCOUNT, _account(ChangeEventHeader=_header_values(changedFields=["0x4000000000"]))),
    ]
    batch = ACCOUNT_DECODER.decode_batch(payloads)
    assert batch.changed == [("LastModifiedDate",), ("BillingAddress", "BillingAddress.City")]
    assert batch.nulled == [(), ("BillingAddress.City",)]
    assert batch.diffed == [(), ()]
    assert batch.row_index == [0, 1]
    ((index, reason),) = batch.errors
    assert index == 2 and "bit 38 is past the last field" in reason


def test_batches_longer_than_a_chunk_keep_their_row_indexes() -> None:
    good = [encode(ACCOUNT, _account(Phone=str(i))) for i in range(700)]
    payloads = [b"\x07" if i % 97 == 0 else p for i, p in enumerate(good)]
    batch = ACCOUNT_DECODER.decode_batch(p for p in payloads)  # any iterable will do
    bad = list(range(0, 700, 97))
    assert [i for i, _ in batch.errors] == bad
    assert batch.row_index == [i for i in range(700) if i not in bad]
    assert batch.columns["Phone"] == [str(i) for i in batch.row_index]
    assert batch.changed == [("LastModifiedDate",)] * len(batch)


def test_an_empty_batch_has_empty_columns() -> None:
    batch = ACCOUNT_DECODER.decode_batch([])
    assert len(batch) == 0 and batch.errors == [] and batch.changed == []
    assert all(col == [] for col in batch.columns.values())
    assert set(batch.header) >= {"entityName", "changedFields"}


def test_platform_events_have_no_header_columns() -> None:
    schema = event_schema(
        {
            "type": "record",
            "name": "Order_Shipped__e",
            "namespace": "com.sforce.eventbus",
            "fields": [
                {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
                {"name": "CreatedById", "type": "string", "doc": "CreatedBy:EntityId"},
                opt("Order_Number__c", "string", "Data:Text:00N000000000001"),
                opt("Where__c", LOCATION, "Data:Location:00N000000000002"),
            ],
        }
    )
    decoder = EventDecoder(schema)
    record = {
        "CreatedDate": 1_700_000_000_000,
        "CreatedById": "005x",
        "Order_Number__c": "42",
        "Where__c": {"Latitude": 1.5, "Longitude": None},
    }
    batch = decoder.decode_batch([encode(schema, record)])
    assert batch.header == {}
    assert batch.columns == {k: [v] for k, v in record.items()}
    assert batch.changed == batch.nulled == batch.diffed == [()]
    with pytest.raises(DecodeError, match="not a change event"):
        decoder.decode_event(encode(schema, record))


# --- the change event view ----------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(change_events(ACCOUNT))
def test_decode_event_is_the_view_of_the_decoded_record(record: Any) -> None:
    payload = encode(ACCOUNT, record)
    expected = ChangeEvent.from_record(ACCOUNT_DECODER.decode(payload), ACCOUNT)
    got = ACCOUNT_DECODER.decode_event(payload)
    assert same(got.values, expected.values)
    assert replace(got, values={}) == replace(expected, values={})
    header = record["ChangeEventHeader"]
    assert got.changed == field_names(header["changedFields"], ACCOUNT)
    batch = ACCOUNT_DECODER.decode_batch([payload])
    assert (batch.changed, batch.nulled, batch.diffed) == (
        [got.changed],
        [got.nulled],
        [got.diffed],
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(ACCOUNT))
def test_decode_event_fails_as_the_view_fails(record: Any) -> None:
    payload = encode(ACCOUNT, record)  # random strings as bitmaps: most do not fit
    try:
        expected = ChangeEvent.from_record(ACCOUNT_DECODER.decode(payload), ACCOUNT)
    except DecodeError as exc:
        with pytest.raises(DecodeError) as info:
            ACCOUNT_DECODER.decode_event(payload)
        assert str(info.value) == str(exc)
    else:
        assert replace(ACCOUNT_DECODER.decode_event(payload), values={}) == replace(
            expected, values={}
        )


def test_decode_event_reads_the_header() -> None:
    payload = encode(
        ACCOUNT,
        _account(
            ChangeEventHeader=_header_values(
                recordIds=["001A", "001B"],
                changedFields=["0x0802", "4-0x1"],
                nulledFields=["0x800"],
            ),
            Name="Acme",
        ),
    )
    got = ACCOUNT_DECODER.decode_event(payload)
    assert got.schema_id == ACCOUNT.schema_id
    assert got.entity == "Account"
    assert got.record_ids == ("001A", "001B")
    assert got.change_type == "UPDATE" and not got.is_gap
    assert got.change_origin == "com/salesforce/api/rest/62.0"
    assert got.transaction_key == "0001a2b3-c4d5"
    assert got.sequence_number == 1
    assert got.commit_timestamp == 1_700_000_000_000
    assert got.commit_number == 1_709_303_151_782_928_388
    assert got.commit_user == "005000000000001AAA"
    assert got.changed == ("Name", "BillingAddress.Street", "LastModifiedDate")
    assert got.nulled == ("LastModifiedDate",)
    assert got.diffed == ()
    assert got.values["Name"] == "Acme" and "ChangeEventHeader" not in got.values
    assert list(got.values) == [f["name"] for f in account_schema()["fields"][1:]]
    assert "Acme" not in repr(got)


def test_decode_event_reports_bitmaps_that_do_not_fit() -> None:
    payload = encode(ACCOUNT, _account(ChangeEventHeader=_header_values(diffFields=["2-0x1"])))
    with pytest.raises(DecodeError, match="parent index 2 is Type, not a compound field"):
        ACCOUNT_DECODER.decode_event(payload)


def test_gap_events() -> None:
    payload = encode(
        ACCOUNT, _account(ChangeEventHeader=_header_values(changeType="GAP_OVERFLOW", recordIds=[]))
    )
    got = ACCOUNT_DECODER.decode_event(payload)
    assert got.is_gap and got.record_ids == ()


def test_from_record_names_missing_header_fields() -> None:
    raw = account_schema()
    raw["fields"][0]["type"]["fields"] = raw["fields"][0]["type"]["fields"][:3]
    schema = event_schema(raw)
    decoder = EventDecoder(schema)
    record = _account()
    record["ChangeEventHeader"] = {
        k: record["ChangeEventHeader"][k] for k in ("entityName", "recordIds", "changeType")
    }
    payload = encode(schema, record)
    with pytest.raises(DecodeError, match="lacks changeOrigin, transactionKey"):
        decoder.decode_event(payload)
    with pytest.raises(DecodeError, match="lacks changeOrigin"):
        ChangeEvent.from_record(decoder.decode(payload), schema)
    assert decoder.decode_batch([payload]).changed == [()]


def test_nullable_bitmap_fields_are_expanded_too() -> None:
    raw = account_schema()
    fields = raw["fields"][0]["type"]["fields"]
    fields[-1] = {"name": "changedFields", "type": ["null", STRINGS]}
    schema = event_schema(raw)
    decoder = EventDecoder(schema)
    for changed, names in [(None, ()), (["0x40"], ("Phone",))]:
        payload = encode(schema, _account(ChangeEventHeader=_header_values(changedFields=changed)))
        assert decoder.decode_event(payload).changed == names
        assert decoder.decode_batch([payload]).changed == [names]


def test_event_factory_builds_ordinary_change_events() -> None:
    from ingest.decoding.event import event_factory

    args = ("id", "Account", ("001",), "CREATE", "", "t", 1, 2, 3, "005", (), (), (), {"A": 1})
    made = event_factory()(*args)
    assert made == ChangeEvent(*args) and type(made) is ChangeEvent
    with pytest.raises(AttributeError):
        made.entity = "Contact"  # type: ignore[misc]


def test_decoders_pickle_as_their_schema() -> None:
    payload = encode(ACCOUNT, _account(Phone="7"))
    ACCOUNT_DECODER.decode(payload)  # compiled forms exist and must not be pickled
    copy = pickle.loads(pickle.dumps(ACCOUNT_DECODER))
    assert copy is not ACCOUNT_DECODER and copy.schema.schema_id == ACCOUNT.schema_id
    assert copy.decode(payload) == ACCOUNT_DECODER.decode(payload)
    assert copy.decode_event(payload) == ACCOUNT_DECODER.decode_event(payload)


# --- one decoder, many threads ----------------------------------------------------------


def test_a_decoder_is_shared_safely_between_threads() -> None:
    payloads = [encode(ACCOUNT, _account(Phone=str(i), NumberOfEmployees=i)) for i in range(50)]
    expected = [ACCOUNT_DECODER.decode(p) for p in payloads]
    failures: list[str] = []

    def work() -> None:
        for _ in range(20):
            if [ACCOUNT_DECODER.decode(p) for p in payloads] != expected:
                failures.append("decode")
            if ACCOUNT_DECODER.decode_batch(payloads).columns["Phone"] != [
                str(i) for i in range(50)
            ]:
                failures.append("batch")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_compound_fields_nested_under_switchable_name() -> None:
    schema: EventSchema = event_schema(
        {
            "type": "record",
            "name": "ContactChangeEvent",
            "namespace": "com.sforce.eventbus",
            "fields": [header(), opt("Name", SWITCHABLE_NAME, "Data:PersonName")],
        }
    )
    record = {"ChangeEventHeader": _header_values(changedFields=["1-0x6"]), "Name": None}
    got = EventDecoder(schema).decode_event(encode(schema, record))
    assert got.changed == ("Name.FirstName", "Name.LastName")
    assert json.loads(schema.json)["name"] == "ContactChangeEvent"
