"""The Avro wire format as the generated decoders read it, and the errors they raise.

The generated code inlines the common cases (a single-byte varint, a short string length,
a union byte) and calls these helpers for the rest: multi-byte varints, lengths and block
counts, and the ``_bad_*`` functions that raise :class:`_Corrupt` with the reason a payload
does not decode. :class:`_Irregular` marks valid Avro that no writer produces, which the
decoder hands to fastavro instead.
"""

from __future__ import annotations

import struct

from ingest.errors import DecodeError

__all__: list[str] = []

_UNPACK_FLOAT = struct.Struct("<f").unpack_from
_UNPACK_DOUBLE = struct.Struct("<d").unpack_from
_MAX_VARINT_SHIFT = 63  # ten 7-bit groups hold a 64-bit long


class _Corrupt(Exception):
    """The payload contradicts the schema; the message is the reason."""


class _Irregular(Exception):
    """Valid Avro that the generated code does not take (a non-minimal union index or count)."""


_LOW_LEVEL = (IndexError, struct.error, UnicodeDecodeError, _Corrupt)


def _varint(buf: bytes, pos: int, first: int) -> tuple[int, int]:
    """A multi-byte varint whose first byte (>= 0x80) was already read; zigzag not undone."""
    result = first & 0x7F
    shift = 7
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > _MAX_VARINT_SHIFT:
            raise _Corrupt("varint longer than 10 bytes")
    if result >> 64:
        raise _Corrupt("long outside the 64-bit range")
    return result, pos


def _zigzag(raw: int) -> int:
    return (raw >> 1) ^ -(raw & 1)


def _length(buf: bytes, pos: int, first: int) -> tuple[int, int]:
    """A string or bytes length that is not a single even byte."""
    if first > 0x7F:
        first, pos = _varint(buf, pos, first)
    length = _zigzag(first)
    if length < 0:
        raise _Corrupt(f"negative length {length}")
    return length, pos


def _count(buf: bytes, pos: int, first: int) -> tuple[int, int]:
    """An array or map block count that is not a single even byte."""
    if first > 0x7F:
        first, pos = _varint(buf, pos, first)
    count = _zigzag(first)
    if count == 0:
        raise _Irregular  # a zero written in several bytes still ends the array
    if count < 0:
        count = -count
        size = buf[pos]  # the block's size in bytes: read past it, decoding does not need it
        pos += 1
        if size > 0x7F:
            _, pos = _varint(buf, pos, size)
    return count, pos


def _bad_union(raw: int, branches: int) -> None:
    if raw > 0x7F:
        raise _Irregular
    raise _Corrupt(f"union branch index {_zigzag(raw)} out of range (expected 0..{branches - 1})")


def _bad_enum(index: int, symbols: int) -> None:
    raise _Corrupt(f"enum index {index} out of range (expected 0..{symbols - 1})")


def _bad_bool(value: int) -> None:
    raise _Corrupt(f"boolean byte {value} (expected 0 or 1)")


def _bad_varint(bits: int) -> None:
    raise _Corrupt(f"varint longer than {bits} bits")


def _bad_length(length: int, left: int) -> None:
    raise _Corrupt(f"truncated: {length} bytes announced, {left} left")


def _bad_block(count: int, left: int) -> None:
    raise _Corrupt(f"truncated: block of {count} items announced, {left} bytes left")


def _trailing(left: int) -> None:
    raise _Corrupt(f"{left} unread byte(s) after the end of the record")


def _as_bytes(payload: object) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload)
    raise DecodeError(f"a payload must be bytes (got {type(payload).__name__})")
