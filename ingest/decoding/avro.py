"""Avro binary decoding of event payloads, specialised per schema by generated code.

A Salesforce change event is a flat record of 50 to 500 ``["null", T]`` fields, most of them
null in an UPDATE. A general decoder walks the schema for every value; here each schema is
turned once into straight-line Python source (read the union byte; 0 means None, 2 means
decode ``T`` right there) that is compiled and reused for every payload of that schema id.
On these records that runs two to three times as fast as fastavro's C extension
(``benchmarks/decode_throughput.py``), and it makes a columnar variant possible that builds
no dict per record.

fastavro is the reference: for every payload it accepts, the generated decoder returns what
``fastavro.schemaless_reader(fo, parsed_schema)`` returns with default options. Schemas with
constructs the generator does not specialise (logical types, recursive types, arrays of
zero-width items) are decoded by fastavro itself; this is reported by
:attr:`EventDecoder.specialised`, never silently different.

The generated code is safe by construction: schema names and symbols only ever appear in it
as ``repr`` literals (dict keys) or as values bound in its namespace, never as identifiers.

Bad payloads raise :class:`~ingest.errors.DecodeError` naming the schema, the field, the byte
offset and the reason (truncated, invalid UTF-8, union branch or enum index out of range,
boolean byte other than 0/1, overlong varint, trailing bytes). The hot path carries no
bookkeeping for this: the field and offset are recovered from the traceback of the failure.
Encodings that are valid Avro but that no writer produces (a union index written with more
bytes than needed) are handed to fastavro for that record.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ingest.decoding.avro_codegen import _Unsupported
from ingest.decoding.avro_compiled import _Compiled
from ingest.decoding.avro_fallback import _FallbackDecoder
from ingest.decoding.avro_types import resolve_type
from ingest.decoding.bitmap import expander_for
from ingest.decoding.event import BITMAP_FIELDS, ChangeEvent
from ingest.errors import DecodeError
from ingest.schema import HEADER_FIELD, EventSchema

__all__ = ["DecodedBatch", "EventDecoder", "compile_decoder", "resolve_type"]

logger = logging.getLogger(__name__)

RecordDecoder = Callable[[bytes], dict[str, Any]]

_CHUNK_ROWS = 256  # rows of a batch decoded before they are moved into the columns


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A batch of payloads decoded into columns, ready to become Arrow arrays.

    Only rows that decoded are in the columns; ``row_index[k]`` is the position in the input
    of decoded row ``k``, and ``errors`` lists ``(input position, reason)`` for the others,
    so a caller can quarantine them and go on. ``header`` has one column per
    ``ChangeEventHeader`` field (empty for platform events), ``columns`` one per other
    top-level field (compound fields as dicts, exactly as :meth:`EventDecoder.decode`
    returns them), and ``changed`` / ``nulled`` / ``diffed`` the expanded bitmaps per row
    (empty tuples for platform events).
    """

    schema_id: str
    header: dict[str, list[Any]]
    columns: dict[str, list[Any]]
    changed: list[tuple[str, ...]]
    nulled: list[tuple[str, ...]]
    diffed: list[tuple[str, ...]]
    row_index: list[int]
    errors: list[tuple[int, str]]

    def __len__(self) -> int:
        return len(self.row_index)

    def records(self) -> Iterator[dict[str, Any]]:
        """The decoded rows as records (as :meth:`EventDecoder.decode` returns them)."""
        for k in range(len(self.row_index)):
            record: dict[str, Any] = {}
            if self.header:
                record[HEADER_FIELD] = {name: col[k] for name, col in self.header.items()}
            record.update((name, col[k]) for name, col in self.columns.items())
            yield record


class EventDecoder:
    """Decodes the payloads written with one schema (one per schema id; thread-safe).

    ``specialised`` tells whether generated code decodes them (``fallback_reason`` says why
    not otherwise; fastavro then does, with the same results).
    """

    def __init__(self, schema: EventSchema) -> None:
        self.schema = schema
        self._expander = expander_for(schema)
        self._fallback = _FallbackDecoder(schema, self._expander)
        self.fallback_reason: str | None = None
        self._compiled: _Compiled | None = None
        try:
            self._compiled = _Compiled(schema, self._expander, self._fallback)
        except _Unsupported as exc:
            self.fallback_reason = str(exc)
            logger.info("decoding %s (%s) with fastavro: %s", schema.name, schema.schema_id, exc)
            self._header_names = self._fallback.header_names
            self._body_names = self._fallback.body_names
        else:
            self._header_names = self._compiled.header_names
            self._body_names = self._compiled.body_names
        # The generated forms are compiled when first used (see _Source).
        self._record: RecordDecoder = self._first_record
        self._event: Callable[[bytes], ChangeEvent] = self._first_event

    def _first_record(self, payload: bytes) -> dict[str, Any]:
        compiled = self._compiled
        self._record = compiled.function("record") if compiled else self._fallback.decode
        return self._record(payload)

    def _first_event(self, payload: bytes) -> ChangeEvent:
        compiled = self._compiled
        if compiled is not None and compiled.has("event"):
            self._event = compiled.function("event")
        else:
            self._event = self._fallback.decode_event
        return self._event(payload)

    @property
    def specialised(self) -> bool:
        """Whether generated code decodes this schema (else fastavro, same results)."""
        return self._compiled is not None

    @property
    def source(self) -> str | None:
        """The generated Python source (None when fastavro decodes this schema)."""
        return self._compiled.source if self._compiled else None

    def __repr__(self) -> str:
        how = "generated" if self.specialised else f"fastavro: {self.fallback_reason}"
        return f"EventDecoder({self.schema.name}, {self.schema.schema_id}, {how})"

    def __reduce__(self) -> tuple[type[EventDecoder], tuple[EventSchema]]:
        # Compiled code does not pickle; Spark ships closures to executors pickled, so a
        # decoder travels as its schema and is rebuilt there.
        return (EventDecoder, (self.schema,))

    def decode(self, payload: bytes) -> dict[str, Any]:
        """The record, exactly as ``fastavro.schemaless_reader`` returns it.

        Raises :class:`~ingest.errors.DecodeError` for a payload that does not decode with
        this schema, including one with bytes left over after the record.
        """
        return self._record(payload)

    def decode_event(self, payload: bytes) -> ChangeEvent:
        """A :class:`ChangeEvent` with the bitmaps expanded (change events only).

        Raises :class:`~ingest.errors.DecodeError` (or its subclass ``BitmapError``).
        """
        return self._event(payload)

    def decode_batch(self, payloads: Iterable[bytes]) -> DecodedBatch:
        """Decode many payloads into columns; bad rows are reported, never raised."""
        nh, nb = len(self._header_names), len(self._body_names)
        width = nh + nb + len(BITMAP_FIELDS)
        columns: list[list[Any]] = [[] for _ in range(width)]
        indexes: list[int] = []
        errors: list[tuple[int, str]] = []
        it = iter(payloads)
        offset = 0
        while chunk := list(itertools.islice(it, _CHUNK_ROWS)):
            # A chunk's rows are laid end to end in one list and the columns cut out with a
            # stride: far cheaper than transposing row tuples, and small enough to stay in
            # the CPU cache.
            flat: list[Any] = []
            if self._compiled is not None:
                self._compiled.function("batch")(chunk, offset, flat, indexes, errors)
            else:
                self._fallback_batch(chunk, offset, flat, indexes, errors)
            for k, column in enumerate(columns):
                column.extend(flat[k::width])
            offset += len(chunk)
        return DecodedBatch(
            schema_id=self.schema.schema_id,
            header=dict(zip(self._header_names, columns[:nh], strict=True)),
            columns=dict(zip(self._body_names, columns[nh : nh + nb], strict=True)),
            changed=columns[nh + nb],
            nulled=columns[nh + nb + 1],
            diffed=columns[nh + nb + 2],
            row_index=indexes,
            errors=errors,
        )

    def _fallback_batch(
        self,
        chunk: list[bytes],
        offset: int,
        flat: list[Any],
        indexes: list[int],
        errors: list[tuple[int, str]],
    ) -> None:
        for i, payload in enumerate(chunk, offset):
            try:
                flat.extend(self._fallback.row(payload))
            except DecodeError as exc:
                errors.append((i, str(exc)))
            else:
                indexes.append(i)


def compile_decoder(schema: EventSchema) -> RecordDecoder:
    """A decoder specialised for ``schema``: ``payload -> record``, equal to fastavro's.

    Generated code for every construct Salesforce schemas use (records, unions including
    ``["null", "string", record]``, enums, arrays, maps, fixed, every primitive, named-type
    references); fastavro for anything else. Raises :class:`~ingest.errors.DecodeError` for
    truncated or corrupt payloads and for bytes left over after the record.
    """
    decoder = EventDecoder(schema)
    if decoder._compiled is None:
        return decoder._fallback.decode
    record: RecordDecoder = decoder._compiled.function("record")
    return record
