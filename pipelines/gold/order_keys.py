"""Order keys: one string per change that sorts like the tuple of its order columns' values
(see :mod:`pipelines.gold.fold` for how the fold uses them).

:func:`encode_order_key` makes one key value by value; :func:`order_keys` makes the same
strings for a whole batch at once, column by column. Integers, timestamps and dates (every
column of the default ``sequence_by``) and text are encoded with Arrow and NumPy; text holding
a character up to ``'!'`` (which the encoding escapes) and the rarer types (booleans, doubles,
binary) take the value-by-value path.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from datetime import date, datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["column_key_parts", "encode_order_key", "order_keys"]

# ---------------------------------------------------------------------- value by value

_I64 = 1 << 63
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_DAY = date(1970, 1, 1)


def _int_part(value: int) -> str:
    if not -_I64 <= value < _I64:
        raise ValueError(f"order key values must fit in 64 bits (got {value})")
    return f"1{value + _I64:016x}"


def _text_part(text: str) -> str:
    # Characters up to '!' are escaped as '!' + two hex digits and the part ends with ' ',
    # which sorts below every character the escaped text can hold: the encoding is prefix-free
    # and sorts like the text (UTF-8 byte order = code point order, in Python, Spark and
    # DataFusion alike).
    if text and min(text) > "!":
        return f"1{text} "
    escaped = "".join(f"!{ord(c):02x}" if c <= "!" else c for c in text)
    return f"1{escaped} "


def _component(value: object) -> str:
    if value is None:
        return "0"
    if isinstance(value, bool):
        return "11" if value else "10"
    if isinstance(value, int):
        return _int_part(value)
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        delta = aware - _EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return _int_part(micros)
    if isinstance(value, date):
        return _int_part((value - _EPOCH_DAY).days)
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError("an order key value cannot be NaN")
        # -0.0 == 0.0, so both get the key of 0.0.
        (bits,) = struct.unpack(">Q", struct.pack(">d", value + 0.0))
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
        return f"1{bits:016x}"
    if isinstance(value, str):
        return _text_part(value)
    if isinstance(value, bytes | bytearray):
        return _text_part(bytes(value).hex())
    raise TypeError(
        "order key columns must be integers, timestamps, dates, booleans, doubles, strings or "
        f"binary (got a {type(value).__name__})"
    )


def encode_order_key(values: Iterable[object]) -> str:
    """One string that sorts like the tuple ``values`` (nulls first), for any mix of
    integers, timestamps, dates, booleans, doubles, strings and bytes."""
    return "".join(_component(v) for v in values)


# ---------------------------------------------------------------------- column by column

# Two lowercase hex digits per byte value, as bytes.
_HEX = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), np.uint8).reshape(256, 2)
_ONE, _NULL = ord("1"), "0"
_WIDTH = 17  # "1" and 16 hex digits


def _int_parts(values: pa.Array) -> pa.Array:
    """``"1"`` and the 16 hex digits of ``value + 2**63`` per int64 value; nulls ``"0"``."""
    n = len(values)
    raw = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    # Adding 2**63 modulo 2**64 flips the sign bit; big-endian bytes print most significant first.
    biased = (raw.view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
    text = np.empty((n, _WIDTH), np.uint8)
    text[:, 0] = _ONE
    text[:, 1:] = _HEX[biased.view(np.uint8).reshape(n, 8)].reshape(n, 16)
    offsets = np.arange(0, _WIDTH * (n + 1), _WIDTH, dtype=np.int32)
    parts = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))
    return pc.if_else(pc.is_valid(values), parts, _NULL) if values.null_count else parts


def _text_parts(values: pa.Array) -> pa.Array:
    """``"1" + text + " "`` per value, characters up to ``'!'`` escaped; nulls ``"0"``."""
    values = values.cast(pa.string())
    parts = pc.fill_null(pc.binary_join_element_wise("1", values, " ", ""), _NULL)
    escape = pc.fill_null(pc.match_substring_regex(values, r"[\x00-\x21]"), False)
    if not pc.any(escape).as_py():
        return parts
    escaped = [_text_part(v) for v in values.filter(escape).to_pylist()]
    return pc.replace_with_mask(parts, escape, pa.array(escaped, pa.string()))


def column_key_parts(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each value's part of an order key (a string array as long as ``column``)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if pa.types.is_timestamp(t):
        if t.unit != "us":
            column = column.cast(pa.timestamp("us", tz=t.tz))
        return _int_parts(column.cast(pa.int64()))
    if pa.types.is_date(t):
        return _int_parts(column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64()))
    if pa.types.is_integer(t):
        return _int_parts(column.cast(pa.int64()))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _text_parts(column)
    return pa.array([_component(v) for v in column.to_pylist()], pa.string())


def order_keys(table: pa.Table, order_by: Sequence[str]) -> pa.Array:
    """The order key of each row of ``table`` over its ``order_by`` columns."""
    parts = [column_key_parts(table.column(name)) for name in order_by]
    if not parts:
        return pa.array([""] * table.num_rows, pa.string())
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, "")
