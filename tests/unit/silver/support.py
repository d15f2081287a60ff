"""Small Salesforce-shaped schemas and payloads for the silver tests.

Payloads are written with fastavro (independent of the decoders under test); bitmaps are
computed here from field positions, the way the reference describes them (bit i of one
big-endian integer names field i, ``ChangeEventHeader`` being field 0).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, schemaless_writer

from ingest.schema import EventSchema, parse_event_schema
from pipelines.bronze.tables import BRONZE_SCHEMA

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
]
STRINGS = {"type": "array", "items": "string"}
HEADER = {
    "type": "record",
    "name": "ChangeEventHeader",
    "fields": [
        {"name": "entityName", "type": "string"},
        {"name": "recordIds", "type": STRINGS},
        {
            "name": "changeType",
            "type": {"type": "enum", "name": "ChangeType", "symbols": CHANGE_TYPES},
        },
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
}
ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [
        {"name": n, "type": ["null", t], "default": None}
        for n, t in [
            ("Street", "string"),
            ("City", "string"),
            ("PostalCode", "string"),
            ("Latitude", "double"),
            ("Longitude", "double"),
        ]
    ],
}
PERSON = {
    "type": "record",
    "name": "Switchable_PersonName",
    "fields": [
        {"name": n, "type": ["null", "string"], "default": None}
        for n in ("Salutation", "FirstName", "LastName")
    ],
}


def opt(name: str, avro_type: Any, doc: str) -> dict[str, Any]:
    return {"name": name, "type": ["null", avro_type], "doc": doc, "default": None}


def account_fields(version: int) -> list[dict[str, Any]]:
    """Account v1, and v2 (a custom field inserted before Phone, shifting every later bitmap
    position, and a second address)."""
    fields: list[dict[str, Any]] = [
        {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"},
        {
            "name": "Name",
            "type": ["null", "string", PERSON],
            "doc": "Data:Switchable_PersonName",
            "default": None,
        },
        opt("BillingAddress", ADDRESS, "Data:Address"),
    ]
    if version >= 2:
        fields.append(opt("Tier__c", "string", "Data:DynamicEnum:00N000000000T01"))
    fields += [
        opt("Phone", "string", "Data:Phone"),
        opt("AnnualRevenue", "double", "Data:Currency"),
        opt("NumberOfEmployees", "int", "Data:Integer"),
        opt("IsActive__c", "boolean", "Data:Boolean:00N000000000A01"),
        opt("Description", "string", "Data:StringPlusClob"),
        opt("SLA_Date__c", "long", "Data:DateOnly:00N000000000A02"),
        opt("Open_At__c", "long", "Data:TimeOnly:00N000000000A03"),
        opt("LastModifiedDate", "long", "Data:DateTime"),
    ]
    if version >= 2:
        fields.append(opt("ShippingAddress", "Address", "Data:Address"))
    return fields


def change_schema(entity: str, fields: list[dict[str, Any]]) -> EventSchema:
    name = (
        f"{entity.removesuffix('__c')}__ChangeEvent"
        if entity.endswith("__c")
        else f"{entity}ChangeEvent"
    )
    raw = {"type": "record", "name": name, "namespace": "com.sforce.eventbus", "fields": fields}
    return parse_event_schema(json.dumps(raw, separators=(",", ":")))


ACCOUNT_V1 = change_schema("Account", account_fields(1))
ACCOUNT_V2 = change_schema("Account", account_fields(2))
CONTACT = change_schema(
    "Contact",
    [
        {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"},
        opt("LastName", "string", "Data:Text"),
        opt("Birthdate", "long", "Data:DateOnly"),
    ],
)
ORDER_SHIPPED = parse_event_schema(
    json.dumps(
        {
            "type": "record",
            "name": "Order_Shipped__e",
            "namespace": "com.sforce.eventbus",
            "fields": [
                {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
                {"name": "CreatedById", "type": "string", "doc": "CreatedBy:EntityId"},
                opt("Weight__c", "double", "Data:Double:00N000000000E01"),
                opt("Delivery_Date__c", "long", "Data:DateOnly:00N000000000E02"),
            ],
        },
        separators=(",", ":"),
    )
)


def bitmap(schema: EventSchema, names: Iterable[str]) -> list[str]:
    """changedFields-style bitmap: ``0x..`` for top-level fields, ``p-0x..`` for children."""
    top = 0
    nested: dict[int, int] = {}
    for name in names:
        parent, _, child = name.partition(".")
        field = schema.field(parent)
        if child:
            nested[field.index] = nested.get(field.index, 0) | 1 << field.child(child).index
        else:
            top |= 1 << field.index
    out = []
    if top:
        digits = f"{top:X}"
        out.append("0x" + digits.zfill(len(digits) + len(digits) % 2))
    for p, value in sorted(nested.items()):
        digits = f"{value:X}"
        out.append(f"{p}-0x" + digits.zfill(len(digits) + len(digits) % 2))
    return out


def header(
    schema: EventSchema,
    change_type: str,
    record_ids: Sequence[str],
    *,
    changed: Sequence[str] = (),
    nulled: Sequence[str] = (),
    diffed: Sequence[str] = (),
    commit_timestamp: int = 1_735_689_600_000,
    commit_number: int = 1_709_303_151_782_928_388,
    sequence: int = 1,
) -> dict[str, Any]:
    return {
        "entityName": schema.entity_name,
        "recordIds": list(record_ids),
        "changeType": change_type,
        "changeOrigin": "com/salesforce/api/rest/62.0",
        "transactionKey": f"tx-{record_ids[0] if record_ids else 'none'}-{sequence}",
        "sequenceNumber": sequence,
        "commitTimestamp": commit_timestamp,
        "commitNumber": commit_number,
        "commitUser": "005000000000001AAA",
        "nulledFields": bitmap(schema, nulled),
        "diffFields": bitmap(schema, diffed),
        "changedFields": bitmap(schema, changed),
    }


def encode(schema: EventSchema, record: Mapping[str, Any]) -> bytes:
    parsed = parse_schema(json.loads(schema.json))
    body = {f.name: None for f in schema.fields}
    body.update(record)
    out = io.BytesIO()
    schemaless_writer(out, parsed, body)
    return out.getvalue()


def change_event(
    schema: EventSchema,
    change_type: str,
    record_ids: Sequence[str],
    values: Mapping[str, Any] | None = None,
    **header_options: Any,
) -> bytes:
    record = {"ChangeEventHeader": header(schema, change_type, record_ids, **header_options)}
    record.update(values or {})
    return encode(schema, record)


def replay_id(n: int) -> bytes:
    return n.to_bytes(8, "big") + b"\x00\x00"


def bronze_batch(
    events: Sequence[tuple[str, bytes]],
    *,
    batch_id: int = 0,
    first_seq: int = 0,
    topic: str = "/data/AccountChangeEvent",
) -> pa.Table:
    """Bronze rows (the landing's columns) for ``(schema_id, payload)`` pairs."""
    n = len(events)
    seqs = range(first_seq, first_seq + n)
    return pa.table(
        schema=BRONZE_SCHEMA,
        data={
            "replay_id": pa.array([replay_id(batch_id * 1_000 + s) for s in seqs], pa.binary()),
            "event_id": pa.array([f"evt-{batch_id}-{s}" for s in seqs], pa.string()),
            "schema_id": pa.array([sid for sid, _ in events], pa.string()),
            "payload": pa.array([p for _, p in events], pa.binary()),
            "topic": pa.array([topic] * n, pa.string()),
            "received_at": pa.array([1_735_689_600_000_000] * n, pa.timestamp("us", tz="UTC")),
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "batch_seq": pa.array(list(seqs), pa.int32()),
        },
    )
