"""fastavro as the decoder of what the generated code does not take: schemas it does not
specialise, and records encoded irregularly. It adds the checks fastavro leaves out (bytes
left over after the record) and reports failures as :class:`~ingest.errors.DecodeError`.
"""

from __future__ import annotations

import io
from typing import Any

from fastavro import schemaless_reader

from ingest.decoding.avro_wire import _as_bytes
from ingest.decoding.bitmap import BitmapExpander
from ingest.decoding.event import BITMAP_FIELDS, ChangeEvent
from ingest.errors import DecodeError
from ingest.schema import HEADER_FIELD, EventSchema

__all__: list[str] = []


class _FallbackDecoder:
    """fastavro with the parsed schema, plus the checks fastavro leaves out."""

    def __init__(self, schema: EventSchema, expander: BitmapExpander) -> None:
        self.schema = schema
        self.expander = expander
        self.parsed = schema.parsed
        header = _header_record(schema)
        self.header_is_split = header is not None
        self.header_names: list[str] = [f["name"] for f in header["fields"]] if header else []
        names = [f["name"] for f in self.parsed["fields"]]
        self.body_names: list[str] = names[1:] if self.header_is_split else names

    def decode(self, payload: bytes) -> dict[str, Any]:
        buf = _as_bytes(payload)
        fo = io.BytesIO(buf)
        try:
            record = schemaless_reader(fo, self.parsed, None)
        except Exception as exc:  # fastavro signals bad bytes with many exception types
            raise DecodeError(
                f"cannot decode a {len(buf)}-byte payload of {self.schema.name} "
                f"({self.schema.schema_id}): {type(exc).__name__}: {str(exc)[:120]}"
            ) from exc
        if fo.tell() != len(buf):
            raise DecodeError(
                f"cannot decode a {len(buf)}-byte payload of {self.schema.name} "
                f"({self.schema.schema_id}): {len(buf) - fo.tell()} unread byte(s) after the "
                "end of the record"
            )
        if not isinstance(record, dict):
            raise DecodeError(f"{self.schema.name} is not a record schema")
        return record

    def decode_event(self, payload: bytes) -> ChangeEvent:
        return ChangeEvent.from_record(self.decode(payload), self.schema, expander=self.expander)

    def row(self, payload: bytes) -> tuple[Any, ...]:
        """One record in the column order of :class:`DecodedBatch` (header, body, bitmaps)."""
        record = self.decode(payload)
        header = record.get(HEADER_FIELD) if self.header_is_split else None
        out: list[Any] = []
        if header is not None:
            out.extend(header[name] for name in self.header_names)
        out.extend(record[name] for name in self.body_names)
        for name in BITMAP_FIELDS:
            out.append(self.expander.expand(header[name]) if header and name in header else ())
        return tuple(out)


def _header_record(schema: EventSchema) -> dict[str, Any] | None:
    fields = schema.parsed.get("fields") or []
    if not fields or fields[0].get("name") != HEADER_FIELD:
        return None
    t = fields[0]["type"]
    if isinstance(t, str):
        t = schema.parsed.get("__named_schemas", {}).get(t)
    if isinstance(t, dict) and t.get("type") == "record":
        return t
    return None
