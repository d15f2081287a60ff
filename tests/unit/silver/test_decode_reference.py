"""The row decoder as the reference model of silver's decoder, on generated schemas and
events.

Silver decodes a batch of bronze payloads a field at a time
(:class:`~pipelines.silver.columnar.ColumnarDecoder`). The reference is the row decoder
(:meth:`~ingest.decoding.EventDecoder.decode_batch`, with the column builders of
:mod:`pipelines.silver.decode`), which reports each bad row with its reason. Here hypothesis
writes an object's schema versions (text, long text, ids, integers, longs, doubles, floats,
booleans, bytes, enums, dates, times, date-times, compound records, Account's switchable
name; a field that changes type between versions, fields dropped, added or moved), and events
of them with random values (nulls, unicode, extreme numbers, NaN), record ids and field
bitmaps, written with the emulator's Avro writer or, irregularly but validly, with this
module's own (union indexes in several bytes, arrays in several blocks, negative block counts
with their byte size, a final zero in several bytes). Some payloads are damaged (cut short,
bytes left over, a byte overwritten or dropped: a union or enum index out of range, a boolean
byte other than 0/1, an overlong varint, invalid UTF-8, ...; a null payload; a bad bitmap;
another object's header), mixed with good ones in one batch. Decoding the bronze rows with
silver's decoder and with the row decoder must give the same rows value for value: the
silver rows and the error rows (which rows, their kind and reason text).
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any
from unittest import mock

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.decoding import DecoderCache
from ingest.emulator.avrowriter import AvroWriter
from ingest.emulator.bitmaps import bitmap_hex, encode_field_names
from ingest.schema import EventSchema, parse_event_schema
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.silver import decode
from pipelines.silver.columns import build_layout
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, decode_batches, decoded_schema
from tests.unit.silver.support import CHANGE_TYPES, HEADER, bronze_batch

# SFCDC_HYPOTHESIS_EXAMPLES raises the number of examples for a longer, random hunt; by
# default the examples are derandomized (the same seed on every run).
EXAMPLES = int(os.environ.get("SFCDC_HYPOTHESIS_EXAMPLES", "0"))
ENTITY = "Widget__c"

# ------------------------------------------------------------------------ schemas

# Leaf kinds: (Avro type, doc).
LEAVES: dict[str, tuple[Any, str]] = {
    "text": ("string", "Data:Text"),
    "long_text": ("string", "Data:StringPlusClob"),
    "multi": ("string", "Data:MultiEnum"),
    "id": ("string", "ForeignKey:EntityId"),
    "int": ("int", "Data:Integer"),
    "long": ("long", "Data:Long"),
    "double": ("double", "Data:Double"),
    "float": ("float", "Data:Percent"),
    "boolean": ("boolean", "Data:Boolean"),
    "bytes": ("bytes", "Data:Base64"),
    "enum": ({"type": "enum", "name": "Level", "symbols": ["LOW", "HIGH", "MID_1"]}, "Data:Enum"),
    "date": ("long", "Data:DateOnly"),
    "time": ("long", "Data:TimeOnly"),
    "datetime": ("long", "Data:DateTime"),
}
# A compound's children: leaves, and a record (none in Salesforce schemas: JSON text).
CHILD_KINDS = ("text", "double", "int", "boolean", "long", "record")
CHILD_NAMES = ("Street", "City", "Latitude", "Count", "Flag")
PERSON = ("Salutation", "FirstName", "LastName")

# A field: (name, kind, children) -- kind is a leaf kind, "compound" (children: (name,
# kind) pairs) or "switchable" (Account's Name: a string or a person name record).
Field = tuple[str, str, tuple[tuple[str, str], ...]]

_LEAF = st.sampled_from(sorted(LEAVES))
_CHILDREN = st.lists(
    st.tuples(st.sampled_from(CHILD_NAMES), st.sampled_from(CHILD_KINDS)),
    min_size=1,
    max_size=4,
    unique_by=lambda c: c[0],
).map(tuple)


@st.composite
def _field(draw: st.DrawFn, name: str) -> Field:
    if draw(st.integers(0, 4)) == 0:
        return name, "compound", draw(_CHILDREN)
    return name, draw(_LEAF), ()


@st.composite
def versions(draw: st.DrawFn) -> tuple[list[Field], list[Field]]:
    """Two versions of one object's fields: the second retypes, drops, adds and moves some."""
    count = draw(st.integers(1, 7))
    first = [draw(_field(f"F{i}__c")) for i in range(count)]
    if draw(st.booleans()):
        first.insert(draw(st.integers(0, len(first))), ("Name", "switchable", ()))
    second = []
    for f in first:
        change = draw(st.integers(0, 9))
        if change == 0:
            continue  # dropped
        if change in (1, 2) and f[1] != "switchable":
            second.append(draw(_field(f[0])))  # retyped (or a compound made leaf, or back)
        else:
            second.append(f)
    for i in range(draw(st.integers(0, 2))):
        second.insert(draw(st.integers(0, len(second))), draw(_field(f"New{i}__c")))
    if draw(st.booleans()):
        second = draw(st.permutations(second))
    return first, second


def _optional(avro: Any, doc: str | None = None) -> dict[str, Any]:
    return {"type": ["null", avro], "default": None, **({"doc": doc} if doc else {})}


def _child_type(kind: str, unique: str) -> Any:
    if kind == "record":
        inner = [{"name": "X", **_optional("long")}]
        return {"type": "record", "name": f"Inner{unique}", "fields": inner}
    return LEAVES[kind][0]


def _avro_field(f: Field, version: int) -> dict[str, Any]:
    name, kind, children = f
    if kind == "switchable":
        person = {
            "type": "record",
            "name": "Switchable_PersonName",
            "fields": [{"name": c, **_optional("string")} for c in PERSON],
        }
        return {
            "name": name,
            "type": ["null", "string", person],
            "doc": "Data:Switchable_PersonName",
            "default": None,
        }
    if kind == "compound":
        record = {
            "type": "record",
            # Records need names of their own in a schema.
            "name": f"{name.removesuffix('__c')}Compound{version}",
            "fields": [
                {"name": c, **_optional(_child_type(k, f"{name.removesuffix('__c')}{c}{version}"))}
                for c, k in children
            ],
        }
        return {"name": name, **_optional(record, "Data:Address")}
    avro, doc = LEAVES[kind]
    if isinstance(avro, dict):  # a named type: one definition per schema
        avro = {**avro, "name": f"{avro['name']}{name.removesuffix('__c')}"}
    return {"name": name, **_optional(avro, doc)}


def event_schema(fields: Sequence[Field], *, version: int, change_events: bool) -> EventSchema:
    body = [_avro_field(f, version) for f in fields]
    if change_events:
        header = {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"}
        name = f"{ENTITY.removesuffix('__c')}__ChangeEvent"
        body = [header, *body]
    else:
        created = {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"}
        name = "Widget__e"
        body = [created, *body]
    raw = {"type": "record", "name": name, "namespace": "com.sforce.eventbus", "fields": body}
    return parse_event_schema(json.dumps(raw, separators=(",", ":")))


# ------------------------------------------------------------------------ values

_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
_INT32 = st.integers(-(2**31), 2**31 - 1)
# Longs at the edges: those no double holds exactly, the extremes.
_EDGES = st.sampled_from([2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63), 2**31, -(2**31) - 1])
_INT64 = st.integers(-(2**63), 2**63 - 1) | _EDGES
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "text": _TEXT,
    "long_text": _TEXT | st.text(st.characters(codec="utf-8"), min_size=200, max_size=400),
    "multi": st.lists(st.sampled_from(["A", "B", "é"]), max_size=3).map(";".join),
    "id": st.sampled_from(["001000000000001AAA", "a01000000000002AAB"]),
    "int": _INT32,
    "long": _INT64,
    "double": st.floats(),
    "float": st.floats(width=32),
    "boolean": st.booleans(),
    "bytes": st.binary(max_size=12),
    "enum": st.sampled_from(["LOW", "HIGH", "MID_1"]),
    "date": st.integers(-(10**5), 10**5).map(lambda d: d * 86_400_000),
    "time": st.integers(0, 86_399_999),
    # Salesforce's DateTime range (years 1700 to 4000): a field retyped to text writes it
    # as an ISO date-time.
    "datetime": st.integers(-8_520_000_000_000, 64_000_000_000_000),
}


_CHILD = {**_VALUES, "record": st.fixed_dictionaries({"X": st.none() | _INT64})}


def _value(f: Field) -> st.SearchStrategy[Any]:
    _, kind, children = f
    if kind == "switchable":
        person = st.fixed_dictionaries({c: st.none() | _TEXT for c in PERSON})
        return st.none() | _TEXT | person
    if kind == "compound":
        return st.none() | st.fixed_dictionaries({c: st.none() | _CHILD[k] for c, k in children})
    return st.none() | _VALUES[kind]


def _paths(schema: EventSchema) -> list[str]:
    """The names a bitmap of ``schema`` can hold: top-level fields and compound children."""
    out = []
    for f in schema.fields[1:]:
        out.append(f.name)
        if f.is_compound:
            out.extend(f"{f.name}.{c.name}" for c in f.children)
    return out


@st.composite
def _bitmap(draw: st.DrawFn, schema: EventSchema) -> list[str]:
    """A valid bitmap of ``schema``: as Salesforce writes it, or in another valid spelling
    (lower case, leading zeros, elements repeated or in another order, the header's bit)."""
    paths = _paths(schema)
    names = draw(st.lists(st.sampled_from(paths), max_size=4, unique=True)) if paths else []
    if draw(st.integers(0, 3)):
        return encode_field_names(schema, names)
    top = {schema.field(n).index for n in names if "." not in n}
    if draw(st.booleans()):
        top.add(0)
    elements = [bitmap_hex(top)] if top else []
    for n in names:
        parent, _, child = n.partition(".")
        if child:
            f = schema.field(parent)
            elements.append(f"{f.index}-{bitmap_hex([f.child(child).index])}")
    elements = [e.lower() if draw(st.booleans()) else e.replace("0x", "0x00", 1) for e in elements]
    return draw(st.permutations(elements + elements[: draw(st.integers(0, 1))]))


@st.composite
def _event(draw: st.DrawFn, schema: EventSchema, fields: Sequence[Field]) -> dict[str, Any]:
    record: dict[str, Any] = {f[0]: draw(_value(f)) for f in fields}
    if schema.is_change_event:
        record["ChangeEventHeader"] = {
            "entityName": ENTITY,
            "recordIds": draw(st.lists(st.sampled_from(["001A", "001B", "001*", "é"]), max_size=3)),
            "changeType": draw(st.sampled_from(CHANGE_TYPES)),
            "changeOrigin": draw(_TEXT),
            "transactionKey": draw(_TEXT),
            "sequenceNumber": draw(_INT32),
            "commitTimestamp": draw(_INT64),
            "commitNumber": draw(_INT64),
            "commitUser": draw(_TEXT),
            "nulledFields": draw(_bitmap(schema)),
            "diffFields": draw(_bitmap(schema)),
            "changedFields": draw(_bitmap(schema)),
        }
    else:
        record["CreatedDate"] = draw(_INT64)
    return record


# ------------------------------------------------------------------------ damage

# Damage every decoder must refuse, and damage that may or may not leave a valid payload.
DAMAGE = ("cut", "trailing", "bitmap", "entity", "null")
CHANGES = ("overwrite", "overwrite", "smear", "drop", "irregular", "irregular_overwrite")
# Bytes written over a payload's: a union or enum index out of range, a boolean byte other
# than 0/1, a varint's continuation, a byte no UTF-8 sequence holds.
_BYTES = (0x01, 0x03, 0x05, 0x07, 0x13, 0x7F, 0x80, 0xC3, 0xFE, 0xFF)


def _damaged(schema: EventSchema, record: dict[str, Any], how: str, at: int) -> bytes | None:
    """A payload of ``record`` damaged as ``how`` says (``at`` chooses where and how)."""
    writer = _writer(schema)
    if how == "null":
        return None
    if how in ("irregular", "irregular_overwrite"):
        payload = _irregular(schema, record, at)
        if how == "irregular":
            return payload
        how = "overwrite"
    else:
        payload = writer.write(record)
    if how == "overwrite":
        k = at % len(payload)
        return payload[:k] + bytes([_BYTES[at // 7 % len(_BYTES)]]) + payload[k + 1 :]
    if how == "smear":  # a varint of more than ten bytes, where a varint stands
        k = at % len(payload)
        return payload[:k] + b"\xff" * 10 + payload[k + 1 :]
    if how == "drop":
        k = at % len(payload)
        return payload[:k] + payload[k + 1 :]
    if how == "bitmap":
        header = dict(record["ChangeEventHeader"])
        header["changedFields"] = [bitmap_hex([len(schema.fields) + at % 3])]  # past the end
        return writer.write({**record, "ChangeEventHeader": header})
    if how == "entity":
        header = {**record["ChangeEventHeader"], "entityName": "Account"}
        return writer.write({**record, "ChangeEventHeader": header})
    if how == "cut":
        return payload[: at % len(payload)]
    return payload + bytes([at % 256]) * (1 + at % 3)


def _irregular(schema: EventSchema, record: dict[str, Any], seed: int) -> bytes:
    """``record`` in valid Avro that no writer produces: union indexes in several bytes,
    arrays in several blocks, some with a negative count and their size, a final zero in
    several bytes (``seed`` chooses which)."""
    named = dict(schema.parsed.get("__named_schemas", {}))
    state = [seed]

    def choice(k: int) -> int:
        state[0] = (state[0] * 1_103_515_245 + 12_345) % 2**31
        return state[0] % k

    def varint(n: int, extra: int = 0) -> bytes:
        out = bytearray()
        n = (n << 1) ^ (n >> 63)
        while n > 127 or extra:
            if n <= 127:
                extra -= 1
            out.append((n & 127) | 128)
            n >>= 7
        out.append(n)
        return bytes(out)

    def write(t: Any, v: Any) -> bytes:
        if isinstance(t, str) and t in named:
            t = named[t]
        if isinstance(t, list):
            if v is None:
                j = t.index("null")
            elif isinstance(v, dict):
                j = next(i for i, b in enumerate(t) if isinstance(b, dict) or b in named)
            elif isinstance(v, str) and "string" in t:
                j = t.index("string")
            else:
                j = next(i for i, b in enumerate(t) if b != "null")
            return varint(j, choice(3)) + write(t[j], v)
        kind = t["type"] if isinstance(t, dict) else t
        if kind in ("record", "error"):
            return b"".join(write(f["type"], v[f["name"]]) for f in t["fields"])
        if kind == "array":
            out = bytearray()
            items = list(v)
            k = 0
            while k < len(items):
                size = 1 + choice(2)
                block = items[k : k + size]
                k += size
                body = b"".join(write(t["items"], x) for x in block)
                if choice(2):
                    out += varint(-len(block)) + varint(len(body)) + body
                else:
                    out += varint(len(block)) + body
            return bytes(out) + (b"\x80\x00" if choice(3) == 0 else b"\x00")
        if kind == "enum":
            return varint(t["symbols"].index(v))
        return _writer_value(kind, v)

    return write(schema.parsed, record)


def _writer_value(kind: str, v: Any) -> bytes:
    """A primitive value in Avro's binary encoding."""
    if kind == "null":
        return b""
    if kind == "boolean":
        return b"\x01" if v else b"\x00"
    if kind in ("int", "long"):
        n = (v << 1) ^ (v >> 63)
        out = bytearray()
        while n > 127:
            out.append((n & 127) | 128)
            n >>= 7
        out.append(n)
        return bytes(out)
    if kind == "float":
        return struct.pack("<f", v)
    if kind == "double":
        return struct.pack("<d", v)
    raw = v.encode() if kind == "string" else bytes(v)
    return _writer_value("long", len(raw)) + raw


_WRITERS: dict[str, AvroWriter] = {}


def _writer(schema: EventSchema) -> AvroWriter:
    if schema.schema_id not in _WRITERS:
        _WRITERS[schema.schema_id] = AvroWriter(schema)
    return _WRITERS[schema.schema_id]


# ------------------------------------------------------------------------ the cases

# One event: (version index, record, damage: None or (how, a number choosing where)).
Event = tuple[int, dict[str, Any], tuple[str, int] | None]
# (change events, first version's fields, second version's fields, events)
Case = tuple[bool, tuple[Field, ...], tuple[Field, ...], list[Event]]


@functools.cache
def _schemas(
    change_events: bool, first: tuple[Field, ...], second: tuple[Field, ...]
) -> tuple[EventSchema, EventSchema]:
    return (
        event_schema(first, version=1, change_events=change_events),
        event_schema(second, version=2, change_events=change_events),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """An object's two schema versions and events of them, some perhaps damaged."""
    change_events = draw(st.integers(0, 4)) > 0
    first, second = (tuple(fields) for fields in draw(versions()))
    schemas = _schemas(change_events, first, second)
    fields = (first, second)
    kinds = (*DAMAGE, *CHANGES) if change_events else ("cut", "trailing", "null", *CHANGES)
    damaging = draw(st.integers(0, 2)) > 0
    events: list[Event] = []
    for _ in range(draw(st.integers(1, 12))):
        v = draw(st.integers(0, 1))
        record = draw(_event(schemas[v], fields[v]))
        damage = None
        if damaging and (not any(e[2] for e in events) or draw(st.integers(0, 2)) == 0):
            damage = (draw(st.sampled_from(kinds)), draw(st.integers(0, 10**6)))
        events.append((v, record, damage))
    return change_events, first, second, events


# ------------------------------------------------------------------------ decoding


def _decode(plan: DecodePlan, bronze: pa.Table, *, reference: bool) -> pa.Table:
    """The decoded rows of ``bronze``: by silver's decoder, or (``reference``) by the row
    decoder, each bad row reported with its reason as
    :meth:`~ingest.decoding.EventDecoder.decode_batch` gives it, a bitmap error as
    ``bad_bitmap`` and another object's header as ``wrong_entity``."""
    with mock.patch.object(decode._Builder, "build", _row_path) if reference else nullcontext():
        batches = list(decode_batches(plan, iter(bronze.to_batches())))
    return pa.Table.from_batches(batches, schema=spark_schema_to_arrow(decoded_schema(plan)))


def _row_path(builder: Any, schema: pa.Schema, bronze: pa.RecordBatch) -> Any:
    """Silver's step on the row decoder: its rows through the same column builders."""
    return decode._Builder._rows(builder, schema, bronze)


def _plain(value: Any) -> Any:
    """``value`` with every float as its repr (NaN equals NaN, -0.0 differs from 0.0)."""
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    rows = [_plain(r) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: r["_cdc_bronze_batch_seq"])


def _check(case: Case, counts: Counter[str]) -> None:
    change_events, first, second, events = case
    schemas = _schemas(change_events, first, second)
    payloads = [
        _writer(schemas[v]).write(record)
        if damage is None
        else _damaged(schemas[v], record, *damage)
        for v, record, damage in events
    ]
    ids = [schemas[v].schema_id for v, _, _ in events]
    layout = build_layout(schemas[0].entity_name, schemas)
    plan = DecodePlan(layout, {s.schema_id: s.json for s in schemas})
    bronze = bronze_batch(list(zip(ids, payloads, strict=True)), batch_id=3)
    bronze = bronze.select(list(BRONZE_COLUMNS))
    # Schema ids are fingerprints of the canonical form, which leaves docs out: versions of
    # two examples may share an id and differ in their docs (a Data:Long field and a
    # Data:DateTime one), so each example starts with empty decoder caches.
    with (
        mock.patch.object(decode, "_DECODERS", DecoderCache(decode._registry_json)),
        mock.patch.dict(decode._BUILDERS, clear=True),
    ):
        fast = _decode(plan, bronze, reference=False)
        reference = _decode(plan, bronze, reference=True)
    assert _rows(fast) == _rows(reference)

    # Damage every decoder refuses is reported on exactly its rows, whatever else the batch
    # holds; other changes may or may not leave a valid payload (the comparison above judges).
    errors = {
        r["_cdc_bronze_batch_seq"]: r["_cdc_error_kind"]
        for r in reference.to_pylist()
        if r["_cdc_error"] is not None
    }
    refused = {
        "cut": "corrupt_payload",
        "trailing": "corrupt_payload",
        "null": "corrupt_payload",
        "bitmap": "bad_bitmap",
        "entity": "wrong_entity",
    }
    for k, (_, _, damage) in enumerate(events):
        if damage is None or damage[0] == "irregular":
            assert k not in errors
        elif damage[0] in refused:
            assert errors.get(k) == refused[damage[0]]
        counts[damage[0] if damage else "good"] += 1
    for r in reference.to_pylist():
        if r["_cdc_error"] is not None:
            reason = r["_cdc_error"].partition("): ")[2] or r["_cdc_error"]
            counts[f"{r['_cdc_error_kind']}: {' '.join(reason.split()[:2])}"] += 1
    counts["events"] += len(events)
    counts["errors"] += len(errors)


def test_silver_decodes_as_the_row_decoder_on_generated_events() -> None:
    counts: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES or 120,
        deadline=None,
        derandomize=not EXAMPLES,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases())
    def check(case: Case) -> None:
        _check(case, counts)

    check()
    print(dict(sorted(counts.items())))
    assert counts["errors"] > 0 and counts["good"] > 0, counts
