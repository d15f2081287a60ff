"""Avro payloads decoded a field at a time over a whole batch, straight into Arrow arrays.

A row decoder, even one generated per schema, pays a few hundred nanoseconds of interpreter
time per value; a CREATE event of a wide object holds a hundred and fifty values. Silver
decodes thousands of payloads of one schema at once, and Avro's binary encoding is a fixed
sequence of values per schema: the n-th value of every payload can be read together. This
module keeps one read position per payload (a numpy array) and walks the schema once per
batch, reading each field for all payloads with a handful of array operations, so the cost
per value is a few nanoseconds and a string column is gathered into one Arrow buffer.

It is a fast path, not a second source of truth. :meth:`ColumnarDecoder.decode` returns
``None`` as soon as anything in the batch is not the common case: a payload that looks
corrupt (a read past its end, an out-of-range union branch or enum index, a boolean byte
other than 0/1, an overlong varint, bytes left over, invalid UTF-8), a valid but irregular
encoding (a union index or block count written in several bytes, a block with a byte size),
a null payload. The caller then decodes the batch with
:meth:`~ingest.decoding.EventDecoder.decode_batch`, which reports each bad row with its
reason; results on the batches this module accepts are the same value for value.
:func:`ColumnarDecoder.for_schema` returns ``None`` for schemas it does not cover (maps,
logical types, recursive types, a union inside a record other than ``["null", T]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.decoding.avro_types import resolve_type
from ingest.schema import HEADER_FIELD, EventSchema

__all__ = ["Column", "ColumnarDecoder", "UnionColumn", "expanded_bitmaps"]

# Maps are left to the row decoder.
_COMPOSITE = frozenset({"record", "error", "enum", "fixed", "array"})
_U64 = np.uint64
_MAX_OFFSET = 2**31 - 1  # string and binary arrays use 32-bit offsets


class _Bail(Exception):
    """The batch is not one this module decodes; the row decoder takes it."""


class _Unsupported(Exception):
    """The schema has a construct this module does not decode."""


@dataclass(frozen=True)
class UnionColumn:
    """A union with more than one non-null branch (Account's ``Name``: string or record):
    ``branch`` is each row's branch index (-1 for null) and ``values`` one array per branch,
    null on the rows of other branches."""

    branch: np.ndarray
    values: tuple[pa.Array, ...]
    types: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.branch)

    def to_pylist(self) -> list[Any]:
        """The values as the row decoder returns them."""
        columns = [v.to_pylist() for v in self.values]
        return [None if b < 0 else columns[b][k] for k, b in enumerate(self.branch.tolist())]


Column: TypeAlias = pa.Array | UnionColumn


class _Reader:
    """Read positions of the payloads of one batch, and the reads themselves."""

    def __init__(self, data: np.ndarray, buffer: pa.Buffer) -> None:
        self.data = data
        self.buffer = buffer

    def byte(self, p: np.ndarray, end: np.ndarray) -> np.ndarray:
        if (p >= end).any():
            raise _Bail
        values: np.ndarray = self.data[p]
        return values

    def varint(self, p: np.ndarray, end: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
        """Zigzag varints (not undone) as uint64, and the positions after them."""
        b = self.byte(p, end)
        n = (b & 127).astype(_U64)
        p = p + 1
        more = np.flatnonzero(b > 127)
        groups = -(-bits // 7)
        shift = 7
        k = 1
        while more.size:
            if k == groups:
                raise _Bail
            q = p[more]
            bb = self.byte(q, end[more]).astype(_U64)
            p[more] = q + 1
            if k == groups - 1:
                # The last group holds only the bits left and no continuation bit.
                if (bb > (1 << (bits - 7 * k)) - 1).any():
                    raise _Bail
                n[more] |= bb << _U64(shift)
                break
            n[more] |= (bb & _U64(127)) << _U64(shift)
            more = more[bb > 127]
            shift += 7
            k += 1
        return n, p

    @staticmethod
    def zigzag(n: np.ndarray) -> np.ndarray:
        signed: np.ndarray = ((n >> _U64(1)) ^ (_U64(0) - (n & _U64(1)))).view(np.int64)
        return signed

    def long(self, p: np.ndarray, end: np.ndarray, bits: int = 64) -> tuple[np.ndarray, np.ndarray]:
        n, p = self.varint(p, end, bits)
        return self.zigzag(n), p

    def small(self, p: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A union index or block count: one even byte in every payload Salesforce writes.
        A longer one is valid Avro, and an odd one a negative count (a block with its byte
        size) or a corrupt index: the row decoder takes both."""
        b = self.byte(p, end)
        if ((b > 127) | (b & 1).astype(bool)).any():
            raise _Bail
        return (b >> 1).astype(np.int64), p + 1

    def sized(
        self, p: np.ndarray, end: np.ndarray, kind: pa.DataType
    ) -> tuple[pa.Array, np.ndarray]:
        lengths, p = self.long(p, end)
        if (lengths < 0).any():
            raise _Bail
        stop = p + lengths
        if (stop > end).any():
            raise _Bail
        # The values lie in payload order: as the odd elements of a binary array over the
        # whole payload buffer whose even elements are the bytes between them, one take
        # copies them out (in C++, a memcpy per value).
        n = len(p)
        bounds = np.empty(2 * n + 2, np.int32)
        bounds[0] = 0
        bounds[1:-1:2] = p
        bounds[2:-1:2] = stop
        bounds[-1] = bounds[-2]
        spans = pa.Array.from_buffers(
            pa.binary(), 2 * n + 1, [None, pa.py_buffer(bounds), self.buffer]
        )
        array = spans.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int32)))
        if kind == pa.string():
            array = array.view(pa.string())
            try:
                array.validate(full=True)  # UTF-8, as bytes.decode() checks it
            except pa.ArrowInvalid as exc:
                raise _Bail from exc
        return array, stop

    def fixed(self, p: np.ndarray, end: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        stop = p + size
        if (stop > end).any():
            raise _Bail
        raw = self.data[p[:, None] + np.arange(size, dtype=np.int64)]
        return np.ascontiguousarray(raw), stop


def _with_nulls(values: pa.Array, selected: np.ndarray) -> pa.Array:
    """``values`` (one per selected row) spread over all rows, null on the others."""
    if selected.all():
        return values
    index = np.cumsum(selected, dtype=np.int64) - 1
    return values.take(pa.array(index, pa.int64(), mask=~selected))


class ColumnarDecoder:
    """Decodes the payloads of one schema a field at a time (see the module docstring).

    :meth:`decode` gives one Arrow array per top-level field (the header's fields under
    their own names in ``header``), a :class:`UnionColumn` for a union of several non-null
    branches.
    """

    def __init__(self, schema: EventSchema) -> None:
        parsed = schema.parsed
        self.schema = schema
        self._named: dict[str, Any] = dict(parsed.get("__named_schemas", {}))
        if parsed.get("type") not in ("record", "error"):
            raise _Unsupported("the top-level type is not a record")
        self._fields = [(f["name"], f["type"]) for f in parsed["fields"]]
        self._check(parsed, top=True, seen=())

    @classmethod
    def for_schema(cls, schema: EventSchema) -> ColumnarDecoder | None:
        """The decoder of ``schema``, or None when the schema has constructs it leaves to the
        row decoder."""
        try:
            return cls(schema)
        except _Unsupported:
            return None

    # ------------------------------------------------------------------- the schema

    def _resolve(self, t: Any) -> Any:
        return resolve_type(t, self._named, kinds=_COMPOSITE, unsupported=_Unsupported)

    def _check(self, t: Any, *, top: bool, seen: tuple[str, ...]) -> None:
        t = self._resolve(t)
        if isinstance(t, str):
            return
        if isinstance(t, list):
            if not t:
                raise _Unsupported("empty union")
            values = [b for b in t if self._resolve(b) != "null"]
            if len(values) > 1 and not top:
                raise _Unsupported("a union of several values below the top level")
            for b in values:
                self._check(b, top=False, seen=seen)
            return
        kind = t["type"]
        if kind in ("record", "error"):
            if t["name"] in seen:
                raise _Unsupported(f"recursive type {t['name']!r}")
            names = [f["name"] for f in t["fields"]]
            if not names or len(set(names)) != len(names):
                raise _Unsupported(f"field names {names!r}")
            for f in t["fields"]:
                self._check(f["type"], top=top and not seen, seen=(*seen, t["name"]))
        elif kind == "array":
            if self._resolve(t["items"]) == "null":
                raise _Unsupported("an array of nulls")
            self._check(t["items"], top=False, seen=seen)
        elif kind == "enum":
            if not t["symbols"] or not all(isinstance(s, str) for s in t["symbols"]):
                raise _Unsupported("enum symbols")
        elif kind == "fixed" and int(t["size"]) < 0:
            raise _Unsupported("fixed size")

    # ------------------------------------------------------------------- decoding

    def decode(self, payloads: pa.Array) -> tuple[dict[str, Column], dict[str, pa.Array]] | None:
        """``(columns, header)`` of ``payloads`` (a binary array), or None when the batch
        must go to the row decoder (see the module docstring)."""
        if payloads.null_count or len(payloads) == 0:
            return None
        if pa.types.is_large_binary(payloads.type):
            offset_type: Any = np.int64
        elif pa.types.is_binary(payloads.type):
            offset_type = np.int32
        else:
            return None
        _, offsets_buffer, data_buffer = payloads.buffers()
        n = len(payloads)
        offsets = np.frombuffer(offsets_buffer, offset_type)[
            payloads.offset : payloads.offset + n + 1
        ]
        if data_buffer is None:
            data_buffer = pa.py_buffer(b"")
        if data_buffer.size > _MAX_OFFSET:
            return None
        reader = _Reader(np.frombuffer(data_buffer, np.uint8), data_buffer)
        p = offsets[:-1].astype(np.int64)
        end = offsets[1:].astype(np.int64)
        columns: dict[str, Column] = {}
        header: dict[str, pa.Array] = {}
        try:
            for i, (name, t) in enumerate(self._fields):
                value, p = self._read(reader, t, p, end)
                if i == 0 and name == HEADER_FIELD and isinstance(value, pa.StructArray):
                    header = {f.name: value.field(k) for k, f in enumerate(value.type)}
                    continue
                columns[name] = value
            if (p != end).any():
                raise _Bail
        except _Bail:
            return None
        return columns, header

    def _read(self, r: _Reader, t: Any, p: np.ndarray, end: np.ndarray) -> tuple[Any, np.ndarray]:
        t = self._resolve(t)
        if isinstance(t, str):
            return self._primitive(r, t, p, end)
        if isinstance(t, list):
            return self._union(r, t, p, end)
        kind = t["type"]
        if kind in ("record", "error"):
            children = []
            for f in t["fields"]:
                child, p = self._read(r, f["type"], p, end)
                children.append(child)
            names = [f["name"] for f in t["fields"]]
            return pa.StructArray.from_arrays(children, names), p
        if kind == "enum":
            index, p = r.long(p, end)
            symbols = t["symbols"]
            if ((index < 0) | (index >= len(symbols))).any():
                raise _Bail
            return pa.array(symbols, pa.string()).take(pa.array(index)), p
        if kind == "fixed":
            raw, p = r.fixed(p, end, int(t["size"]))
            size = int(t["size"])
            offsets = np.arange(len(p) + 1, dtype=np.int32) * size
            return pa.Array.from_buffers(
                pa.binary(), len(p), [None, pa.py_buffer(offsets), pa.py_buffer(raw.reshape(-1))]
            ), p
        return self._array(r, t["items"], p, end)

    def _primitive(
        self, r: _Reader, t: str, p: np.ndarray, end: np.ndarray
    ) -> tuple[pa.Array, np.ndarray]:
        if t == "string":
            return r.sized(p, end, pa.string())
        if t == "bytes":
            return r.sized(p, end, pa.binary())
        if t == "long":
            values, p = r.long(p, end)
            return pa.array(values, pa.int64()), p
        if t == "int":
            values, p = r.long(p, end, bits=32)
            return pa.array(values.astype(np.int32), pa.int32()), p
        if t == "double":
            raw, p = r.fixed(p, end, 8)
            return pa.array(raw.view("<f8").reshape(-1), pa.float64()), p
        if t == "float":
            raw, p = r.fixed(p, end, 4)
            return pa.array(raw.view("<f4").reshape(-1), pa.float32()), p
        if t == "boolean":
            b = r.byte(p, end)
            if (b > 1).any():
                raise _Bail
            return pa.array(b.astype(bool), pa.bool_()), p + 1
        return pa.nulls(len(p)), p  # null

    def _union(
        self, r: _Reader, branches: list[Any], p: np.ndarray, end: np.ndarray
    ) -> tuple[Column, np.ndarray]:
        index, p = r.small(p, end)
        if (index >= len(branches)).any():
            raise _Bail
        resolved = [self._resolve(b) for b in branches]
        values: list[pa.Array] = []
        types: list[Any] = []
        branch = np.full(len(p), -1, np.int64)
        p = p.copy()
        for j, b in enumerate(resolved):
            if b == "null":
                continue
            selected = index == j
            rows = np.flatnonzero(selected)
            value, after = self._read(r, b, p[rows], end[rows])
            p[rows] = after
            branch[rows] = len(values)
            values.append(_with_nulls(value, selected))
            types.append(b)
        if len(values) == 1:
            return values[0], p
        if not values:
            return pa.nulls(len(p)), p
        return UnionColumn(branch, tuple(values), tuple(types)), p

    def _array(
        self, r: _Reader, items: Any, p: np.ndarray, end: np.ndarray
    ) -> tuple[pa.Array, np.ndarray]:
        n = len(p)
        rows_parts: list[np.ndarray] = []
        ordinal_parts: list[np.ndarray] = []
        value_parts: list[pa.Array] = []
        counts = np.zeros(n, np.int64)
        active = np.arange(n, dtype=np.int64)
        p = p.copy()
        while active.size:
            count, q = r.small(p[active], end[active])
            if (count > end[active] - q).any():
                raise _Bail
            p[active] = q
            live = count > 0
            active, count = active[live], count[live]
            for k in range(int(count.max()) if count.size else 0):
                rows = active[count > k]
                value, after = self._read(r, items, p[rows], end[rows])
                p[rows] = after
                rows_parts.append(rows)
                ordinal_parts.append(counts[rows])
                counts[rows] += 1
                value_parts.append(value)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        if value_parts:
            rows_all = np.concatenate(rows_parts)
            order = np.lexsort((np.concatenate(ordinal_parts), rows_all))
            flat = pa.concat_arrays(value_parts).take(pa.array(order))
        else:
            item_type = self._arrow_type(items)
            flat = pa.array([], item_type)
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat), p

    def _arrow_type(self, t: Any) -> pa.DataType:
        t = self._resolve(t)
        simple = {
            "string": pa.string(),
            "bytes": pa.binary(),
            "long": pa.int64(),
            "int": pa.int32(),
            "double": pa.float64(),
            "float": pa.float32(),
            "boolean": pa.bool_(),
            "null": pa.null(),
        }
        if isinstance(t, str):
            return simple[t]
        if isinstance(t, list):
            values = [b for b in t if self._resolve(b) != "null"]
            return self._arrow_type(values[0]) if len(values) == 1 else pa.null()
        kind = t["type"]
        if kind in ("record", "error"):
            return pa.struct([(f["name"], self._arrow_type(f["type"])) for f in t["fields"]])
        if kind == "enum":
            return pa.string()
        if kind == "fixed":
            return pa.binary()
        return pa.list_(self._arrow_type(t["items"]))


def expanded_bitmaps(bitmaps: pa.Array, expand: Any, sep: str = "\x00") -> pa.Array | None:
    """A list<string> column of bitmaps expanded into field names by ``expand`` (called once
    per distinct bitmap), or None when a bitmap is null or an element holds the separator
    used to group them."""
    if bitmaps.null_count:
        return None
    values = pc.list_flatten(bitmaps)
    if len(values) and pc.any(pc.match_substring(values, sep)).as_py():
        return None
    lengths = pc.fill_null(pc.list_value_length(bitmaps), 0).cast(pa.string())
    keys = pc.binary_join_element_wise(lengths, pc.binary_join(bitmaps, sep), sep)
    encoded = pc.dictionary_encode(keys)
    distinct: list[Sequence[str]] = []
    for key in encoded.dictionary.to_pylist():
        count, _, joined = key.partition(sep)
        distinct.append(expand(tuple(joined.split(sep)) if int(count) else ()))
    names = pa.array([list(d) for d in distinct], pa.list_(pa.string()))
    return names.take(encoded.indices)
