"""Schema id -> parsed schema and decoder, loaded once per id.

Every event names the schema it was written with; the schema JSON comes from GetSchema on the
client and from the schema registry table in silver. Whatever the source, it is asked once
per id, and the schema is parsed and its decoder generated once per id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ingest.decoding.avro import EventDecoder
from ingest.errors import DecodeError, SfcdcError
from ingest.schema import EventSchema, parse_event_schema, schema_id

__all__ = ["DecoderCache"]

logger = logging.getLogger(__name__)


class DecoderCache:
    """Thread-safe map of schema id to ``(EventSchema, EventDecoder)``.

    ``load(schema_id)`` returns the schema JSON. It is called at most once per id while it
    succeeds; concurrent requests for one id wait for a single call, other ids proceed in
    parallel. It signals an unknown id by returning None or raising ``LookupError`` (e.g.
    ``KeyError``); that, and a schema that does not parse, becomes a
    :class:`~ingest.errors.DecodeError` naming the id. Other errors (a Pub/Sub call that
    failed) propagate unchanged so the caller can retry; failures are not cached.
    """

    def __init__(self, load: Callable[[str], str | None]) -> None:
        self._load = load
        self._entries: dict[str, tuple[EventSchema, EventDecoder]] = {}
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def __reduce__(self) -> tuple[type[DecoderCache], tuple[Callable[[str], str | None]]]:
        # Locks do not pickle: a cache shipped to a Spark executor starts empty there and
        # loads through the same (picklable) loader.
        return (DecoderCache, (self._load,))

    def __contains__(self, schema_id: object) -> bool:
        return schema_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, schema_id: str) -> tuple[EventSchema, EventDecoder]:
        """The schema and decoder of ``schema_id``, loading them on first use."""
        entry = self._entries.get(schema_id)
        if entry is not None:
            return entry
        if not isinstance(schema_id, str) or not schema_id:
            raise DecodeError(f"a schema id must be a non-empty str (got {schema_id!r})")
        with self._lock:
            id_lock = self._loading.setdefault(schema_id, threading.Lock())
        with id_lock:
            entry = self._entries.get(schema_id)
            if entry is None:
                entry = self._build(schema_id, self._fetch(schema_id))
                with self._lock:
                    self._entries[schema_id] = entry
                    self._loading.pop(schema_id, None)
        return entry

    def schema(self, schema_id: str) -> EventSchema:
        """The parsed schema of ``schema_id``."""
        return self.get(schema_id)[0]

    def decoder(self, schema_id: str) -> EventDecoder:
        """The decoder of ``schema_id``."""
        return self.get(schema_id)[1]

    def add(self, schema_json: str, *, schema_id: str | None = None) -> EventSchema:
        """Put a schema in without calling ``load`` (e.g. a registry read in bulk).

        ``schema_id`` defaults to the schema's fingerprint. An id already present keeps its
        entry.
        """
        sid = schema_id or _fingerprint(schema_json)
        with self._lock:
            entry = self._entries.get(sid)
        if entry is None:
            entry = self._build(sid, schema_json)
            with self._lock:
                entry = self._entries.setdefault(sid, entry)
        return entry[0]

    def _fetch(self, sid: str) -> str:
        try:
            text = self._load(sid)
        except SfcdcError:
            raise
        except LookupError as exc:
            raise DecodeError(
                f"unknown schema id {sid!r}: the schema source has no such id"
            ) from exc
        if text is None:
            raise DecodeError(f"unknown schema id {sid!r}: the schema source has no such id")
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if not isinstance(text, str):
            raise DecodeError(
                f"schema {sid!r}: the schema source returned a {type(text).__name__}, "
                "expected the schema JSON as str"
            )
        return text

    @staticmethod
    def _build(sid: str, text: str) -> tuple[EventSchema, EventDecoder]:
        try:
            schema = parse_event_schema(text, expected_id=sid)
            decoder = EventDecoder(schema)
        except Exception as exc:  # json, fastavro and our own parser each raise their own
            raise DecodeError(f"schema {sid!r} is not a valid event schema: {exc}") from exc
        computed = _fingerprint(text)
        if computed != sid:
            logger.warning(
                "schema id %s differs from the schema's own fingerprint %s; "
                "decoding with the schema given for %s",
                sid,
                computed,
                sid,
            )
        return schema, decoder


def _fingerprint(text: str) -> str:
    try:
        return schema_id(text)
    except Exception as exc:  # invalid JSON or a schema fastavro cannot canonicalise
        raise DecodeError(f"not a valid event schema: {exc}") from exc
