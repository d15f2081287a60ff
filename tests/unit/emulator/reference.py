"""Independent reference implementations the emulator tests check against.

Written from the wire rules alone (bitmaps: big-endian integer, bit i = top-level field i with
field 0 the header, ``P-0x..`` for compound children; diffs: context-free unified hunks plus a
SHA-256 line; CDC replica semantics). Nothing here imports the code under test, so a mistake
there cannot hide behind the same mistake here.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastavro import parse_schema, schemaless_reader

UNKNOWN = "<value not reconstructible from events>"
_HUNK = re.compile(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@$")


# -- schemas ---------------------------------------------------------------------------------


@dataclass
class RawSchema:
    """A schema's top-level fields and, per compound field, its record's child names."""

    json_text: str
    fields: list[str]
    children: dict[str, list[str]]
    parsed: Any

    @classmethod
    def of(cls, json_text: str) -> RawSchema:
        raw = json.loads(json_text)
        named: dict[str, Any] = {}
        fields = []
        children: dict[str, list[str]] = {}
        for f in raw["fields"]:
            fields.append(f["name"])
            branches = f["type"] if isinstance(f["type"], list) else [f["type"]]
            for b in branches:
                if isinstance(b, dict) and b.get("type") == "record":
                    named[b["name"]] = b
            records = [
                named.get(b, b) if isinstance(b, str) else b
                for b in branches
                if (isinstance(b, dict) and b.get("type") == "record") or b in named
            ]
            if records and f["name"] != "ChangeEventHeader":
                children[f["name"]] = [c["name"] for c in records[0]["fields"]]
        return cls(json_text, fields, children, parse_schema(raw))


def decode_bitmap(schema: RawSchema, items: Iterable[str]) -> set[str]:
    """Field names of a bitmap array: ``0x..`` over top-level fields, ``P-0x..`` nested."""
    names: set[str] = set()
    for item in items:
        if item.startswith("0x"):
            value = int(item[2:], 16)
            for i in range(value.bit_length()):
                if value >> i & 1:
                    names.add(schema.fields[i])
        else:
            parent_text, _, hex_text = item.partition("-")
            assert hex_text.startswith("0x"), item
            parent = schema.fields[int(parent_text)]
            value = int(hex_text[2:], 16)
            for i in range(value.bit_length()):
                if value >> i & 1:
                    names.add(f"{parent}.{schema.children[parent][i]}")
    return names


# -- diffs -----------------------------------------------------------------------------------


def apply_diff(old: str, diff: str, newline: str) -> str:
    """Apply a Salesforce long text diff to ``old`` and verify its SHA-256 line."""
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert lines[0] == "--- ", lines[0]
    assert lines[1].startswith("+++ "), lines[1]
    expected = lines[1][4:]
    old_lines = old.split(newline)
    out: list[str] = []
    position = 0
    i = 2
    while i < len(lines):
        match = _HUNK.match(lines[i])
        assert match, lines[i]
        old_start, old_count, _, new_count = (int(g) for g in match.groups())
        start = old_start - 1 if old_count else old_start
        assert start >= position, "hunks out of order"
        out.extend(old_lines[position:start])
        removed = lines[i + 1 : i + 1 + old_count]
        assert [r[:1] for r in removed] == ["-"] * old_count
        assert [r[1:] for r in removed] == old_lines[start : start + old_count]
        added = lines[i + 1 + old_count : i + 1 + old_count + new_count]
        assert [a[:1] for a in added] == ["+"] * new_count
        out.extend(a[1:] for a in added)
        position = start + old_count
        i += 1 + old_count + new_count
    out.extend(old_lines[position:])
    new = newline.join(out)
    assert hashlib.sha256(new.encode("utf-8")).hexdigest() == expected, "hash mismatch"
    return new


# -- events ----------------------------------------------------------------------------------


@dataclass
class Decoded:
    """One event decoded with its own writer schema."""

    topic: str
    event_id: str
    schema_id: str
    header: dict[str, Any]
    body: dict[str, Any]
    schema: RawSchema

    @property
    def change_type(self) -> str:
        return str(self.header["changeType"])

    def names(self, bitmap: str) -> set[str]:
        return decode_bitmap(self.schema, self.header[bitmap])


def decode(event: Any, schemas: Mapping[str, RawSchema]) -> Decoded:
    schema = schemas[event.schema_id]
    record = schemaless_reader(io.BytesIO(event.payload), schema.parsed, schema.parsed)
    header = record.pop("ChangeEventHeader", None) or {}
    return Decoded(event.topic, event.event_id, event.schema_id, header, record, schema)


def raw_schemas(catalogue: Any) -> dict[str, RawSchema]:
    return {sid: RawSchema.of(s.json) for sid, s in catalogue.schemas.items()}


# -- a replica that folds events the way gold must -------------------------------------------


@dataclass
class Replica:
    """Folds decoded change events into current state by the CDC rules alone."""

    records: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    deleted: dict[str, set[str]] = field(default_factory=dict)
    diffs_applied: int = 0
    newlines_seen: set[str] = field(default_factory=set)
    # (entity, record id, whether a gap event had touched the record): a diff can only fail to
    # apply when events did not carry the previous value.
    diff_failures: list[tuple[str, str, bool]] = field(default_factory=list)
    # Records a gap event touched since the last event that carried their full image.
    stale: dict[str, set[str]] = field(default_factory=dict)

    def apply(self, event: Decoded) -> None:
        h = event.header
        entity = h["entityName"]
        records = self.records.setdefault(entity, {})
        deleted = self.deleted.setdefault(entity, set())
        kind = h["changeType"]
        ids = h["recordIds"]
        stale = self.stale.setdefault(entity, set())
        if kind.startswith("GAP_"):
            stale.update(ids)
        if kind in ("CREATE", "UNDELETE"):
            for rid in ids:
                records[rid] = self._normal(event.schema, copy.deepcopy(event.body))
                deleted.discard(rid)
                stale.discard(rid)
        elif kind == "UPDATE":
            changed = event.names("changedFields")
            nulled = event.names("nulledFields")
            diffed = event.names("diffFields")
            if len(ids) == 1 and ids[0].endswith("*"):
                for values in records.values():
                    for name in nulled:
                        values[name] = None
                return
            for rid in ids:
                values = records.setdefault(rid, {})
                for name in sorted(changed):
                    parent, _, child = name.partition(".")
                    if child:
                        current = values.get(parent)
                        merged = (
                            dict(current)
                            if isinstance(current, dict)
                            else dict.fromkeys(event.schema.children[parent])
                        )
                        merged[child] = None if name in nulled else event.body[parent][child]
                        values[parent] = (
                            merged if any(v is not None for v in merged.values()) else None
                        )
                    elif name in nulled:
                        values[name] = None
                    elif name in diffed:
                        old = values.get(name)
                        newline = "\r\n" if old and "\r\n" in old else "\n"
                        try:
                            if old is None:
                                raise AssertionError("no previous value")
                            values[name] = apply_diff(old, event.body[name], newline)
                        except AssertionError:
                            # What gold does too: the value cannot be rebuilt, re-read it.
                            self.diff_failures.append((entity, rid, rid in stale))
                            values[name] = UNKNOWN
                            continue
                        self.diffs_applied += 1
                        self.newlines_seen.add(newline)
                    else:
                        values[name] = event.body[name]
        elif kind in ("DELETE", "GAP_DELETE"):
            deleted.update(ids)
        elif kind == "GAP_UNDELETE":
            deleted.difference_update(ids)

    @staticmethod
    def _normal(schema: RawSchema, body: dict[str, Any]) -> dict[str, Any]:
        for name in schema.children:
            value = body.get(name)
            if isinstance(value, dict) and not any(v is not None for v in value.values()):
                body[name] = None
        return body
