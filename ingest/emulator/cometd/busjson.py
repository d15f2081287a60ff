"""Platform events and change events in the Streaming API's JSON form.

The CometD channels ``/event/<Name>__e``, ``/data/<Object>ChangeEvent`` and
``/data/ChangeEvents`` carry the same events as the gRPC side, read from the same bus, with the
bus position of each event as its (integer) replay id. A message's ``data`` is::

    {"schema": "<schema id>",
     "payload": {"ChangeEventHeader": {..., "changedFields": ["Name", "BillingAddress.City"]},
                 "Name": "Acme", "LastModifiedDate": "2025-01-01T00:00:03.000Z", ...},
     "event": {"replayId": 1000017}}          (platform events add "EventUuid")

as the Change Data Capture guide shows a message received in a CometD client ("Change Event
Message Structure", "Differences Between Change Events Received with Streaming API vs. Pub/Sub
API"): the header has ``changedFields`` (a field-name list) but neither ``nulledFields`` nor
``diffFields``, which only Pub/Sub's Avro header carries; a long text field sent as a diff is
``{"diff": "--- \\n+++ <sha256>\\n..."}`` ("Data Differences in Event Fields"). Dates are
``YYYY-MM-DD``, datetimes ISO 8601 UTC with milliseconds and ``Z``, times ``hh:mm:ss.sssZ``;
compound fields nested objects. Fields without a value are left out, except the ones an update
nulls (``null``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from ingest.decoding.cache import DecoderCache
from ingest.decoding.event import ChangeEvent
from ingest.emulator.eventlog import LoggedEvent
from ingest.emulator.topics import Catalogue
from ingest.schema import HEADER_FIELD, EventSchema, FieldInfo

__all__ = ["BusJson", "iso_datetime"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Header fields a CometD client does not get (bitmaps that Pub/Sub clients decode).
_PUBSUB_ONLY_HEADER = frozenset({"nulledFields", "diffFields"})


def iso_datetime(ms: float) -> str:
    """Epoch milliseconds as ``YYYY-MM-DDThh:mm:ss.sssZ``."""
    moment = _EPOCH + timedelta(milliseconds=int(ms))
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _time(ms: int) -> str:
    h, rest = divmod(int(ms), 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, milli = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{milli:03d}Z"


def _value(info: FieldInfo, value: Any) -> Any:
    if value is None:
        return None
    if info.kind == "date":
        return (_EPOCH + timedelta(milliseconds=int(value))).strftime("%Y-%m-%d")
    if info.kind == "datetime":
        return iso_datetime(value)
    if info.kind == "time":
        return _time(value)
    if info.children and isinstance(value, Mapping):
        kids = {c.name: c for c in info.children}
        return {k: _value(kids[k], v) if k in kids else v for k, v in value.items()}
    return value


class BusJson:
    """Builds (and caches) the ``data`` object of bus events (see the module docstring)."""

    def __init__(self, catalogue: Catalogue, *, cache_size: int = 20_000) -> None:
        self._decoders = DecoderCache(lambda sid: catalogue.schema(sid).json)
        self._cache: dict[int, dict[str, Any]] = {}
        self._cache_size = cache_size

    def data(self, event: LoggedEvent) -> dict[str, Any]:
        cached = self._cache.get(event.position)
        if cached is not None:
            return cached
        schema, decoder = self._decoders.get(event.schema_id)
        record = decoder.decode(event.payload)
        if schema.is_change_event:
            payload = self._change_payload(schema, record)
            meta: dict[str, Any] = {"replayId": event.position}
        else:
            payload = {
                f.name: _value(f, record.get(f.name))
                for f in schema.fields
                if record.get(f.name) is not None
            }
            meta = {"EventUuid": event.event_id, "replayId": event.position}
        data = {"schema": schema.schema_id, "payload": payload, "event": meta}
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[event.position] = data
        return data

    @staticmethod
    def _change_payload(schema: EventSchema, record: Mapping[str, Any]) -> dict[str, Any]:
        change = ChangeEvent.from_record(record, schema)
        header = {k: v for k, v in record[HEADER_FIELD].items() if k not in _PUBSUB_ONLY_HEADER}
        header["changedFields"] = list(change.changed)
        nulled = set(change.nulled)
        nulled_tops = {n.partition(".")[0] for n in nulled}
        diffed = set(change.diffed)
        payload: dict[str, Any] = {HEADER_FIELD: header}
        for info in schema.fields:
            if info.name == HEADER_FIELD:
                continue
            value = record.get(info.name)
            if info.name in diffed and isinstance(value, str):
                payload[info.name] = {"diff": value}
            elif info.children and isinstance(value, Mapping):
                # A compound field holds its parts that have a value or were nulled.
                parts = {
                    k: v
                    for k, v in _value(info, value).items()
                    if v is not None or f"{info.name}.{k}" in nulled
                }
                if parts:
                    payload[info.name] = parts
            elif value is not None or info.name in nulled_tops:
                payload[info.name] = _value(info, value)
        return payload
