"""Avro payloads decoded a field at a time over a whole batch, straight into Arrow arrays:
silver's decoder.

A row decoder, even one generated per schema, pays a few hundred nanoseconds of interpreter
time per value; a CREATE event of a wide object holds a hundred and fifty values. Silver
decodes many payloads of one schema at once, and Avro's binary encoding is a fixed sequence
of values per schema: the n-th value of every payload can be read together. This module
compiles a schema once into a tree of readers, keeps one read position per payload (a numpy
array) and walks the tree once per batch, reading each field for all payloads with a
handful of array operations, so the cost per value is a few nanoseconds and a string column
is gathered into one Arrow buffer. A field that is null in every payload (most of an
UPDATE) costs one comparison.

Every payload is judged on its own, exactly as
:meth:`~ingest.decoding.EventDecoder.decode_batch` (the reference model) judges it. A payload
that does not decode is marked failed where it fails (its read position stops advancing, the
other payloads go on) and reported with the row decoder's reason, field path and byte offset
(truncated, invalid UTF-8, union branch or enum index out of range, boolean byte other than
0/1, overlong varint, negative length, bytes left over; a null payload). Valid encodings no
writer produces (a union index or block count written in more bytes than needed, negative
block counts with their byte size, several blocks) are decoded. A payload the row decoder
hands to fastavro (one with a union index written in several bytes) and that fails here is
judged by fastavro too, so its outcome is fastavro's, as on the row decoder.

:func:`ColumnarDecoder.for_schema` returns ``None`` only for schemas the row decoder itself
leaves to fastavro (logical types, recursive types, arrays or maps of zero-width items).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.decoding.avro_types import resolve_type
from ingest.errors import BitmapError
from ingest.schema import HEADER_FIELD, EventSchema

__all__ = [
    "Column",
    "ColumnarDecoder",
    "Decoded",
    "UnionColumn",
    "expanded_bitmaps",
    "to_pylist",
]

_COMPOSITE = frozenset({"record", "error", "enum", "fixed", "array", "map"})
_U64 = np.uint64
_I64 = np.int64
_MAX_OFFSET = 2**31 - 1  # string and binary arrays use 32-bit offsets
_TRUNCATED = "truncated: the payload ends before the value does"
_EMPTY = np.zeros(0, _I64)
_FEW = 64  # rows whose bitmaps are expanded one at a time
_WINDOW = 512  # rows whose varints of several bytes are read from a window at most
_GROUPS = np.arange(10, dtype=_I64)
_SHIFTS = (7 * _GROUPS).astype(_U64)


class _Unsupported(Exception):
    """The schema has a construct this module does not decode."""


@dataclass(frozen=True)
class UnionColumn:
    """A top-level union with more than one non-null branch (Account's ``Name``: string or
    record): ``branch`` is each row's branch index (-1 for null) and ``values`` one array
    per branch, null on the rows of other branches."""

    branch: np.ndarray
    values: tuple[pa.Array, ...]
    types: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.branch)

    def to_pylist(self) -> list[Any]:
        """The values as the row decoder returns them."""
        columns = [to_pylist(v) for v in self.values]
        return [None if b < 0 else columns[b][k] for k, b in enumerate(self.branch.tolist())]

    def take(self, index: np.ndarray) -> UnionColumn:
        rows = pa.array(index, pa.int64())
        return UnionColumn(self.branch[index], tuple(v.take(rows) for v in self.values), self.types)


Column: TypeAlias = pa.Array | UnionColumn


def to_pylist(value: Column) -> list[Any]:
    """A decoded column's values as the row decoder returns them (maps as dicts, the last of
    a repeated key winning)."""
    if isinstance(value, UnionColumn):
        return value.to_pylist()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values: list[Any] = value.to_pylist(maps_as_pydicts="lossy")
        return values


@dataclass(frozen=True)
class Decoded:
    """A decoded batch: ``columns`` (one per top-level field), ``header`` (the
    ``ChangeEventHeader``'s fields, when the first field is that record) and ``errors``
    (input row -> reason, as the row decoder words it). The columns hold only the rows that
    decoded, in input order: ``rows`` are their input positions."""

    columns: dict[str, Column]
    header: dict[str, pa.Array]
    rows: np.ndarray
    errors: dict[int, str]

    def with_errors(self, extra: dict[int, str]) -> Decoded:
        """The batch with the rows of ``extra`` failed with those reasons."""
        if not extra:
            return self
        errors = dict(sorted({**self.errors, **extra}.items()))
        bad = np.isin(self.rows, np.fromiter(extra, _I64, len(extra)))
        if not bad.any():
            return Decoded(self.columns, self.header, self.rows, errors)
        keep = np.flatnonzero(~bad)
        columns = {k: _take(v, keep) for k, v in self.columns.items()}
        header = {k: _take(v, keep) for k, v in self.header.items()}
        return Decoded(columns, header, self.rows[keep], errors)


# ----------------------------------------------------------------------- the batch


class _Batch:
    """The payloads of one batch, their read state and the failures found so far."""

    def __init__(self, data: np.ndarray, buffer: pa.Buffer, start: np.ndarray, n: int) -> None:
        self.data = data
        self.last = len(data) - 1
        self.buffer = buffer
        self.start = start
        self.alive = np.ones(n, bool)
        self.deaths = 0
        self.irregular = np.zeros(n, bool)
        self.failures: dict[int, tuple[str, str, int]] = {}
        self._padded: np.ndarray | None = None

    def padded(self, pad: int) -> np.ndarray:
        """The payload bytes followed by ``pad`` zero bytes or more."""
        if self._padded is None or len(self._padded) < len(self.data) + pad:
            pad = max(pad, 8200 * _WALK + 16)  # what any read asks for: one copy per batch
            self._padded = np.concatenate([self.data, np.zeros(pad, np.uint8)])
        return self._padded

    def fail(
        self,
        rows: np.ndarray,
        bad: np.ndarray,
        reason: str | Callable[[int], str],
        path: str,
        pos: np.ndarray,
    ) -> None:
        """Marks ``rows[bad]`` failed (those not failed already) with ``reason`` (text, or a
        function of the row's position in ``rows``) at field ``path``, byte ``pos``."""
        which = np.flatnonzero(bad)
        if self.deaths:
            which = which[self.alive[rows[which]]]
        if not which.size:
            return
        for k in which.tolist():
            row = int(rows[k])
            text = reason if isinstance(reason, str) else reason(k)
            self.failures[row] = (text, path, int(pos[k]) - int(self.start[row]))
        self.alive[rows[which]] = False
        self.deaths += len(which)

    def byte(
        self,
        rows: np.ndarray,
        p: np.ndarray,
        end: np.ndarray,
        path: str,
        at: np.ndarray | None = None,
    ) -> np.ndarray:
        over = p >= end
        if over.any():
            self.fail(rows, over, _TRUNCATED, path, p if at is None else at)
            clipped: np.ndarray = self.data[np.clip(p, 0, self.last)]
            return clipped
        values: np.ndarray = self.data[p]
        return values

    def varint(
        self,
        rows: np.ndarray,
        p: np.ndarray,
        end: np.ndarray,
        path: str,
        *,
        bits: int = 64,
        at: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Zigzag varints (not undone) as uint64, and the positions after them.

        ``at`` None: the generated decoder's inline varint (an int, long or enum index),
        whose failures it reports at the byte reached. ``at`` given: its helper's (a length
        or block count of several bytes), reported at ``at``."""
        b = self.byte(rows, p, end, path, at)
        n = (b & 127).astype(_U64)
        p = p + 1
        more = np.flatnonzero(b > 127)
        groups = -(-bits // 7)
        # A window costs ten bytes a row: a few rows' varints take it, many rows' the loop.
        if (
            0 < more.size <= _WINDOW
            and not self.deaths
            and self._window(more, n, p, end, bits=bits, groups=groups)
        ):
            return n, p
        shift = 7
        k = 1
        while more.size:
            if self.deaths:
                more = more[self.alive[rows[more]]]
                if not more.size:
                    break
            q = p[more]
            bb = self.byte(rows[more], q, end[more], path, None if at is None else at[more])
            p[more] = q + 1
            if k == groups - 1:
                # The last group holds only the bits left and no continuation bit.
                if at is None:
                    bad = bb > (1 << (bits - 7 * k)) - 1
                    if bad.any():
                        self.fail(rows[more], bad, f"varint longer than {bits} bits", path, q + 1)
                else:
                    long = bb > 127
                    if long.any():
                        self.fail(rows[more], long, "varint longer than 10 bytes", path, at[more])
                    wide = bb > 1
                    if wide.any():
                        self.fail(rows[more], wide, "long outside the 64-bit range", path, at[more])
                n[more] |= (bb.astype(_U64) & _U64(1 if bits == 64 else 127)) << _U64(shift)
                break
            n[more] |= (bb.astype(_U64) & _U64(127)) << _U64(shift)
            more = more[bb > 127]
            shift += 7
            k += 1
        return n, p

    def _window(
        self,
        more: np.ndarray,
        n: np.ndarray,
        p: np.ndarray,
        end: np.ndarray,
        *,
        bits: int,
        groups: int,
    ) -> bool:
        """The varints of several bytes at ``more`` read at once from a window of bytes into
        ``n`` and ``p``, when each ends in its payload and in its bit width (else False,
        and nothing changed)."""
        first = p[more] - 1
        window = self.padded(16)[first[:, None] + _GROUPS[:groups]]
        going = window > 127
        length = going.argmin(axis=1) + 1
        if going.all(axis=1).any() or (first + length > end[more]).any():
            return False
        last = window[:, groups - 1]
        if ((length == groups) & (last > (1 << (bits - 7 * (groups - 1))) - 1)).any():
            return False
        parts = (window & 127).astype(_U64) << _SHIFTS[:groups]
        parts[_GROUPS[:groups][None, :] >= length[:, None]] = 0
        n[more] = np.bitwise_or.reduce(parts, axis=1)
        p[more] = first + length
        return True

    def live(self, rows: np.ndarray) -> np.ndarray | None:
        """Positions in ``rows`` of the rows not failed, or None when none failed."""
        if not self.deaths:
            return None
        alive = self.alive[rows]
        if alive.all():
            return None
        return np.flatnonzero(alive)


def _zigzag(n: np.ndarray) -> np.ndarray:
    signed: np.ndarray = ((n >> _U64(1)) ^ (_U64(0) - (n & _U64(1)))).view(_I64)
    return signed


def _spread(value: Column, sub: np.ndarray, n: int) -> Column:
    """``value`` (one per row of ``sub``) spread over ``n`` rows, null on the others."""
    if isinstance(value, UnionColumn):
        branch = np.full(n, -1, _I64)
        branch[sub] = value.branch
        return UnionColumn(branch, tuple(_spread(v, sub, n) for v in value.values), value.types)
    index = np.zeros(n, _I64)
    index[sub] = np.arange(len(sub), dtype=_I64)
    mask = np.ones(n, bool)
    mask[sub] = False
    return value.take(pa.array(index, pa.int64(), mask=mask))


def _with_nulls(values: pa.Array, selected: np.ndarray) -> pa.Array:
    """``values`` (one per selected row) spread over all rows, null on the others."""
    if selected.all():
        return values
    index = np.cumsum(selected, dtype=_I64) - 1
    return values.take(pa.array(index, pa.int64(), mask=~selected))


# ----------------------------------------------------------------------- the readers


class _Node:
    """The reader of one schema node: ``read`` gives one value per row of ``rows`` (all
    alive on entry) and the positions after them; rows that fail are marked on the batch and
    their values and positions are then meaningless."""

    arrow_type: pa.DataType = pa.null()
    min_size = 1

    def read(
        self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray
    ) -> tuple[Column, np.ndarray]:
        raise NotImplementedError

    def nulls(self, n: int) -> Column:
        return pa.nulls(n, self.arrow_type)

    def read_live(
        self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray
    ) -> tuple[Column, np.ndarray]:
        """:meth:`read` of the rows of ``rows`` not failed yet (the others null)."""
        sub = b.live(rows)
        if sub is None:
            return self.read(b, rows, p, end)
        n = len(rows)
        if not sub.size:
            return self.nulls(n), p
        value, q = self.read(b, rows[sub], p[sub], end[sub])
        p = p.copy()
        p[sub] = q
        return _spread(value, sub, n), p


class _Null(_Node):
    min_size = 0

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        return pa.nulls(len(rows)), p


class _Int(_Node):
    def __init__(self, path: str, bits: int) -> None:
        self.path = path
        self.bits = bits
        self.arrow_type = pa.int64() if bits == 64 else pa.int32()

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        raw, p = b.varint(rows, p, end, self.path, bits=self.bits)
        values = _zigzag(raw)
        if self.bits == 32:
            values = values.astype(np.int32)
        return pa.array(values, self.arrow_type), p


class _Boolean(_Node):
    arrow_type = pa.bool_()

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        v = b.byte(rows, p, end, self.path)
        bad = v > 1
        p = p + 1
        if bad.any():
            b.fail(rows, bad, lambda k: f"boolean byte {v[k]} (expected 0 or 1)", self.path, p)
        return pa.array(v.astype(bool), pa.bool_()), p


class _Float(_Node):
    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self.min_size = size
        self.arrow_type = pa.float64() if size == 8 else pa.float32()
        self.view = "<f8" if size == 8 else "<f4"

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        raw, p = _fixed(b, rows, p, end, size=self.size, path=self.path, reason=None)
        return pa.array(raw.view(self.view).reshape(-1), self.arrow_type), p


def _fixed(
    b: _Batch,
    rows: np.ndarray,
    p: np.ndarray,
    end: np.ndarray,
    *,
    size: int,
    path: str,
    reason: str | None,
) -> tuple[np.ndarray, np.ndarray]:
    stop = p + size
    over = stop > end
    index = p[:, None] + np.arange(size, dtype=_I64)
    if over.any():
        left = end - p
        b.fail(
            rows,
            over,
            _TRUNCATED if reason is None else (lambda k: f"{reason} {left[k]} left"),
            path,
            p,
        )
        index = np.clip(index, 0, b.last)
    raw = b.data[index] if size else np.zeros((len(p), 0), np.uint8)
    return np.ascontiguousarray(raw), stop


class _Fixed(_Node):
    arrow_type = pa.binary()

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self.min_size = size

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        size = self.size
        raw, p = _fixed(
            b, rows, p, end, size=size, path=self.path, reason=f"truncated: {size} bytes announced,"
        )
        offsets = np.arange(len(p) + 1, dtype=np.int32) * size
        array = pa.Array.from_buffers(
            pa.binary(), len(p), [None, pa.py_buffer(offsets), pa.py_buffer(raw.reshape(-1))]
        )
        return array, p


class _Sized(_Node):
    """A string or bytes value: a length, then that many bytes."""

    def __init__(self, path: str, string: bool) -> None:
        self.path = path
        self.string = string
        self.arrow_type = pa.string() if string else pa.binary()

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        path = self.path
        first = b.byte(rows, p, end, path)
        q = p + 1
        length = (first >> 1).astype(_I64)
        odd = (first & 129) != 0
        if odd.any():
            k = np.flatnonzero(odd)
            raw = first[k].astype(_U64)
            multi = np.flatnonzero(first[k] > 127)
            if multi.size:
                m = k[multi]
                raw_m, q[m] = b.varint(rows[m], p[m], end[m], path, at=p[m] + 1)
                raw[multi] = raw_m
            length[k] = signed = _zigzag(raw)
            negative = signed < 0
            if negative.any():
                b.fail(rows[k], negative, lambda j: f"negative length {signed[j]}", path, p[k] + 1)
        left = end - q
        over = length > left
        if over.any():
            b.fail(
                rows,
                over,
                lambda j: f"truncated: {length[j]} bytes announced, {left[j]} left",
                path,
                q,
            )
        stop = q + length
        if b.deaths:
            dead = ~b.alive[rows]
            if dead.any():
                q = np.where(dead, 0, q)
                stop = np.where(dead, 0, stop)
        array = self._spans(b, q, stop)
        if self.string:
            try:
                array.validate(full=True)  # UTF-8, as bytes.decode() checks it
            except pa.ArrowInvalid:
                bad = np.zeros(len(q), bool)
                for j, v in enumerate(array.view(pa.binary()).to_pylist()):
                    try:
                        v.decode()
                    except UnicodeDecodeError:
                        bad[j] = True
                b.fail(rows, bad, "invalid UTF-8 in a string", path, q)
                array = self._spans(b, np.where(bad, 0, q), np.where(bad, 0, stop))
        return array, stop

    def read_selected(
        self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray, selected: np.ndarray
    ) -> tuple[pa.Array, np.ndarray]:
        """The values of the ``selected`` rows (null on the others, whose positions stay)."""
        if selected.all():
            whole: tuple[pa.Array, np.ndarray] = self.read(b, rows, p, end)
            return whole
        sub = np.flatnonzero(selected)
        value, after = self.read(b, rows[sub], p[sub], end[sub])
        p = p.copy()
        p[sub] = after
        if (
            not b.deaths
            and isinstance(value, (pa.StringArray, pa.BinaryArray))
            and not value.offset
        ):
            # Spread with empty values, nulls marked by a validity bitmap: no take.
            offsets = np.frombuffer(value.buffers()[1], np.int32)[: len(sub) + 1]
            spread = np.zeros(len(p) + 1, np.int32)
            spread[0] = offsets[0]
            spread[sub + 1] = offsets[1:] - offsets[:-1]
            np.cumsum(spread, out=spread)
            validity = pa.py_buffer(np.packbits(selected, bitorder="little"))
            array = pa.Array.from_buffers(
                value.type,
                len(p),
                [validity, pa.py_buffer(spread), value.buffers()[2]],
                null_count=len(p) - len(sub),
            )
            return array, p
        return _with_nulls(value, selected), p

    def _spans(self, b: _Batch, q: np.ndarray, stop: np.ndarray) -> pa.Array:
        # The values lie in payload order: as the odd elements of a binary array over the
        # whole payload buffer whose even elements are the bytes between them, one take
        # copies them out (in C++, a memcpy per value). Dead rows' spans are empty.
        n = len(q)
        large = b.buffer.size > _MAX_OFFSET
        bounds = np.empty(2 * n + 2, _I64 if large else np.int32)
        bounds[0] = 0
        bounds[1:-1:2] = q
        bounds[2:-1:2] = stop
        bounds[-1] = bounds[-2]
        if b.deaths:
            # Bounds must not decrease: a dead row's empty span at 0 follows a later one.
            np.maximum.accumulate(bounds, out=bounds)
        gaps = pa.Array.from_buffers(
            pa.large_binary() if large else pa.binary(),
            2 * n + 1,
            [None, pa.py_buffer(bounds), b.buffer],
        )
        array = gaps.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int32)))
        if large:
            array = array.cast(pa.binary())
        return array.view(pa.string()) if self.string else array


class _Enum(_Node):
    arrow_type = pa.string()

    def __init__(self, path: str, symbols: Sequence[str]) -> None:
        self.path = path
        self.symbols = pa.array(list(symbols), pa.string())
        self.count = len(symbols)

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        raw, p = b.varint(rows, p, end, self.path)
        index = _zigzag(raw)
        bad = (index < 0) | (index >= self.count)
        if bad.any():
            count = self.count
            b.fail(
                rows,
                bad,
                lambda k: f"enum index {index[k]} out of range (expected 0..{count - 1})",
                self.path,
                p,
            )
            index = np.where(bad, 0, index)
        return self.symbols.take(pa.array(index)), p


class _Record(_Node):
    def __init__(self, names: list[str], children: list[_Node]) -> None:
        self.names = names
        self.children = children
        self.fields = [pa.field(n, c.arrow_type) for n, c in zip(names, children, strict=True)]
        self.arrow_type = pa.struct(self.fields)
        self.min_size = sum(c.min_size for c in children)
        self.steps = _Steps(children)

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        values, p = self.steps.read(b, rows, p, end)
        return pa.StructArray.from_arrays(values, fields=self.fields), p


class _Union(_Node):
    def __init__(
        self, path: str, branches: list[_Node], nulls: list[bool], resolved: list[Any], top: bool
    ) -> None:
        self.path = path
        self.branches = branches
        self.is_null = nulls
        self.resolved = resolved
        self.count = len(branches)
        self.values = [j for j, null in enumerate(nulls) if not null]
        self.null_code = nulls.index(True) if True in nulls else None
        self.top = top and len(self.values) > 1
        # The common case, every index one even byte in range: tables from the byte.
        self.valid = np.zeros(256, bool)
        self.valid[[2 * j for j in range(min(len(branches), 64))]] = True
        only = branches[self.values[0]] if len(self.values) == 1 else None
        self.single: _Sized | None = only if isinstance(only, _Sized) else None
        if len(self.values) == 1:
            self.arrow_type = branches[self.values[0]].arrow_type
        elif not self.values:
            self.arrow_type = pa.null()
        elif not self.top:
            self.arrow_type = pa.sparse_union(
                [pa.field(str(j), c.arrow_type) for j, c in enumerate(branches)],
                list(range(len(branches))),
            )

    def nulls(self, n: int) -> Column:
        if self.top:
            return UnionColumn(
                np.full(n, -1, _I64),
                tuple(pa.nulls(n, self.branches[j].arrow_type) for j in self.values),
                tuple(self.resolved[j] for j in self.values),
            )
        if len(self.values) > 1:
            code = self.null_code if self.null_code is not None else 0
            return self._sparse(np.full(n, code, np.int8), {}, n)
        return pa.nulls(n, self.arrow_type)

    def _sparse(self, codes: np.ndarray, values: dict[int, pa.Array], n: int) -> pa.Array:
        children = [
            values[j] if j in values else pa.nulls(n, c.arrow_type)
            for j, c in enumerate(self.branches)
        ]
        return pa.UnionArray.from_sparse(pa.array(codes, pa.int8()), children)

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        path = self.path
        u = b.byte(rows, p, end, path)
        q = p + 1
        n = len(rows)
        if self.null_code is not None and not (u != 2 * self.null_code).any():
            return self.nulls(n), q  # null everywhere (alive or not)
        if not b.deaths and self.single is not None and self.valid[u].all():
            # ["null", string]: the values read in place, null where the index says so.
            return self.single.read_selected(b, rows, q, end, u == 2 * self.values[0])
        index = _zigzag(u.astype(_U64))
        irregular = u > 127
        if irregular.any():
            # Valid Avro no writer produces: the row decoder hands such a payload to
            # fastavro (ColumnarDecoder.decode does the same if it fails).
            if b.deaths:
                irregular &= b.alive[rows]
            k = np.flatnonzero(irregular)
            b.irregular[rows[k]] = True
            raw, q[k] = b.varint(rows[k], p[k], end[k], path, at=p[k] + 1)
            index[k] = _zigzag(raw)
        bad = (index < 0) | (index >= self.count)
        if bad.any():
            count = self.count
            b.fail(
                rows,
                bad,
                lambda k: f"union branch index {index[k]} out of range (expected 0..{count - 1})",
                path,
                q,
            )
        alive = b.alive[rows] if b.deaths else None
        values: dict[int, pa.Array] = {}
        p = q.copy()
        for j in self.values:
            selected = index == j
            if alive is not None:
                selected &= alive
            sub = np.flatnonzero(selected)
            if not sub.size:
                values[j] = pa.nulls(n, self.branches[j].arrow_type)
                continue
            value, after = self.branches[j].read(b, rows[sub], p[sub], end[sub])
            p[sub] = after
            values[j] = _with_nulls(value, selected)
        if len(self.values) == 1:
            return values[self.values[0]], p
        if not self.values:
            return pa.nulls(n), p
        valid = (index >= 0) & (index < self.count)
        if self.top:
            branch = np.full(n, -1, _I64)
            for position, j in enumerate(self.values):
                branch[(index == j) & valid] = position
            return UnionColumn(
                branch,
                tuple(values[j] for j in self.values),
                tuple(self.resolved[j] for j in self.values),
            ), p
        codes = np.where(valid, index, self.null_code or 0).astype(np.int8)
        return self._sparse(codes, values, n), p


class _Run:
    """Consecutive ``["null", T]`` fields of a record, T a string, double or boolean (most
    of a Salesforce event and of its addresses), read together: one step per field to find
    each value's place from its union byte (and a string's length byte), then every value
    gathered and checked at once. From the first field some payload does not hold in the
    common way (a union index or length of more than one byte, a read past its end, a
    boolean byte other than 0/1), the fields are read one at a time, which reports each
    failure as the row decoder does."""

    # Bytes a step advances by, from the union byte and the next one (a string's length):
    # 1 for a null; 2 + length for a string of fewer than 64 bytes, 9 for a double, 2 for a
    # boolean. The check after the steps judges any other byte.
    STRING = np.ones((256, 256), _I64)
    STRING[2, :] = 2 + ((np.arange(256, dtype=_I64) >> 1) & 63)
    DOUBLE = np.ones(256, _I64)
    DOUBLE[2] = 9
    BOOLEAN = np.ones(256, _I64)
    BOOLEAN[2] = 2
    # A wide walk also takes a string length of two bytes (64 to 8191 bytes): the step is
    # WIDE + EXTRA * (third byte & 127).
    WIDE = STRING.copy()
    WIDE[2, 128:] = 3 + ((np.arange(128, 256, dtype=_I64) & 127) >> 1)
    EXTRA = np.zeros((256, 256), _I64)
    EXTRA[2, 128:] = 64

    def __init__(self, nodes: list[_Union]) -> None:
        self.nodes = nodes
        self.kinds = [_run_kind(node) for node in nodes]
        self.is_string = np.array([kind == "s" for kind in self.kinds])[:, None]
        self.is_boolean = np.array([kind == "b" for kind in self.kinds])[:, None]

    def read(
        self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray
    ) -> tuple[list[Column], np.ndarray]:
        values: list[Column] = []
        start = 0
        count = len(self.nodes)
        wide = False
        while start < count:
            if b.deaths:
                for node in self.nodes[start:]:
                    value, p = node.read_live(b, rows, p, end)
                    values.append(value)
                break
            done, p = self._together(b, start, p, end, wide)
            values.extend(done)
            start += len(done)
            if start < count:
                wide = True  # long strings, perhaps: the next walks take them
                # The first field some payload does not hold in the common way: on its own.
                value, p = self.nodes[start].read(b, rows, p, end)
                values.append(value)
                start += 1
        return values, p

    def _together(
        self, b: _Batch, start: int, p: np.ndarray, end: np.ndarray, wide: bool
    ) -> tuple[list[Column], np.ndarray]:
        """The fields from ``start`` on that every payload holds in the common way, and the
        positions after them."""
        # A walk goes at most _WALK fields: a walk that stops early does not redo many.
        kinds = self.kinds[start : start + _WALK]
        k, n = len(kinds), len(p)
        data = b.padded(8200 * k + 4)
        at = np.empty((k + 1, n), _I64)
        string, double, boolean = self.WIDE if wide else self.STRING, self.DOUBLE, self.BOOLEAN
        extra = self.EXTRA
        for f, kind in enumerate(kinds):
            at[f] = p
            if kind == "s":
                if wide:
                    u, length = data[p], data[p + 1]
                    p = p + string[u, length] + extra[u, length] * (data[p + 2] & 127)
                else:
                    p = p + string[data[p], data[p + 1]]
            elif kind == "d":
                p = p + double[data[p]]
            else:
                p = p + boolean[data[p]]
        at[k] = p
        union = data[at[:k]]
        second = data[at[:k] + 1]
        present = union == 2
        is_string = self.is_string[start : start + k]
        is_boolean = self.is_boolean[start : start + k]
        multi = None
        if wide:
            third = data[at[:k] + 2]
            multi = present & is_string & (second > 127)
            short = np.where(multi, ((second & 1) != 0) | (third > 127), (second & 129) != 0)
        else:
            short = (second & 129) != 0
        odd = np.where(is_string, short, is_boolean & (second > 1))
        good = ((union == 0) | (present & ~odd)) & (at[1:] <= end)
        fine = good.all(axis=1)
        if not fine.all():
            k = int(np.argmin(fine))
            if not k:
                return [], at[0]
            kinds = kinds[:k]
        counts = present[:k].sum(axis=1).tolist()
        if not any(counts):  # null everywhere
            return [self.nodes[start + f].nulls(n) for f in range(k)], at[k]
        values: list[Column | None] = [None] * k
        strings = [f for f in range(k) if kinds[f] == "s" and counts[f]]
        if strings:
            lengths = (second >> 1).astype(_I64)
            starts = at[:k] + 2
            if multi is not None and multi.any():
                wide_lengths = ((second & 127) >> 1).astype(_I64) | (third.astype(_I64) << 6)
                lengths = np.where(multi, wide_lengths, lengths)
                starts = starts + multi
            if not self._strings(
                b, starts, lengths, present, fields=strings, counts=counts, values=values
            ):
                return [], at[0]
        for f in range(k):
            if values[f] is not None:
                continue
            mask = None if counts[f] == n else ~present[f]
            if not counts[f]:
                values[f] = self.nodes[start + f].nulls(n)
            elif kinds[f] == "d":
                raw = data[at[f][:, None] + np.arange(1, 9, dtype=_I64)]
                values[f] = pa.array(raw.view("<f8").reshape(-1), pa.float64(), mask=mask)
            else:
                values[f] = pa.array(second[f].astype(bool), pa.bool_(), mask=mask)
        return values, at[k]

    @staticmethod
    def _strings(
        b: _Batch,
        starts: np.ndarray,
        lengths: np.ndarray,
        present: np.ndarray,
        *,
        fields: list[int],
        counts: list[int],
        values: list[Column | None],
    ) -> bool:
        """The string fields' values, all copied out with one take (False: invalid UTF-8
        somewhere, for the fields to judge one at a time)."""
        n = starts.shape[1]
        k = len(fields)
        here = present[fields]
        # Spans in payload order (row by row), a null's empty, as the odd elements of a
        # binary array over the whole payload buffer (see _Sized._spans); the take picks
        # them field by field.
        first = np.where(here, starts[fields], starts[fields] - 1).T
        stops = first + np.where(here, lengths[fields], 0).T
        large = b.buffer.size > _MAX_OFFSET
        bounds = np.empty(2 * k * n + 2, _I64 if large else np.int32)
        bounds[0] = 0
        bounds[1:-1:2] = first.reshape(-1)
        bounds[2:-1:2] = stops.reshape(-1)
        bounds[-1] = bounds[-2]
        gaps = pa.Array.from_buffers(
            pa.large_binary() if large else pa.binary(),
            2 * k * n + 1,
            [None, pa.py_buffer(bounds), b.buffer],
        )
        order = (
            2 * (np.arange(n, dtype=np.int32)[None, :] * k + np.arange(k, dtype=np.int32)[:, None])
            + 1
        )
        taken = gaps.take(pa.array(order.reshape(-1)))
        if large:
            taken = taken.cast(pa.binary())
        everything = taken.view(pa.string())
        try:
            everything.validate(full=True)  # UTF-8, as bytes.decode() checks it
        except pa.ArrowInvalid:
            return False
        _, offsets, data = everything.buffers()
        bits = pa.py_buffer(np.packbits(here.reshape(-1), bitorder="little"))
        for j, f in enumerate(fields):
            if not counts[f]:
                values[f] = pa.nulls(n, pa.string())
                continue
            values[f] = pa.Array.from_buffers(
                pa.string(),
                n,
                [None if counts[f] == n else bits, offsets, data],
                null_count=n - counts[f],
                offset=j * n,
            )
        return True


def _run_kind(node: _Node) -> str | None:
    """ "s", "d" or "b" for a ``["null", T]`` union of a string, double or boolean."""
    if not (isinstance(node, _Union) and node.count == 2 and node.null_code == 0):
        return None
    value = node.branches[1]
    if isinstance(value, _Sized) and value.string:
        return "s"
    if isinstance(value, _Float) and value.size == 8:
        return "d"
    if isinstance(value, _Boolean):
        return "b"
    return None


_RUN = 3  # consecutive fields read together
_RUN_ROWS = 2_000  # batches of more rows read a run's fields one by one
_WALK = 16  # fields of a run read together at most


class _Steps:
    """A record's fields in order: runs of fields read together, and the others."""

    def __init__(self, nodes: list[_Node]) -> None:
        self.steps: list[_Node | _Run] = []
        run: list[_Union] = []
        for node in nodes:
            if _run_kind(node) is not None:
                run.append(node)  # type: ignore[arg-type]
                continue
            self._close(run)
            run = []
            self.steps.append(node)
        self._close(run)

    def _close(self, run: list[_Union]) -> None:
        if len(run) >= _RUN:
            self.steps.append(_Run(run))
        else:
            self.steps.extend(run)

    def read(
        self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray
    ) -> tuple[list[Column], np.ndarray]:
        values: list[Column] = []
        # A run read together saves fixed costs per field, which count on a few rows; on many
        # rows reading its fields one by one costs less (its walk touches every field twice).
        together = len(rows) <= _RUN_ROWS
        for step in self.steps:
            if isinstance(step, _Run) and together:
                run_values, p = step.read(b, rows, p, end)
                values.extend(run_values)
                continue
            for node in step.nodes if isinstance(step, _Run) else (step,):
                if b.deaths:
                    value, p = node.read_live(b, rows, p, end)
                else:
                    value, p = node.read(b, rows, p, end)
                values.append(value)
        return values, p


class _Blocks(_Node):
    """An array or a map: blocks of items, each block a count (negative: followed by its
    size in bytes), the last count 0."""

    def __init__(self, path: str, items: list[_Node], names: list[str] | None) -> None:
        self.path = path
        self.items = items
        self.names = names  # map: key and value
        self.item_min = sum(i.min_size for i in items)
        if names is None:
            self.arrow_type = pa.list_(items[0].arrow_type)
        else:
            self.arrow_type = pa.map_(pa.string(), items[1].arrow_type)

    def count(
        self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next block's count (0: the end) and the positions after it."""
        path = self.path
        c = b.byte(rows, p, end, path)
        q = p + 1
        count = (c >> 1).astype(_U64)
        odd = (c & 129) != 0
        if odd.any():
            k = np.flatnonzero(odd)
            at = p[k] + 1
            raw = c[k].astype(_U64)
            multi = np.flatnonzero(c[k] > 127)
            if multi.size:
                m = k[multi]
                raw_m, q[m] = b.varint(rows[m], p[m], end[m], path, at=at[multi])
                raw[multi] = raw_m
            signed = _zigzag(raw)
            zero = signed == 0
            if b.deaths:
                zero &= b.alive[rows[k]]
            if zero.any():  # a zero in several bytes: valid, the row decoder hands it on
                b.irregular[rows[k[zero]]] = True
            negative = np.flatnonzero(signed < 0)
            if negative.size:
                m = k[negative]
                # The block's size in bytes: read past it, decoding does not need it.
                size = b.byte(rows[m], q[m], end[m], path, at[negative])
                q[m] += 1
                big = np.flatnonzero(size > 127)
                if big.size:
                    _, q[m[big]] = b.varint(
                        rows[m[big]], q[m[big]] - 1, end[m[big]], path, at=at[negative][big]
                    )
            unsigned = signed.view(_U64)
            count[k] = np.where(signed < 0, _U64(0) - unsigned, unsigned)
        left = (end - q).astype(_U64)
        limit = left if self.item_min == 1 else left // _U64(max(self.item_min, 1))
        over = count > limit
        if over.any():
            b.fail(
                rows,
                over,
                lambda j: (
                    f"truncated: block of {int(count[j])} items announced, "
                    f"{int(left[j])} bytes left"
                ),
                path,
                q,
            )
            count = np.where(over, _U64(0), count)
        if b.deaths:
            count = np.where(b.alive[rows], count, _U64(0))
        return count.astype(_I64), q

    def read(self, b: _Batch, rows: np.ndarray, p: np.ndarray, end: np.ndarray) -> Any:
        n = len(rows)
        parts: list[list[pa.Array]] = [[] for _ in self.items]
        rows_parts: list[np.ndarray] = []
        ordinal_parts: list[np.ndarray] = []
        counts = np.zeros(n, _I64)
        active = np.arange(n, dtype=_I64)
        p = p.copy()
        while active.size:
            if b.deaths:
                active = active[b.alive[rows[active]]]
                if not active.size:
                    break
            count, q = self.count(b, rows[active], p[active], end[active])
            p[active] = q
            live = count > 0
            active, count = active[live], count[live]
            for k in range(int(count.max()) if count.size else 0):
                sel = active[count > k]
                if b.deaths:
                    sel = sel[b.alive[rows[sel]]]
                    if not sel.size:
                        continue
                for i, item in enumerate(self.items):
                    if i and b.deaths:
                        value, after = item.read_live(b, rows[sel], p[sel], end[sel])
                    else:
                        value, after = item.read(b, rows[sel], p[sel], end[sel])
                    p[sel] = after
                    parts[i].append(value)
                rows_parts.append(sel)
                ordinal_parts.append(counts[sel])
                counts[sel] += 1
        offsets = np.zeros(n + 1, _I64)
        np.cumsum(counts, out=offsets[1:])
        flat = []
        if rows_parts:
            order = np.lexsort((np.concatenate(ordinal_parts), np.concatenate(rows_parts)))
            take = pa.array(order)
            for part in parts:
                flat.append(pa.concat_arrays(part).take(take))
        else:
            flat = [i.nulls(0) for i in self.items]
        offset_array = pa.array(offsets.astype(np.int32))
        if self.names is None:
            return pa.ListArray.from_arrays(offset_array, flat[0]), p
        return pa.MapArray.from_arrays(offset_array, flat[0], flat[1]), p


# ----------------------------------------------------------------------- the decoder


class ColumnarDecoder:
    """Decodes the payloads of one schema a field at a time (see the module docstring).

    :meth:`decode` gives one Arrow array per top-level field (the header's fields under
    their own names in ``header``), a :class:`UnionColumn` for a union of several non-null
    branches, and the rows that did not decode with their reasons.
    """

    def __init__(self, schema: EventSchema) -> None:
        parsed = schema.parsed
        self.schema = schema
        self._named: dict[str, Any] = dict(parsed.get("__named_schemas", {}))
        if parsed.get("type") not in ("record", "error"):
            raise _Unsupported("the top-level type is not a record")
        self._expanding: list[str] = [parsed["name"]]
        names = self._names(parsed)
        self._fields: list[tuple[str, _Node]] = []
        for f in parsed["fields"]:
            self._fields.append((f["name"], self._node(f["type"], f["name"], top=True)))
        self._header = (
            bool(names) and names[0] == HEADER_FIELD and isinstance(self._fields[0][1], _Record)
        )
        self._parsed_for_fastavro: Any = None
        nodes = [node for _, node in self._fields]
        if self._header:  # its fields are read as columns of their own
            assert isinstance(nodes[0], _Record)
            self._header_steps: _Steps | None = nodes[0].steps
            nodes = nodes[1:]
        else:
            self._header_steps = None
        self._steps = _Steps(nodes)

    @classmethod
    def for_schema(cls, schema: EventSchema) -> ColumnarDecoder | None:
        """The decoder of ``schema``, or None when the schema has constructs the row decoder
        leaves to fastavro."""
        try:
            return cls(schema)
        except _Unsupported:
            return None

    # ------------------------------------------------------------------- the schema

    def _resolve(self, t: Any) -> Any:
        return resolve_type(t, self._named, kinds=_COMPOSITE, unsupported=_Unsupported)

    @staticmethod
    def _names(record: dict[str, Any]) -> list[str]:
        names = [f["name"] for f in record["fields"]]
        if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise _Unsupported(f"field names {names!r}")
        return names

    def _node(self, t: Any, path: str, *, top: bool = False) -> _Node:
        t = self._resolve(t)
        if isinstance(t, str):
            if t == "null":
                return _Null()
            if t in ("string", "bytes"):
                return _Sized(path, t == "string")
            if t in ("int", "long"):
                return _Int(path, 32 if t == "int" else 64)
            if t in ("float", "double"):
                return _Float(path, 4 if t == "float" else 8)
            return _Boolean(path)
        if isinstance(t, list):
            if not t:
                raise _Unsupported("empty union")
            resolved = [self._resolve(x) for x in t]
            branches = [self._node(x, path) for x in t]
            return _Union(path, branches, [r == "null" for r in resolved], resolved, top)
        kind = t["type"]
        if kind in ("record", "error"):
            name = t["name"]
            if name in self._expanding:
                raise _Unsupported(f"recursive type {name!r}")
            self._expanding.append(name)
            names = self._names(t)
            children = [
                self._node(f["type"], f"{path}.{f['name']}" if path else f["name"])
                for f in t["fields"]
            ]
            self._expanding.pop()
            return _Record(names, children)
        if kind == "enum":
            symbols = t["symbols"]
            if not symbols or not all(isinstance(s, str) for s in symbols):
                raise _Unsupported(f"enum symbols {symbols!r}")
            return _Enum(path, symbols)
        if kind == "fixed":
            size = int(t["size"])
            if size < 0:
                raise _Unsupported(f"fixed size {size}")
            return _Fixed(path, size)
        if kind == "array":
            item_path = f"{path}[]"
            node = _Blocks(item_path, [self._node(t["items"], item_path)], None)
        else:
            item_path = f"{path}{{}}"
            node = _Blocks(
                item_path,
                [_Sized(item_path, True), self._node(t["values"], item_path)],
                ["key", "value"],
            )
        if node.item_min < 1:
            raise _Unsupported("array or map of zero-width items")
        return node

    # ------------------------------------------------------------------- decoding

    def decode(self, payloads: pa.Array) -> Decoded:
        """The rows of ``payloads`` (a binary array) that decode, and the reasons of the
        others (see the module docstring)."""
        n = len(payloads)
        if pa.types.is_large_binary(payloads.type):
            offset_type: Any = np.int64
        elif pa.types.is_binary(payloads.type):
            offset_type = np.int32
        else:
            errors = {
                i: f"a payload must be bytes (got {type(v).__name__})"
                for i, v in enumerate(payloads.to_pylist())
            }
            return Decoded({}, {}, _EMPTY, errors)
        _, offsets_buffer, data_buffer = payloads.buffers()
        if n:
            offsets = np.frombuffer(offsets_buffer, offset_type)[
                payloads.offset : payloads.offset + n + 1
            ]
        else:
            offsets = np.zeros(1, offset_type)
        if data_buffer is None:
            data_buffer = pa.py_buffer(b"")
        data = np.frombuffer(data_buffer, np.uint8)
        if not len(data):
            data = np.zeros(1, np.uint8)
        p = offsets[:-1].astype(_I64)
        end = offsets[1:].astype(_I64)
        b = _Batch(data, data_buffer, p, n)
        overrides: dict[int, str] = {}
        if payloads.null_count:
            null = np.asarray(payloads.is_null())
            for i in np.flatnonzero(null).tolist():
                overrides[i] = "a payload must be bytes (got NoneType)"
            b.alive[null] = False
            b.deaths += int(null.sum())
        rows = np.arange(n, dtype=_I64)
        header_values: list[Column] = []
        if self._header_steps is not None:
            header_values, p = self._header_steps.read(b, rows, p, end)
        values, p = self._steps.read(b, rows, p, end)
        left = end - p
        trailing = left != 0
        if b.deaths:
            trailing &= b.alive
        if trailing.any():
            b.fail(
                rows,
                trailing,
                lambda k: f"{left[k]} unread byte(s) after the end of the record",
                "",
                p,
            )
        redo = b.irregular & ~b.alive
        if redo.any():
            again = self._fastavro(payloads, np.flatnonzero(redo), overrides)
            if again is not None:
                return self.decode(again).with_errors(overrides)
        errors = self._messages(b, end - b.start, overrides)
        good = b.alive
        columns: dict[str, Column] = {}
        header: dict[str, pa.Array] = {}
        if errors:
            keep = np.flatnonzero(good)
            values = [_take(v, keep) for v in values]
            header_values = [_take(v, keep) for v in header_values]
        else:
            keep = rows
        fields = self._fields
        if self._header_steps is not None:
            header_node = fields[0][1]
            assert isinstance(header_node, _Record)
            header = dict(zip(header_node.names, header_values, strict=True))
            fields = fields[1:]
        for (name, _), value in zip(fields, values, strict=True):
            columns[name] = value
        return Decoded(columns, header, keep, errors)

    def _messages(self, b: _Batch, sizes: np.ndarray, overrides: dict[int, str]) -> dict[int, str]:
        schema = self.schema
        errors: dict[int, str] = {}
        for row, (reason, path, pos) in b.failures.items():
            where = [f"field {path}"] if path else []
            where.append(f"byte {pos}")
            errors[row] = (
                f"cannot decode a {int(sizes[row])}-byte payload of {schema.name} "
                f"({schema.schema_id}): {reason} ({', '.join(where)})"
            )
        errors.update(overrides)
        return dict(sorted(errors.items()))

    def _fastavro(
        self, payloads: pa.Array, rows: np.ndarray, overrides: dict[int, str]
    ) -> pa.Array | None:
        """Rows the row decoder hands to fastavro (a union index written in several bytes)
        that failed here: fastavro's reason for each (into ``overrides``), or the payloads
        with those fastavro reads written out again regularly, to decode once more."""
        from fastavro import parse_schema, schemaless_reader, schemaless_writer

        if self._parsed_for_fastavro is None:
            self._parsed_for_fastavro = parse_schema(self.schema.parsed)
        parsed = self._parsed_for_fastavro
        schema = self.schema
        replaced: dict[int, bytes] = {}
        for i in rows.tolist():
            buf = payloads[i].as_py()
            fo = io.BytesIO(buf)
            prefix = (
                f"cannot decode a {len(buf)}-byte payload of {schema.name} ({schema.schema_id}): "
            )
            try:
                record = schemaless_reader(fo, self.schema.parsed, None)
            except Exception as exc:  # fastavro signals bad bytes with many exception types
                overrides[i] = f"{prefix}{type(exc).__name__}: {str(exc)[:120]}"
                continue
            if fo.tell() != len(buf):
                overrides[i] = (
                    f"{prefix}{len(buf) - fo.tell()} unread byte(s) after the end of the record"
                )
                continue
            out = io.BytesIO()
            schemaless_writer(out, parsed, record)
            replaced[i] = out.getvalue()
        if not replaced:
            return None
        values = payloads.to_pylist()
        for i, buf in replaced.items():
            values[i] = buf
        return pa.array(values, pa.binary())


def _take(value: Column, keep: np.ndarray) -> Column:
    if isinstance(value, UnionColumn):
        return value.take(keep)
    return value.take(pa.array(keep, pa.int64()))


def expanded_bitmaps(
    bitmaps: Column, expand: Any, sep: str = "\x00"
) -> tuple[pa.Array, dict[int, str]]:
    """A list<string> column of bitmaps expanded into field names by ``expand`` (called once
    per distinct bitmap), and the rows whose bitmap it refuses (row -> BitmapError text;
    their names are empty)."""
    plain = (
        isinstance(bitmaps, pa.Array)
        and pa.types.is_list(bitmaps.type)
        and pa.types.is_string(bitmaps.type.value_type)
        and not bitmaps.null_count
    )
    if plain and len(bitmaps) <= _FEW:
        plain = False  # a few rows: one at a time, through the expander's memo
    if plain:
        values = pc.list_flatten(bitmaps)
        plain = not (
            values.null_count or (len(values) and pc.any(pc.match_substring(values, sep)).as_py())
        )
    if not plain:
        names: list[Sequence[str]] = []
        errors: dict[int, str] = {}
        seen: dict[Any, Sequence[str] | BitmapError] = {}
        for i, v in enumerate(to_pylist(bitmaps)):
            key = tuple(v) if type(v) is list else v
            try:
                result = seen.get(key)
            except TypeError:  # not hashable
                key, result = None, None
            if result is None:
                try:
                    result = expand(key if key is not None else v)
                except BitmapError as exc:
                    result = exc
                if key is not None:
                    seen[key] = result
            if isinstance(result, BitmapError):
                errors[i] = str(result)
                names.append(())
            else:
                names.append(result)
        return pa.array([list(x) for x in names], pa.list_(pa.string())), errors
    lengths = pc.fill_null(pc.list_value_length(bitmaps), 0).cast(pa.string())
    keys = pc.binary_join_element_wise(lengths, pc.binary_join(bitmaps, sep), sep)
    encoded = pc.dictionary_encode(keys)
    distinct: list[Sequence[str]] = []
    refused: dict[int, str] = {}
    for j, key in enumerate(encoded.dictionary.to_pylist()):
        count, _, joined = key.partition(sep)
        try:
            distinct.append(expand(tuple(joined.split(sep)) if int(count) else ()))
        except BitmapError as exc:
            refused[j] = str(exc)
            distinct.append(())
    names_array = pa.array([list(d) for d in distinct], pa.list_(pa.string()))
    out = names_array.take(encoded.indices)
    if not refused:
        return out, {}
    index = np.asarray(encoded.indices)
    errors = {}
    for j, text in refused.items():
        for i in np.flatnonzero(index == j).tolist():
            errors[i] = text
    return out, errors
