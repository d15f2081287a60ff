"""Salesforce-shaped schemas, value strategies and a strict comparison for decoding tests."""

from __future__ import annotations

import io
import itertools
import json
import math
import string
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from hypothesis import strategies as st

from ingest.schema import EventSchema, parse_event_schema

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
STRINGS = {"type": "array", "items": "string"}


def opt(name: str, t: Any, doc: str | None = None) -> dict[str, Any]:
    """A Salesforce body field: ``["null", T]`` with default null."""
    field: dict[str, Any] = {"name": name, "type": ["null", t], "default": None}
    if doc:
        field["doc"] = doc
    return field


def header(*, enum_namespace: str | None = "") -> dict[str, Any]:
    enum: dict[str, Any] = {"type": "enum", "name": "ChangeType", "symbols": CHANGE_TYPES}
    if enum_namespace is not None:
        enum["namespace"] = enum_namespace
    return {
        "name": "ChangeEventHeader",
        "doc": "Data:ComplexValueType",
        "type": {
            "type": "record",
            "name": "ChangeEventHeader",
            "fields": [
                {"name": "entityName", "type": "string"},
                {"name": "recordIds", "type": STRINGS},
                {"name": "changeType", "type": enum},
                {"name": "changeOrigin", "type": "string"},
                {"name": "transactionKey", "type": "string"},
                {"name": "sequenceNumber", "type": "int"},
                {"name": "commitTimestamp", "type": "long"},
                {"name": "commitNumber", "type": "long"},
                {"name": "commitUser", "type": "string"},
                {"name": "nulledFields", "type": STRINGS},
                {"name": "diffFields", "type": STRINGS},
                {"name": "changedFields", "type": STRINGS},
            ],
        },
    }


ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [
        opt("Street", "string"),
        opt("City", "string"),
        opt("State", "string"),
        opt("PostalCode", "string"),
        opt("Country", "string"),
        opt("StateCode", "string"),
        opt("CountryCode", "string"),
        opt("Latitude", "double"),
        opt("Longitude", "double"),
        opt("GeocodeAccuracy", "string"),
    ],
}
LOCATION = {
    "type": "record",
    "name": "Location",
    "fields": [opt("Latitude", "double"), opt("Longitude", "double")],
}
SWITCHABLE_NAME = {
    "type": "record",
    "name": "Switchable_PersonName",
    "fields": [opt("Salutation", "string"), opt("FirstName", "string"), opt("LastName", "string")],
}


def account_schema() -> dict[str, Any]:
    """An Account change event with every construct Salesforce uses and every primitive."""
    return {
        "type": "record",
        "name": "AccountChangeEvent",
        "namespace": "com.sforce.eventbus",
        "fields": [
            header(),
            {
                "name": "Name",
                "type": ["null", "string", SWITCHABLE_NAME],
                "doc": "Data:Switchable_PersonName",
                "default": None,
            },
            opt("Type", "string", "Data:DynamicEnum"),
            opt("ParentId", "string", "ForeignKey:EntityId"),
            opt("BillingAddress", ADDRESS, "Data:Address"),
            opt("ShippingAddress", "Address", "Data:Address"),
            opt("Phone", "string", "Data:Phone"),
            opt("AnnualRevenue", "double", "Data:Currency"),
            opt("NumberOfEmployees", "int", "Data:Integer"),
            opt("Description", "string", "Data:StringPlusClob"),
            opt("CreatedDate", "long", "CreatedDate:DateTime"),
            opt("LastModifiedDate", "long", "Data:DateTime"),
            opt("PersonMailingAddress", "com.sforce.eventbus.Address", "Data:Address"),
            opt("PersonBirthdate", "long", "Data:DateOnly"),
            opt("PersonDoNotCall", "boolean", "Data:Boolean"),
            opt("Headquarters__c", LOCATION, "Data:Location:00N000000000001"),
            opt("Opening_Time__c", "long", "Data:TimeOnly:00N000000000002"),
            opt("Discount__c", "double", "Data:Percent:00N000000000003"),
            opt("Regions__c", "string", "Data:MultiEnum:00N000000000004"),
            opt("Ratio__c", "float"),
            opt("Blob__c", "bytes"),
            opt("Tier__c", {"type": "enum", "name": "Tier", "symbols": ["GOLD", "SILVER"]}),
            opt("Tags__c", STRINGS),
            opt("Flags__c", {"type": "map", "values": "long"}),
            opt("Digest__c", {"type": "fixed", "name": "Digest", "size": 4}),
        ],
    }


def event_schema(schema: dict[str, Any]) -> EventSchema:
    return parse_event_schema(json.dumps(schema))


def encode(schema: EventSchema, record: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, schema.parsed, record)
    return out.getvalue()


def fastavro_decode(schema: EventSchema, payload: bytes) -> Any:
    return schemaless_reader(io.BytesIO(payload), schema.parsed, None)


def same(a: Any, b: Any) -> bool:
    """Equal, with equal types and key order, NaN equal to NaN and -0.0 distinct from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- values for any (fastavro-parsed) schema --------------------------------------------

LONG_EDGES = [0, -1, 1, 63, -64, 64, -65, 2**31 - 1, -(2**31), 2**53 + 1, 2**63 - 1, -(2**63)]
LONGS = st.one_of(st.sampled_from(LONG_EDGES), st.integers(-(2**63), 2**63 - 1))
INTS = st.one_of(
    st.sampled_from([0, -1, 63, -64, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1)
)
TEXT = st.one_of(
    st.just(""),
    st.text(max_size=20),
    st.text(alphabet="éß漢字🙂a", min_size=30, max_size=80),  # multi-byte lengths over 64 bytes
    st.text(min_size=60, max_size=300),
)
PRIMITIVE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": INTS,
    "long": LONGS,
    "float": st.floats(width=32),
    "double": st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -0.0]), st.floats()),
    "bytes": st.binary(max_size=80),
    "string": TEXT,
}


def values(t: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of Avro type ``t`` (from a fastavro-parsed schema) that fastavro can write."""
    if isinstance(t, str):
        if t in PRIMITIVE_VALUES:
            return PRIMITIVE_VALUES[t]
        return values(named[t], named)
    if isinstance(t, list):
        return st.one_of([values(b, named) for b in t])
    kind = t["type"]
    if kind in PRIMITIVE_VALUES:
        return PRIMITIVE_VALUES[kind]
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values(f["type"], named) for f in t["fields"]})
    if kind == "enum":
        return st.sampled_from(t["symbols"])
    if kind == "fixed":
        return st.binary(min_size=t["size"], max_size=t["size"])
    if kind == "array":
        return st.lists(values(t["items"], named), max_size=4)
    if kind == "map":
        return st.dictionaries(TEXT, values(t["values"], named), max_size=3)
    raise AssertionError(f"no strategy for {t!r}")


def records(schema: EventSchema) -> st.SearchStrategy[Any]:
    parsed = schema.parsed
    return values(parsed, parsed["__named_schemas"])


def hex_bitmap(bits: set[int], *, upper: bool, pad: int) -> str:
    """A bitmap element as Salesforce writes it (``0x`` + big-endian hex), any case/padding."""
    digits = format(sum(1 << i for i in bits), "X" if upper else "x")
    return "0x" + "0" * pad + digits


@st.composite
def bitmaps(draw: st.DrawFn, schema: EventSchema) -> list[str]:
    """A bitmap that fits ``schema``: top-level bits plus P-0x.. elements for compounds."""
    top = draw(st.sets(st.integers(1, len(schema.fields) - 1), max_size=5))
    upper, pad = draw(st.booleans()), draw(st.integers(0, 2))
    elements = [hex_bitmap(top, upper=upper, pad=pad)] if top or draw(st.booleans()) else []
    for f in schema.fields:
        if f.children and f.kind != "header" and draw(st.integers(0, 3)) == 0:
            children = draw(st.sets(st.integers(0, len(f.children) - 1), min_size=1))
            elements.append(f"{f.index}-{hex_bitmap(children, upper=upper, pad=pad)}")
    return draw(st.permutations(elements))


def change_events(schema: EventSchema) -> st.SearchStrategy[Any]:
    """Records of a change event schema whose three bitmaps fit the schema."""

    def with_bitmaps(record: dict[str, Any]) -> st.SearchStrategy[Any]:
        return st.tuples(bitmaps(schema), bitmaps(schema), bitmaps(schema)).map(
            lambda b: {
                **record,
                "ChangeEventHeader": {
                    **record["ChangeEventHeader"],
                    "changedFields": b[0],
                    "nulledFields": b[1],
                    "diffFields": b[2],
                },
            }
        )

    return records(schema).flatmap(with_bitmaps)


# --- random schemas ---------------------------------------------------------------------

_NAME_START = string.ascii_letters + "_"
_NAME_REST = _NAME_START + string.digits
# Names that would be dangerous or confusing if they ever became code in a generated decoder.
_TRICKY_NAMES = ["buf", "pos", "r", "n", "e", "u", "b", "ln", "class", "None", "__import__", "_k0"]
FIELD_NAMES = st.one_of(
    st.sampled_from(_TRICKY_NAMES),
    st.text(_NAME_START, min_size=1, max_size=1).flatmap(
        lambda c: st.text(_NAME_REST, max_size=12).map(lambda rest: c + rest)
    ),
)
_PRIMITIVE_NAMES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]


@st.composite
def avro_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A random record schema built from every construct Avro has except logical types."""
    serial = itertools.count()
    defined: list[str] = []

    def named(prefix: str) -> str:
        return f"{prefix}{next(serial)}"

    def record(depth: int) -> dict[str, Any]:
        names = draw(st.lists(FIELD_NAMES, min_size=1, max_size=6, unique=True))
        fields = [{"name": n, "type": any_type(depth + 1)} for n in names]
        rec = {"type": "record", "name": named("R"), "fields": fields}
        defined.append(rec["name"])
        return rec

    def non_union(depth: int) -> Any:
        options = ["primitive", "enum", "fixed"]
        if depth < 3:
            options += ["record", "array", "map"]
        if defined:
            options.append("reference")
        kind = draw(st.sampled_from(options))
        if kind == "primitive":
            return draw(st.sampled_from(_PRIMITIVE_NAMES))
        if kind == "enum":
            symbols = draw(st.lists(FIELD_NAMES, min_size=1, max_size=5, unique=True))
            enum = {"type": "enum", "name": named("E"), "symbols": symbols}
            defined.append(enum["name"])
            return enum
        if kind == "fixed":
            fixed = {"type": "fixed", "name": named("F"), "size": draw(st.integers(0, 6))}
            defined.append(fixed["name"])
            return fixed
        if kind == "record":
            return record(depth)
        if kind == "array":
            return {"type": "array", "items": non_empty(depth + 1)}
        if kind == "map":
            return {"type": "map", "values": non_empty(depth + 1)}
        return draw(st.sampled_from(defined))

    def non_empty(depth: int) -> Any:
        # Arrays of zero-width items (null, empty fixed) are valid Avro but are left to
        # fastavro by design; they get their own test.
        t = non_union(depth)
        if t == "null":
            t = draw(st.sampled_from(["string", "long", "double"]))
        if isinstance(t, dict) and t["type"] == "fixed" and t["size"] == 0:
            t["size"] = 1  # still unreferenced: it was defined just now
        return t

    def union(depth: int) -> list[Any]:
        # One branch per kind, so that the writer never has to choose between two branches.
        kinds = draw(
            st.lists(
                st.sampled_from(["null", "boolean", "long", "double", "string", "bytes", "named"]),
                min_size=1,
                max_size=4,
                unique=True,
            )
        )
        return [
            (record(depth) if depth < 3 else {"type": "enum", "name": named("E"), "symbols": ["A"]})
            if k == "named"
            else k
            for k in kinds
        ]

    def any_type(depth: int) -> Any:
        if draw(st.booleans()):
            return union(depth)
        return non_union(depth)

    top = record(0)
    top["name"] = "Top"
    return top
