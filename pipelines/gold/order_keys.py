"""Order keys computed column by column: the strings :func:`~pipelines.gold.fold.encode_order_key`
makes value by value, for a whole batch at once.

Integers, timestamps and dates (every column of the default ``sequence_by``) and text are
encoded with Arrow and NumPy; text holding a character up to ``'!'`` (which the encoding
escapes) and the rarer types (booleans, doubles, binary) take the value-by-value path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.gold.fold import _component, _text_part

__all__ = ["column_key_parts", "order_keys"]

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
