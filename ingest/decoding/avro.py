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

import io
import itertools
import linecache
import logging
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from fastavro import schemaless_reader

from ingest.decoding.bitmap import BitmapExpander, expander_for
from ingest.decoding.event import BITMAP_FIELDS, HEADER_VALUE_FIELDS, ChangeEvent, event_factory
from ingest.errors import DecodeError
from ingest.schema import HEADER_FIELD, EventSchema

__all__ = ["DecodedBatch", "EventDecoder", "compile_decoder", "resolve_type"]

logger = logging.getLogger(__name__)

RecordDecoder = Callable[[bytes], dict[str, Any]]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_UNPACK_FLOAT = struct.Struct("<f").unpack_from
_UNPACK_DOUBLE = struct.Struct("<d").unpack_from
_MAX_VARINT_SHIFT = 63  # ten 7-bit groups hold a 64-bit long
_NULL_RUN = 8  # nullable fields checked at once for "all null"
_CHUNK_ROWS = 256  # rows of a batch decoded before they are moved into the columns
_MAX_INDENT = 95  # of CPython's 100
_MAX_BLOCKS = 19  # of CPython's 20
_serial = itertools.count(1)
_MAKE_EVENT = event_factory()


# --- errors raised inside generated code ------------------------------------------------


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


# --- the code generator -----------------------------------------------------------------

Mode = Literal["record", "event", "batch"]


_COMPOSITE = frozenset({"record", "error", "enum", "fixed", "array", "map"})


def resolve_type(
    t: Any,
    named: dict[str, Any],
    *,
    kinds: frozenset[str],
    unsupported: type[Exception],
) -> Any:
    """A node of a parsed Avro schema with references to ``named`` types resolved: a primitive
    type's name, a union's list of branches, or the definition (a dict) of a type of one of
    ``kinds``. Logical types and anything else raise ``unsupported``."""
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return t
        if t in named:
            return named[t]
        raise unsupported(f"unknown named type {t!r}")
    if isinstance(t, list):
        return t
    if isinstance(t, dict):
        if "logicalType" in t:
            raise unsupported(f"logical type {t['logicalType']!r}")
        kind = t.get("type")
        if kind in _PRIMITIVES:
            return kind
        if kind in kinds:
            return t
    raise unsupported(f"type {t!r}")


class _Unsupported(Exception):
    """The schema uses a construct the generator leaves to fastavro."""


@dataclass
class _Block:
    """Generated lines (indented for the function body) with the field path of each."""

    lines: list[str]
    paths: list[str]
    header: list[tuple[str, str]]  # (header field, local), when header fields are locals
    body: list[tuple[str, str]]  # (top-level field, local), when body fields are locals
    header_is_split: bool
    arrays: frozenset[str] = frozenset()  # header fields that are plain (non-null) arrays


def _is_nullable_union(t: Any) -> bool:
    # Branch 0 null: the null value is the single byte 0x00, as in every Salesforce field.
    return isinstance(t, list) and bool(t) and t[0] == "null"


class _Generator:
    """Emits the body of one decoding function for one schema.

    Values land in *sinks*: a local (``v12``) or a slot of a dict copied from a template
    whose values are all None (``r['Phone']``). A slot needs no store for a null, so a run
    of null fields costs one comparison and nothing else.
    """

    def __init__(self, schema: EventSchema, consts: dict[str, Any], mode: Mode) -> None:
        parsed = schema.parsed
        self.named: dict[str, Any] = dict(parsed.get("__named_schemas", {}))
        self.root = parsed
        self.consts = consts
        self.mode = mode
        self.lines: list[str] = []
        self.paths: list[str] = []
        self.indent = 0
        self.counter = itertools.count()
        self.expanding: list[str] = []
        self.counts: list[str] = []  # block count locals of the open array/map loops
        self.deepest = 0  # indentation levels reached
        self.deepest_loops = 0  # nested while/for blocks reached

    # plumbing

    def emit(self, line: str, path: str) -> None:
        self.deepest = max(self.deepest, self.indent)
        self.lines.append("    " * self.indent + line)
        self.paths.append(path)

    def var(self) -> str:
        return f"v{next(self.counter)}"

    def const(self, value: Any) -> str:
        name = f"_k{len(self.consts)}"
        self.consts[name] = value
        return name

    def resolve(self, t: Any) -> Any:
        return resolve_type(t, self.named, kinds=_COMPOSITE, unsupported=_Unsupported)

    def min_size(self, t: Any, seen: frozenset[str] = frozenset()) -> int:
        """The fewest bytes a value of ``t`` takes (bounds block counts by bytes left)."""
        t = self.resolve(t)
        if t == "null":
            return 0
        if t == "float":
            return 4
        if t == "double":
            return 8
        if isinstance(t, (str, list)):
            return 1
        kind = t["type"]
        if kind == "fixed":
            return int(t["size"])
        if kind in {"record", "error"}:
            if t["name"] in seen:
                raise _Unsupported(f"recursive type {t['name']!r}")
            return sum(self.min_size(f["type"], seen | {t["name"]}) for f in t["fields"])
        return 1  # enum index, array or map block count

    @staticmethod
    def field_names(record: dict[str, Any]) -> list[str]:
        names = [f["name"] for f in record["fields"]]
        if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise _Unsupported(f"field names {names!r}")
        return names

    # values

    def read(self, t: Any, target: str, path: str, *, preset: bool = False) -> None:
        """Emit code decoding one value of type ``t`` into ``target``.

        ``preset``: the target already holds None, so a null needs no store.
        """
        t = self.resolve(t)
        if isinstance(t, str):
            if t == "null":
                if not preset:
                    self.emit(f"{target} = None", path)
            else:
                getattr(self, f"_read_{t}")(target, path)
        elif isinstance(t, list):
            self._read_union(t, target, path, preset=preset)
        else:
            kind = t["type"]
            if kind in {"record", "error"}:
                self._read_record(t, target, path)
            elif kind == "enum":
                self._read_enum(t, target, path)
            elif kind == "fixed":
                self._read_fixed(t, target, path)
            elif kind == "array":
                self._read_array(t, target, path)
            else:
                self._read_map(t, target, path)

    def fields_into(self, fields: list[Any], path: str, sinks: list[str], *, preset: bool) -> None:
        """Emit the fields of a record, in order, into their sinks."""
        run: list[tuple[Any, str, str]] = []
        for f, sink in zip(fields, sinks, strict=True):
            t = self.resolve(f["type"])
            fpath = f"{path}.{f['name']}" if path else f["name"]
            if _is_nullable_union(t):
                run.append((t, sink, fpath))
                if len(run) == _NULL_RUN:
                    self._null_run(run, preset=preset)
                    run = []
                continue
            self._null_run(run, preset=preset)
            run = []
            self.read(t, sink, fpath)
        self._null_run(run, preset=preset)

    def _null_run(self, run: list[tuple[Any, str, str]], *, preset: bool) -> None:
        """Nullable fields in a row: one comparison when all of them are null.

        Most fields of an UPDATE are null, and a run of nulls is a run of zero bytes.
        """
        if len(run) > 1:
            zeros = self.const(bytes(len(run)))
            self.emit(f"if buf[pos:pos + {len(run)}] == {zeros}:", run[0][2])
            if preset:
                self.emit(f"    pos += {len(run)}", run[0][2])
            else:
                targets = " = ".join(sink for _, sink, _ in run)
                self.emit(f"    {targets} = None; pos += {len(run)}", run[0][2])
            self.emit("else:", run[0][2])
            self.indent += 1
        for t, sink, fpath in run:
            self.read(t, sink, fpath, preset=preset)
        if len(run) > 1:
            self.indent -= 1

    def _read_record(self, record: dict[str, Any], target: str, path: str) -> None:
        name = record["name"]
        if name in self.expanding:
            raise _Unsupported(f"recursive type {name!r}")
        self.expanding.append(name)
        names = self.field_names(record)
        tmp = self.var()
        self.emit(f"{tmp} = {self.const(dict.fromkeys(names))}.copy()", path)
        self.fields_into(record["fields"], path, [f"{tmp}[{n!r}]" for n in names], preset=True)
        self.emit(f"{target} = {tmp}", path)
        self.expanding.pop()

    def _read_boolean(self, target: str, path: str) -> None:
        self.emit("n = buf[pos]; pos += 1", path)
        self.emit(f"if n == 0: {target} = False", path)
        self.emit(f"elif n == 1: {target} = True", path)
        self.emit("else: _bad_bool(n)", path)

    def _varint_into(self, target: str, path: str, *, bits: int = 64) -> None:
        """A zigzag varint, unrolled inline: timestamps take 6 bytes, commit numbers 9."""
        self.emit("n = buf[pos]; pos += 1", path)
        groups = -(-bits // 7)  # 10 for a long, 5 for an int
        depth = self.indent
        for k in range(1, groups):
            self.emit(f"if {'n' if k == 1 else 'b'} > 127:", path)
            self.indent += 1
            if k == 1:
                self.emit("b = buf[pos]; pos += 1; n = (n & 127) | (b & 127) << 7", path)
            elif k < groups - 1:
                self.emit(f"b = buf[pos]; pos += 1; n |= (b & 127) << {7 * k}", path)
            else:
                # The last group holds only the bits left and no continuation bit.
                limit = (1 << (bits - 7 * k)) - 1
                self.emit(f"b = buf[pos]; pos += 1; n |= b << {7 * k}", path)
                self.emit(f"if b > {limit}: _bad_varint({bits})", path)
        self.indent = depth
        self.emit(f"{target} = (n >> 1) ^ -(n & 1)", path)

    def _read_int(self, target: str, path: str) -> None:
        self._varint_into(target, path, bits=32)

    def _read_long(self, target: str, path: str) -> None:
        self._varint_into(target, path)

    def _read_float(self, target: str, path: str) -> None:
        self.emit(f"{target} = _unpack_float(buf, pos)[0]; pos += 4", path)

    def _read_double(self, target: str, path: str) -> None:
        self.emit(f"{target} = _unpack_double(buf, pos)[0]; pos += 8", path)

    def _sized(self, target: str, path: str, conversion: str) -> None:
        # One even byte is a length below 64: almost every Salesforce string.
        self.emit("n = buf[pos]; pos += 1", path)
        self.emit("if n & 129: n, pos = _length(buf, pos, n)", path)
        self.emit("else: n >>= 1", path)
        self.emit("e = pos + n", path)
        self.emit("if e > ln: _bad_length(n, ln - pos)", path)
        self.emit(f"{target} = buf[pos:e]{conversion}; pos = e", path)

    def _read_string(self, target: str, path: str) -> None:
        self._sized(target, path, ".decode()")

    def _read_bytes(self, target: str, path: str) -> None:
        self._sized(target, path, "")

    def _read_fixed(self, t: dict[str, Any], target: str, path: str) -> None:
        size = int(t["size"])
        if size < 0:
            raise _Unsupported(f"fixed size {size}")
        self.emit(f"e = pos + {size}", path)
        self.emit(f"if e > ln: _bad_length({size}, ln - pos)", path)
        self.emit(f"{target} = buf[pos:e]; pos = e", path)

    def _read_enum(self, t: dict[str, Any], target: str, path: str) -> None:
        symbols = tuple(t["symbols"])
        if not symbols or not all(isinstance(s, str) for s in symbols):
            raise _Unsupported(f"enum symbols {symbols!r}")
        k = self.const(symbols)
        self._varint_into("n", path)
        self.emit(f"if n < 0 or n >= {len(symbols)}: _bad_enum(n, {len(symbols)})", path)
        self.emit(f"{target} = {k}[n]", path)

    def _blocks(self, item_min: int, tmp: str, empty: str, path: str) -> None:
        """Open the block loop of an array or map (closed by :meth:`_end_blocks`)."""
        if item_min < 1:
            raise _Unsupported("array or map of zero-width items")
        count = self.var()
        self.emit(f"{tmp} = {empty}", path)
        self.emit(f"{count} = buf[pos]; pos += 1", path)
        self.emit(f"while {count}:", path)
        self.indent += 1
        self.emit(f"if {count} & 129: {count}, pos = _count(buf, pos, {count})", path)
        self.emit(f"else: {count} >>= 1", path)
        left = "ln - pos" if item_min == 1 else f"(ln - pos) // {item_min}"
        self.emit(f"if {count} > {left}: _bad_block({count}, ln - pos)", path)
        self.emit(f"for _ in range({count}):", path)
        self.indent += 1
        self.counts.append(count)
        self.deepest_loops = max(self.deepest_loops, 2 * len(self.counts))

    def _end_blocks(self, path: str) -> None:
        self.indent -= 1
        count = self.counts.pop()
        self.emit(f"{count} = buf[pos]; pos += 1", path)
        self.indent -= 1

    def _read_array(self, t: dict[str, Any], target: str, path: str) -> None:
        item_path = f"{path}[]"
        tmp, item = self.var(), self.var()
        self._blocks(self.min_size(t["items"]), tmp, "[]", item_path)
        self.read(t["items"], item, item_path)
        self.emit(f"{tmp}.append({item})", item_path)
        self._end_blocks(item_path)
        self.emit(f"{target} = {tmp}", path)

    def _read_map(self, t: dict[str, Any], target: str, path: str) -> None:
        item_path = f"{path}{{}}"
        tmp, key, value = self.var(), self.var(), self.var()
        self._blocks(1 + self.min_size(t["values"]), tmp, "{}", item_path)
        self._read_string(key, item_path)
        self.read(t["values"], value, item_path)
        self.emit(f"{tmp}[{key}] = {value}", item_path)
        self._end_blocks(item_path)
        self.emit(f"{target} = {tmp}", path)

    def _read_union(self, branches: list[Any], target: str, path: str, *, preset: bool) -> None:
        if not branches:
            raise _Unsupported("empty union")
        self.emit("u = buf[pos]; pos += 1", path)
        # Null first: in an UPDATE most fields are the null branch.
        order = sorted(range(len(branches)), key=lambda j: branches[j] != "null")
        for n, j in enumerate(order):
            keyword = "if" if n == 0 else "elif"
            if branches[j] == "null" and preset:
                self.emit(f"{keyword} u == {2 * j}: pass", path)
                continue
            self.emit(f"{keyword} u == {2 * j}:", path)
            self.indent += 1
            self.read(branches[j], target, path)
            self.indent -= 1
        self.emit(f"else: _bad_union(u, {len(branches)})", path)

    # the top-level record

    def body(self) -> _Block:
        """The decoding of one whole payload, ending with the check for unread bytes.

        ``record`` mode fills ``r``, the record as fastavro returns it. ``event`` and
        ``batch`` modes put the header fields in locals; ``event`` fills ``r`` with the body
        fields, ``batch`` puts them in locals too.
        """
        root = self.root
        if root.get("type") not in {"record", "error"}:
            raise _Unsupported("top-level type is not a record")
        self.expanding.append(root["name"])
        fields = list(root["fields"])
        names = self.field_names(root)
        header: list[tuple[str, str]] = []
        body: list[tuple[str, str]] = []
        first = self.resolve(fields[0]["type"]) if fields else None
        split = (
            self.mode != "record"
            and names[:1] == [HEADER_FIELD]
            and isinstance(first, dict)
            and first["type"] == "record"
        )
        if split:
            assert isinstance(first, dict)
            header_names = self.field_names(first)
            header = [(n, self.var()) for n in header_names]
            self.expanding.append(first["name"])
            self.fields_into(first["fields"], HEADER_FIELD, [v for _, v in header], preset=False)
            self.expanding.pop()
            fields, names = fields[1:], names[1:]
        if self.mode == "batch":
            body = [(n, self.var()) for n in names]
            self.fields_into(fields, "", [v for _, v in body], preset=False)
        else:
            self.emit(f"r = {self.const(dict.fromkeys(names))}.copy()", "")
            self.fields_into(fields, "", [f"r[{n!r}]" for n in names], preset=True)
        arrays = frozenset(
            f["name"]
            for f in (first["fields"] if split and isinstance(first, dict) else [])
            if isinstance(self.resolve(f["type"]), dict)
            and self.resolve(f["type"])["type"] == "array"
        )
        self.emit("if pos != ln: _trailing(ln - pos)", "")
        self.expanding.pop()
        # CPython refuses more than 100 indentation levels and 20 nested loop/try blocks;
        # the wrappers add 3 and 2 of them.
        if self.deepest + 3 > _MAX_INDENT or self.deepest_loops + 2 > _MAX_BLOCKS:
            raise _Unsupported("schema nested too deeply for generated code")
        return _Block(self.lines, self.paths, header, body, split, arrays)


# --- assembling the generated functions -------------------------------------------------

_PROLOGUE = "if buf.__class__ is not bytes: buf = _as_bytes(buf)"


def _bitmap_lookups(block: _Block) -> tuple[list[str], list[str]]:
    """Code expanding the three bitmaps through the memo, and the three result expressions."""
    local = dict(block.header)
    lines: list[str] = []
    results: list[str] = []
    for i, name in enumerate(BITMAP_FIELDS):
        v = local.get(name)
        if v is None:
            results.append("()")
            continue
        x = f"x{i}"
        if name in block.arrays:
            lines.append(f"k = tuple({v}); {x} = _memo_get(k)")
            lines.append(f"if {x} is None: {x} = _expand(k)")
        else:  # not a plain array of strings: the expander checks what it got
            lines.append(f"{x} = _expand({v})")
        results.append(x)
    return lines, results


class _Source:
    """The generated source of one schema: up to three functions, each its own unit.

    ``record`` (decode_record: the record as fastavro returns it), ``event`` (decode_event:
    a ChangeEvent; only when the header has every field the view needs) and ``batch``
    (decode_batch: rows laid end to end for the columns). Each unit is compiled on first
    use, so a caller pays only for the form it uses.
    """

    def __init__(self, schema: EventSchema) -> None:
        self.consts: dict[str, Any] = {}
        record = _Generator(schema, self.consts, "record").body()
        event = _Generator(schema, self.consts, "event").body()
        batch = _Generator(schema, self.consts, "batch").body()
        self.header_names = [n for n, _ in batch.header]
        self.body_names = [n for n, _ in batch.body]
        self.units: dict[str, tuple[list[str], list[str]]] = {}
        self.lines: list[str] = []
        self.paths: list[str] = []

        self.add("def decode_record(buf):")
        self.add("    " + _PROLOGUE)
        self.add("    try:")
        self.add("        ln = len(buf); pos = 0")
        self.add_block(record, "        ")
        self.add("    except _Irregular:")
        self.add("        return _fallback(buf)")
        self.add("    except _LOW_LEVEL as exc:")
        self.add("        raise _fail(exc, buf) from exc")
        self.add("    return r")
        self.close("record")

        local = dict(event.header)
        if event.header_is_split and all(
            n in local for n in (*HEADER_VALUE_FIELDS, *BITMAP_FIELDS)
        ):
            self.add("def decode_event(buf):")
            self.add("    " + _PROLOGUE)
            self.add("    try:")
            self.add("        ln = len(buf); pos = 0")
            self.add_block(event, "        ")
            self.add("    except _Irregular:")
            self.add("        return _fallback_event(buf)")
            self.add("    except _LOW_LEVEL as exc:")
            self.add("        raise _fail(exc, buf) from exc")
            lookups, results = _bitmap_lookups(event)
            for line in lookups:
                self.add("    " + line)
            h = [local[n] for n in HEADER_VALUE_FIELDS]
            h[HEADER_VALUE_FIELDS.index("recordIds")] = f"tuple({local['recordIds']})"
            self.add(f"    return _Event(_schema_id, {', '.join([*h, *results])}, r)")
            self.close("event")

        self.add("def decode_batch(payloads, offset, flat, indexes, errors):")
        self.add("    flat_extend = flat.extend; indexes_append = indexes.append")
        self.add("    errors_append = errors.append")
        self.add("    for i, buf in enumerate(payloads, offset):")
        self.add("        try:")
        self.add("            " + _PROLOGUE)
        self.add("            ln = len(buf); pos = 0")
        self.add_block(batch, "            ")
        lookups, results = _bitmap_lookups(batch)
        for line in lookups:
            self.add("            " + line)
        self.add("        except _Irregular:")
        self.add("            try:")
        self.add("                row = _fallback_row(buf)")
        self.add("            except _DecodeError as exc:")
        self.add("                errors_append((i, str(exc))); continue")
        self.add("        except _LOW_LEVEL as exc:")
        self.add("            errors_append((i, str(_fail(exc, buf)))); continue")
        self.add("        except _DecodeError as exc:")
        self.add("            errors_append((i, str(exc))); continue")
        self.add("        else:")
        row = [v for _, v in batch.header] + [v for _, v in batch.body] + results
        self.add(f"            row = ({', '.join(row)},)")
        self.add("        flat_extend(row); indexes_append(i)")
        self.close("batch")

    def add(self, line: str, path: str = "") -> None:
        self.lines.append(line)
        self.paths.append(path)

    def add_block(self, block: _Block, pad: str) -> None:
        for line, path in zip(block.lines, block.paths, strict=True):
            self.add(pad + line, path)

    def close(self, variant: str) -> None:
        self.units[variant] = (self.lines, self.paths)
        self.lines, self.paths = [], []


class _Compiled:
    """A schema's generated decoders, each compiled on first use (thread-safe)."""

    def __init__(
        self, schema: EventSchema, expander: BitmapExpander, fallback: _FallbackDecoder
    ) -> None:
        src = _Source(schema)
        self.schema = schema
        self.units = src.units
        self.header_names = src.header_names
        self.body_names = src.body_names
        self.source = "\n\n".join("\n".join(lines) for lines, _ in self.units.values())
        self._functions: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._namespace: dict[str, Any] = {
            "_as_bytes": _as_bytes,
            "_length": _length,
            "_count": _count,
            "_unpack_float": _UNPACK_FLOAT,
            "_unpack_double": _UNPACK_DOUBLE,
            "_bad_union": _bad_union,
            "_bad_enum": _bad_enum,
            "_bad_bool": _bad_bool,
            "_bad_varint": _bad_varint,
            "_bad_length": _bad_length,
            "_bad_block": _bad_block,
            "_trailing": _trailing,
            "_Irregular": _Irregular,
            "_LOW_LEVEL": _LOW_LEVEL,
            "_DecodeError": DecodeError,
            "_fallback": fallback.decode,
            "_fallback_event": fallback.decode_event,
            "_fallback_row": fallback.row,
            "_memo_get": expander.memo.get,
            "_expand": expander.expand,
            "_Event": _MAKE_EVENT,
            "_schema_id": schema.schema_id,
            **src.consts,
        }

    def has(self, variant: str) -> bool:
        return variant in self.units

    def function(self, variant: str) -> Callable[..., Any]:
        fn = self._functions.get(variant)
        if fn is None:
            with self._lock:
                fn = self._functions.get(variant)
                if fn is None:
                    fn = self._functions[variant] = self._compile(variant)
        return fn

    def _compile(self, variant: str) -> Callable[..., Any]:
        lines, paths = self.units[variant]
        schema = self.schema
        filename = f"<sfcdc {variant} decoder {schema.name} {schema.schema_id} #{next(_serial)}>"
        text = "\n".join(lines)

        def fail(exc: BaseException, buf: bytes) -> DecodeError:
            line, pos = _locate(exc.__traceback__, filename)
            path = paths[line - 1] if line and 0 < line <= len(paths) else ""
            if isinstance(exc, _Corrupt):
                reason = str(exc)
            elif isinstance(exc, UnicodeDecodeError):
                reason = "invalid UTF-8 in a string"
            else:
                reason = "truncated: the payload ends before the value does"
            where = [f"field {path}"] if path else []
            if pos is not None:
                where.append(f"byte {pos}")
            place = f" ({', '.join(where)})" if where else ""
            return DecodeError(
                f"cannot decode a {len(buf)}-byte payload of {schema.name} "
                f"({schema.schema_id}): {reason}{place}"
            )

        namespace = {**self._namespace, "_fail": fail}
        code = compile(text, filename, "exec")
        # Registered so that tracebacks through generated code show its source.
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        exec(code, namespace)
        fn: Callable[..., Any] = namespace[f"decode_{variant}"]
        return fn


def _locate(tb: TracebackType | None, filename: str) -> tuple[int | None, int | None]:
    """Line and ``pos`` of the innermost generated frame in a traceback."""
    line: int | None = None
    pos: int | None = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename == filename:
            line = tb.tb_lineno
            value = frame.f_locals.get("pos")
            pos = value if isinstance(value, int) else None
        tb = tb.tb_next
    return line, pos


# --- fastavro, for what is not specialised and for irregular encodings -------------------


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


# --- public API --------------------------------------------------------------------------


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
