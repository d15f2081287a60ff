"""Salesforce event schemas: ids, and a typed view of their fields.

Salesforce serves every event schema as Avro JSON. Its schema id is the unpadded base64url MD5
fingerprint of the schema's Avro *parsing canonical form*, so doc-only edits keep the id and
any field change produces a new one. The field list matters beyond decoding: a change event's
bitmaps (changedFields, nulledFields, diffFields) address fields by their position in it,
with position 0 being ``ChangeEventHeader`` itself.

Avro alone cannot tell a Date from a DateTime from a Time (all plain ``long``) or a currency
from a number (all ``double``); the field's ``doc`` annotation (``Data:DateOnly``,
``Data:DateTime:00N...``, ``CreatedDate:DateTime``) is the only source, so it is parsed here
once into a :class:`FieldKind`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from fastavro import parse_schema
from fastavro.schema import to_parsing_canonical_form

__all__ = [
    "COMPOUND_KINDS",
    "HEADER_FIELD",
    "EventSchema",
    "FieldInfo",
    "FieldKind",
    "parse_event_schema",
    "schema_id",
]

HEADER_FIELD = "ChangeEventHeader"

FieldKind = Literal[
    "header",  # ChangeEventHeader
    "id",  # record ids and lookups (ForeignKey:EntityId, ExternalForeignKey:ExternalId)
    "string",  # text, phone, email, url, picklists, encrypted text
    "long_text",  # Text Area / Long Text Area / Rich Text Area: may arrive as a diff
    "multi_picklist",  # ';'-separated values
    "boolean",
    "int",
    "long",
    "double",  # Data:Double, Data:Currency, Data:Percent
    "date",  # Data:DateOnly / Data:Birthday: epoch ms at midnight UTC
    "datetime",  # *:DateTime: epoch ms UTC
    "time",  # Data:TimeOnly: ms since midnight
    "compound",  # Address, Location, PersonName: a nested record
    "switchable_name",  # Account.Name: ["null", "string", Switchable_PersonName]
    "record",  # any other nested record
    "other",
]

COMPOUND_KINDS: frozenset[str] = frozenset({"compound", "switchable_name"})

_DATE_TYPES = {"DateOnly", "Birthday", "Date"}
_TIME_TYPES = {"TimeOnly", "Time"}
_DOUBLE_TYPES = {"Double", "Currency", "Percent"}
_LONG_TEXT_TYPES = {"StringPlusClob", "HtmlStringPlusClob", "Clob", "TextArea"}
_ID_ROLES = {"ForeignKey", "ExternalForeignKey", "CreatedBy", "LastModifiedBy", "Owner"}


@dataclass(frozen=True, slots=True)
class FieldInfo:
    """One field of an event schema (or one child of a compound field).

    ``index`` is the field's position among its siblings: for top-level fields it is the
    bitmap bit that names the field; for compound children the bit inside the ``P-0x..``
    element. ``value_type`` is the non-null Avro type (the union minus ``"null"``; for the
    three-way name union, the remaining two branches as a list).
    """

    name: str
    index: int
    value_type: Any
    doc: str = ""
    role: str = ""
    sf_type: str = ""
    kind: FieldKind = "other"
    nullable: bool = True
    children: tuple[FieldInfo, ...] = ()

    @property
    def is_compound(self) -> bool:
        """Address, Location, PersonName and Account's switchable name (not the header)."""
        return self.kind in COMPOUND_KINDS

    @property
    def is_diffable(self) -> bool:
        """Long text fields are the ones Salesforce may send as a unified diff."""
        return self.kind == "long_text"

    def child(self, name: str) -> FieldInfo:
        for c in self.children:
            if c.name == name:
                return c
        known = ", ".join(c.name for c in self.children)
        raise KeyError(f"{self.name} has no child {name!r} (children: {known})")


@dataclass(frozen=True)
class EventSchema:
    """A parsed event schema: its id, JSON text, full name and typed top-level fields."""

    schema_id: str
    json: str
    name: str
    fields: tuple[FieldInfo, ...]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def is_change_event(self) -> bool:
        return bool(self.fields) and self.fields[0].name == HEADER_FIELD

    @property
    def entity_name(self) -> str:
        """``Account`` for ``AccountChangeEvent``, ``Invoice__c`` for ``Invoice__ChangeEvent``,
        the event name itself for platform events."""
        short = self.name.rsplit(".", 1)[-1]
        if short.endswith("__ChangeEvent"):
            return short.removesuffix("__ChangeEvent") + "__c"
        if short.endswith("ChangeEvent"):
            return short.removesuffix("ChangeEvent")
        return short

    @cached_property
    def by_name(self) -> dict[str, FieldInfo]:
        return {f.name: f for f in self.fields}

    @cached_property
    def parsed(self) -> Any:
        """The fastavro-parsed schema, parsed once per schema and reused for every event."""
        return parse_schema(json.loads(self.json))

    def field(self, name: str) -> FieldInfo:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"schema {self.name} ({self.schema_id}) has no field {name!r}") from None


def schema_id(schema: str | Mapping[str, Any]) -> str:
    """Salesforce's schema id: unpadded base64url MD5 of the Avro parsing canonical form."""
    parsed = json.loads(schema) if isinstance(schema, str) else dict(schema)
    canonical = to_parsing_canonical_form(parsed)
    digest = hashlib.md5(canonical.encode("utf-8"), usedforsecurity=False).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def parse_event_schema(schema_json: str, *, expected_id: str | None = None) -> EventSchema:
    """Parse an event schema (change event or platform event) into an :class:`EventSchema`.

    When ``expected_id`` is given (the id the server sent) and the computed fingerprint differs,
    the expected id is kept: the server's id is what events reference.
    """
    raw = json.loads(schema_json)
    if not isinstance(raw, dict) or raw.get("type") != "record":
        got = raw.get("type") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"an event schema must be an Avro record (got type {got!r})")
    namespace = raw.get("namespace", "")
    full_name = raw["name"] if "." in raw["name"] or not namespace else f"{namespace}.{raw['name']}"
    named: dict[str, Any] = {}
    fields = tuple(
        _field_info(f, i, named) for i, f in enumerate(_record_fields(raw, named, "top level"))
    )
    return EventSchema(
        schema_id=expected_id or schema_id(raw),
        json=schema_json,
        name=full_name,
        fields=fields,
        raw=raw,
    )


def _record_fields(record: Mapping[str, Any], named: dict[str, Any], where: str) -> Sequence[Any]:
    fields = record.get("fields")
    if not isinstance(fields, list):
        raise ValueError(f"record {record.get('name')!r} at {where} has no field list")
    named[record["name"]] = record
    named[record["name"].rsplit(".", 1)[-1]] = record
    return fields


def _register_named(t: Any, named: dict[str, Any]) -> None:
    if isinstance(t, dict) and t.get("type") in {"record", "enum", "fixed"} and "name" in t:
        named[t["name"]] = t
        named[t["name"].rsplit(".", 1)[-1]] = t


def _resolve(t: Any, named: Mapping[str, Any]) -> Any:
    if isinstance(t, str) and t in named:
        return named[t]
    if isinstance(t, str) and t.rsplit(".", 1)[-1] in named:
        return named[t.rsplit(".", 1)[-1]]
    return t


def _split_doc(doc: str) -> tuple[str, str]:
    parts = doc.split(":")
    role = parts[0] if parts else ""
    sf_type = parts[1] if len(parts) > 1 else ""
    return role, sf_type


def _field_info(f: Mapping[str, Any], index: int, named: dict[str, Any]) -> FieldInfo:
    name = f["name"]
    t = f["type"]
    doc = f.get("doc", "") or ""
    role, sf_type = _split_doc(doc)
    branches = t if isinstance(t, list) else [t]
    for b in branches:
        _register_named(b, named)
    non_null = [_resolve(b, named) for b in branches if b != "null"]
    nullable = len(non_null) < len(branches)
    value_type: Any = non_null[0] if len(non_null) == 1 else non_null

    children: tuple[FieldInfo, ...] = ()
    records = [b for b in non_null if isinstance(b, dict) and b.get("type") == "record"]
    if records:
        record = records[0]
        children = tuple(
            _field_info(c, i, named)
            for i, c in enumerate(_record_fields(record, named, f"field {name}"))
        )
    kind = _kind(name, value_type, role, sf_type, records=bool(records), branches=len(non_null))
    return FieldInfo(
        name=name,
        index=index,
        value_type=value_type,
        doc=doc,
        role=role,
        sf_type=sf_type,
        kind=kind,
        nullable=nullable,
        children=children,
    )


def _avro_primitive(value_type: Any) -> str:
    if isinstance(value_type, str):
        return value_type
    if isinstance(value_type, dict):
        return str(value_type.get("type", ""))
    return "union"


def _kind(
    name: str, value_type: Any, role: str, sf_type: str, *, records: bool, branches: int
) -> FieldKind:
    if name == HEADER_FIELD:
        return "header"
    if records and branches > 1:
        return "switchable_name"
    if records:
        return "compound" if sf_type else "record"
    primitive = _avro_primitive(value_type)
    if primitive == "long":
        if sf_type in _DATE_TYPES:
            return "date"
        if sf_type in _TIME_TYPES:
            return "time"
        if sf_type == "DateTime":
            return "datetime"
        return "long"
    if primitive == "int":
        return "int"
    if primitive in {"double", "float"}:
        return "double"
    if primitive == "boolean":
        return "boolean"
    if primitive == "string":
        if role in _ID_ROLES or sf_type in {"EntityId", "ExternalId"}:
            return "id"
        if sf_type in _LONG_TEXT_TYPES:
            return "long_text"
        if sf_type == "MultiEnum":
            return "multi_picklist"
        return "string"
    if sf_type in _DOUBLE_TYPES:
        return "double"
    return "other"
