"""Records read from Salesforce as gold rows: the SOQL of a snapshot and the typing of its values.

:func:`snapshot_soql` selects every gold column of an object: plain fields by name, Address and
Location compound fields by name (the REST API returns them as nested objects), person names by
their parts (``FirstName``, ``LastName``, ...), and for Account ``Name`` and
``IsPersonAccount`` as well. :func:`rest_row` turns one record, shaped as the REST API's JSON
shapes it, into gold body columns typed as silver types them (dates, timestamps in UTC,
time-of-day text, structs or flattened columns, Account's ``Name`` / ``Name_PersonName``).
Records read through the Bulk API are first shaped like REST records
(:mod:`pipelines.snapshot_read`), so both paths end in the same function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

from ingest.errors import RestError
from ingest.schema import FieldInfo
from pipelines.gold.columns import ID
from pipelines.silver.columns import FieldLayout, LeafKind, SilverLayout
from pipelines.spec.models import ObjectSpec

__all__ = [
    "RecordShape",
    "record_infos",
    "record_shapes",
    "rest_row",
    "rest_value",
    "snapshot_soql",
]


@dataclass(frozen=True)
class RecordShape:
    """How a compound field reads from REST: a nested object, or name parts as fields."""

    field: FieldLayout
    parts: bool


def record_infos(obj: ObjectSpec, registry: Mapping[str, Any]) -> dict[str, FieldInfo]:
    """The fields of every registered schema of ``obj``'s entity, the newest winning."""
    infos: dict[str, FieldInfo] = {}
    entries = sorted(
        (e for e in registry.values() if e.schema is not None),
        key=lambda e: (e.first_seen_at is None, e.first_seen_at or datetime.min, e.schema_id),
    )
    for entry in entries:
        if entry.schema.entity_name == obj.api_name:
            infos.update(entry.schema.by_name)
    return infos


def record_shapes(layout: SilverLayout, infos: Mapping[str, FieldInfo]) -> list[RecordShape]:
    """How each gold field reads from a record: a value, a nested object, or name parts."""
    shapes = []
    for f in layout.fields:
        info = infos.get(f.name)
        # The REST API returns a person name as text with its parts as fields of their own;
        # Address and Location come as nested objects.
        parts = f.shape == "switchable" or (info is not None and info.sf_type == "PersonName")
        shapes.append(RecordShape(f, parts))
    return shapes


def snapshot_soql(
    layout: SilverLayout,
    infos: Mapping[str, FieldInfo],
    ids: Sequence[str] | None = None,
    *,
    extra: Sequence[str] = (),
    where: str | None = None,
) -> str:
    """The SOQL that reads every gold column of ``layout``'s object (of ``ids`` only, when
    given): ``SELECT Id, IsDeleted, <fields> FROM <Object> [WHERE Id IN (...)]``, with the
    ``extra`` fields after Id and IsDeleted, and ``where`` (a condition) instead of ids."""
    if ids and where:
        raise ValueError("a snapshot query selects by ids or by a condition, not both")
    names = ["Id", "IsDeleted", *extra]
    for shape in record_shapes(layout, infos):
        f = shape.field
        if f.shape == "leaf" or not shape.parts:
            names.append(f.name)
        elif f.shape == "switchable":
            names.extend([f.name, *f.child_names(), "IsPersonAccount"])
        else:
            names.extend(f.child_names())
    soql = f"SELECT {', '.join(dict.fromkeys(names))} FROM {layout.entity}"
    if ids:
        bad = [i for i in ids if not i.isalnum()]
        if bad:
            raise ValueError(f"record ids are alphanumeric (got {bad[:3]})")
        soql += " WHERE Id IN (" + ", ".join(f"'{i}'" for i in ids) + ")"
    elif where:
        soql += f" WHERE {where}"
    return soql


def _lower_camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _value(kind: LeafKind, value: Any, where: str) -> Any:
    if value is None:
        return None
    try:
        if kind in ("string", "json", "binary"):
            return value if isinstance(value, str) else str(value)
        if kind == "boolean":
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind in ("int", "long"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError
            return int(value)
        if kind == "double":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError
            return float(value)
        if kind == "date":
            return date.fromisoformat(str(value)[:10])
        if kind == "timestamp":
            text = str(value)
            if len(text) == 10:
                return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
            parsed = datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
            return parsed.astimezone(timezone.utc)
        if kind == "time":
            return str(value).removesuffix("Z")
    except (TypeError, ValueError):
        pass
    raise RestError(
        f"REST value of {where}: expected a {kind} value as Salesforce's REST API writes it "
        f"(got {value!r})"
    )


def rest_value(kind: LeafKind, value: Any, where: str) -> Any:
    """One REST value typed as silver types a ``kind`` column (``where`` names it in errors:
    :class:`~ingest.errors.RestError` for a value that does not fit)."""
    return _value(kind, value, where)


def _struct(f: FieldLayout, values: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    out = {c.name: _value(c.kind, values.get(c.name), f"{where}.{c.name}") for c in f.children}
    return out if any(v is not None for v in out.values()) else None


def rest_row(
    layout: SilverLayout, infos: Mapping[str, FieldInfo], record: Mapping[str, Any]
) -> dict[str, Any]:
    """One REST record as gold body columns (``Id`` included), typed as silver types them."""
    entity = layout.entity
    record_id = record.get("Id")
    if not isinstance(record_id, str) or not record_id:
        raise RestError(f"REST record of {entity}: expected an Id (got {record_id!r})")
    row: dict[str, Any] = {ID: record_id}
    flat = layout.compounds == "flattened"
    for shape in record_shapes(layout, infos):
        f = shape.field
        where = f"{entity}.{f.name} of {record_id}"
        if f.shape == "leaf":
            row[f.name] = _value(f.kind, record.get(f.name), where)
            continue
        if not shape.parts:
            nested = record.get(f.name)
            if nested is not None and not isinstance(nested, Mapping):
                raise RestError(f"REST value of {where}: expected a nested object (got {nested!r})")
            children = {c: (nested or {}).get(_lower_camel(c)) for c in f.child_names()}
        else:
            children = {c: record.get(c) for c in f.child_names()}
        person = f.shape != "switchable" or bool(record.get("IsPersonAccount"))
        struct = _struct(f, children, where) if person else None
        if f.shape == "switchable":
            row[f.name] = None if person else _value(f.kind, record.get(f.name), where)
        if flat:
            for c in f.child_names():
                row[layout.column_for(f"{f.name}.{c}")] = struct.get(c) if struct else None
        else:
            row[f.name if f.shape == "struct" else f.person_column] = struct
    return row
