"""When an event was committed in Salesforce, read from its payload.

A change event carries it in its header (``ChangeEventHeader.commitTimestamp``), a platform
event in ``CreatedDate``; both are epoch milliseconds. Landing reads it from one event per
batch (the batch's last, the newest in stream order) to record how far behind Salesforce a
table is, so decoding the whole record once costs nothing next to the batch.
"""

from __future__ import annotations

import io
from datetime import datetime

import fastavro

from ingest.schema import HEADER_FIELD, EventSchema

__all__ = ["EVENT_TIME_FIELDS", "event_time_ms"]

# (field, child): where each kind of event keeps its commit time.
EVENT_TIME_FIELDS = ((HEADER_FIELD, "commitTimestamp"), ("CreatedDate", None))


def event_time_ms(schema: EventSchema, payload: bytes) -> int | None:
    """The event's commit time in epoch milliseconds: ``commitTimestamp`` of a change event,
    ``CreatedDate`` of a platform event. ``None`` when the schema has neither or the payload
    does not decode with ``schema`` (silver quarantines such events; this only measures)."""
    names = schema.by_name
    if not any(name in names for name, _child in EVENT_TIME_FIELDS):
        return None
    try:
        record = fastavro.schemaless_reader(io.BytesIO(payload), schema.parsed, None)
    except Exception:  # fastavro raises assorted errors on bytes that are not this schema's
        return None
    if not isinstance(record, dict):
        return None
    for name, child in EVENT_TIME_FIELDS:
        value = record.get(name)
        if child is not None:
            value = value.get(child) if isinstance(value, dict) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, datetime):  # a schema with a timestamp-millis logical type
            return round(value.timestamp() * 1000)
    return None
