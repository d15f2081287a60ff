"""The code generator: one Avro record schema turned into the straight-line Python source of
a decoding function's body.

Each value is read where it stands (the union byte, then the branch's value), runs of
nullable fields are checked for "all null" in one comparison, and every generated line
carries the field path it decodes, so a failure can be reported against its field. The
source calls the wire helpers of :mod:`ingest.decoding.avro_wire` by the names bound in the
namespace that :mod:`ingest.decoding.avro_compiled` compiles it in. Constructs it does not
specialise raise :class:`_Unsupported`, and fastavro decodes that schema instead.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Literal

from ingest.decoding.avro_types import resolve_type
from ingest.schema import HEADER_FIELD, EventSchema

__all__: list[str] = []

_NULL_RUN = 8  # nullable fields checked at once for "all null"
_MAX_INDENT = 95  # of CPython's 100
_MAX_BLOCKS = 19  # of CPython's 20

Mode = Literal["record", "event", "batch"]


_COMPOSITE = frozenset({"record", "error", "enum", "fixed", "array", "map"})


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
