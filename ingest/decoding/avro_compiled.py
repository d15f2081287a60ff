"""A schema's generated decoding functions: the generator's blocks assembled into up to three
functions (record, event, batch), each compiled on first use in a namespace that binds the
wire helpers, the fastavro fallback and the bitmap expander, and a failure inside one mapped
back from its traceback to the field and byte offset it happened at.
"""

from __future__ import annotations

import itertools
import linecache
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ingest.decoding.avro_codegen import _Block, _Generator
from ingest.decoding.avro_fallback import _FallbackDecoder
from ingest.decoding.avro_wire import (
    _LOW_LEVEL,
    _UNPACK_DOUBLE,
    _UNPACK_FLOAT,
    _as_bytes,
    _bad_block,
    _bad_bool,
    _bad_enum,
    _bad_length,
    _bad_union,
    _bad_varint,
    _Corrupt,
    _count,
    _Irregular,
    _length,
    _trailing,
)
from ingest.decoding.bitmap import BitmapExpander
from ingest.decoding.event import BITMAP_FIELDS, HEADER_VALUE_FIELDS, event_factory
from ingest.errors import DecodeError
from ingest.schema import EventSchema

__all__: list[str] = []

_serial = itertools.count(1)
_MAKE_EVENT = event_factory()

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
