"""Platform events written as JSON, checked field by field against the topic's schema.

``sfcdc publish`` reads one JSON object per line. :func:`record_from_json` turns such an object
into the record :class:`~ingest.client.publisher.Publisher` Avro-encodes, and lists every
problem with the field at fault instead of failing at the first (a whole file can then be
fixed at once). JSON has no dates, so the schema's date and datetime fields (``long`` epoch
milliseconds on the wire) also take ISO text: ``2026-05-01`` or ``2026-05-01T12:30:00Z``.

Salesforce requires ``CreatedDate`` and ``CreatedById`` in every published event and stores
its own values; a missing ``CreatedDate`` is filled with the publish time and a missing
``CreatedById`` with ``created_by`` when the caller gives one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any

from ingest.schema import EventSchema, FieldInfo

__all__ = ["FieldProblem", "record_from_json"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
_LONG = (-(2**63), 2**63 - 1)
_INT = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class FieldProblem:
    """What is wrong with one field of an event (``field`` is ``None`` for the event as a
    whole)."""

    field: str | None
    message: str

    def __str__(self) -> str:
        return self.message if self.field is None else f"{self.field}: {self.message}"


def record_from_json(
    schema: EventSchema,
    value: object,
    *,
    now_ms: int,
    created_by: str | None = None,
) -> tuple[dict[str, Any], list[FieldProblem]]:
    """The record for ``value`` (a parsed JSON object) and its problems (empty: it fits
    ``schema``). ``now_ms`` fills a missing ``CreatedDate``, ``created_by`` a missing
    ``CreatedById``."""
    if not isinstance(value, Mapping):
        return {}, [FieldProblem(None, f"expected a JSON object (got {_json_type(value)})")]
    problems: list[FieldProblem] = []
    known = {f.name: f for f in schema.fields}
    for name in value:
        if name not in known:
            problems.append(
                FieldProblem(
                    str(name),
                    f"unknown field; {schema.name} has {', '.join(known)}",
                )
            )
    types = {f["name"]: f["type"] for f in schema.raw.get("fields", ())}
    record: dict[str, Any] = {}
    for info in schema.fields:
        avro_type = types.get(info.name)
        if info.name in value:
            raw = value[info.name]
        elif info.name == "CreatedDate":
            raw = now_ms
        elif info.name == "CreatedById" and created_by is not None:
            raw = created_by
        elif _nullable(avro_type):
            raw = None
        else:
            hint = " (or pass --created-by)" if info.name == "CreatedById" else ""
            problems.append(FieldProblem(info.name, f"required field is missing{hint}"))
            continue
        try:
            record[info.name] = _convert(info, avro_type, raw)
        except ValueError as exc:
            problems.append(FieldProblem(info.name, str(exc)))
    return record, problems


def _nullable(avro_type: Any) -> bool:
    return avro_type == "null" or (isinstance(avro_type, list) and "null" in avro_type)


def _branch(avro_type: Any) -> Any:
    """The non-null type of a ``["null", T]`` union (the shape every nullable field has)."""
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        return others[0] if len(others) == 1 else others
    return avro_type


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()}, a boolean"
    if isinstance(value, (int, float)):
        return f"{value!r}, a number"
    if isinstance(value, str):
        return f"{value!r}, a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _convert(info: FieldInfo, avro_type: Any, value: object) -> Any:
    if value is None:
        if _nullable(avro_type):
            return None
        raise ValueError("must not be null")
    kind = _branch(avro_type)
    name = kind if isinstance(kind, str) else None
    if name in ("long", "int") and info.kind in ("date", "datetime") and isinstance(value, str):
        return _epoch_ms(value, date_only=info.kind == "date")
    if name in ("long", "int"):
        low, high = _LONG if name == "long" else _INT
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a whole number (got {_json_type(value)})")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"expected a whole number (got {_json_type(value)})")
        number = int(value)
        if not low <= number <= high:
            raise ValueError(f"expected a {name} between {low} and {high} (got {number})")
        return number
    if name in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number (got {_json_type(value)})")
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number (got {value!r})")
        return float(value)
    if name == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false (got {_json_type(value)})")
        return value
    if name == "string":
        if not isinstance(value, str):
            raise ValueError(f"expected a string (got {_json_type(value)})")
        return value
    if name == "bytes":
        if not isinstance(value, str):
            raise ValueError(f"expected a string of bytes (got {_json_type(value)})")
        return value.encode("utf-8")
    raise ValueError(f"the Avro type {kind!r} cannot be written from JSON by sfcdc publish")


def _epoch_ms(text: str, *, date_only: bool) -> int:
    try:
        if date_only:
            day = date.fromisoformat(text)
            moment = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
        else:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                raise ValueError
    except ValueError:
        shape = "YYYY-MM-DD" if date_only else "YYYY-MM-DDThh:mm:ss[.fff]Z (with a time zone)"
        raise ValueError(f"expected epoch milliseconds or an ISO {shape} (got {text!r})") from None
    return (moment - _EPOCH) // _MS
