"""A fast Avro binary writer for the emulator's event schemas.

The emulator must produce tens of thousands of events per second, and
``fastavro.schemaless_writer`` spends 25-60 us of CPU per change event on these wide,
union-heavy records (it resolves every ``["null", T]`` union by validating the value against
each branch). :class:`AvroWriter` instead generates, once per schema, one Python function per
record type with the code for every field inlined, so writing an event costs a few
microseconds. Its output is byte-for-byte what ``fastavro.schemaless_writer`` writes for the
same schema and value; the test suite checks this on every generated event kind.

Values must have the Python types Avro decodes to (``None``, ``bool``, ``int``, ``float``,
``str``, ``bytes``, ``list``, ``dict``). A value of the wrong type, an int out of range, an
unknown enum symbol, a key that is not a field of its record, or a missing field without a
default raises ``TypeError``/``ValueError`` naming the field and what was expected; nothing is
coerced silently (ints are accepted for ``double``/``float``, as Avro promotes them).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from ingest.schema import EventSchema

__all__ = ["AvroWriter", "HeaderEncoder"]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_INT_RANGE = {"int": (-(2**31), 2**31), "long": (-(2**63), 2**63)}


_VARINTS: dict[int, bytes] = {}
_VARINT_CACHE_SIZE = 4096


def _varint(n: int) -> bytes:
    """Unsigned base-128 varint (the caller applies the zigzag).

    Large values repeat within a transaction (commitTimestamp, commitNumber, LastModifiedDate)
    and take up to ten loop rounds each, so recent encodings are cached.
    """
    cached = _VARINTS.get(n)
    if cached is not None:
        return cached
    out = bytearray()
    value = n
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    encoded = bytes(out)
    if len(_VARINTS) >= _VARINT_CACHE_SIZE:
        _VARINTS.clear()
    _VARINTS[n] = encoded
    return encoded


def _type_error(where: str, expected: str, value: Any) -> TypeError:
    return TypeError(
        f"{where}: expected a value for Avro {expected} (got {value!r}, a {type(value).__name__})"
    )


def _missing(where: str, name: str) -> ValueError:
    return ValueError(f"{where}: no value for field {name!r}, which has no default")


def _unknown_keys(where: str, keys: Any, known: frozenset[str]) -> ValueError:
    extra = sorted(str(k) for k in keys if k not in known)
    return ValueError(
        f"{where}: {', '.join(repr(k) for k in extra)} not a field of the record "
        f"(fields: {', '.join(sorted(known))})"
    )


def _union_index(kinds: tuple[str, ...], value: Any) -> int:
    wanted: tuple[str, ...]
    if value is None:
        wanted = ("null",)
    elif isinstance(value, bool):
        wanted = ("boolean",)
    elif isinstance(value, int):
        wanted = ("int", "long", "double", "float") if -(2**31) <= value < 2**31 else ("long",)
    elif isinstance(value, float):
        wanted = ("double", "float")
    elif isinstance(value, str):
        wanted = ("string", "enum")
    elif isinstance(value, bytes | bytearray):
        wanted = ("bytes",)
    elif isinstance(value, Mapping):
        wanted = ("record", "map")
    elif isinstance(value, list | tuple):
        wanted = ("array",)
    else:
        return -1
    for kind in wanted:
        if kind in kinds:
            return kinds.index(kind)
    return -1


class _Generator:
    """Emits the source of the writer functions of one schema."""

    def __init__(self) -> None:
        self.consts: dict[str, Any] = {
            "_varint": _varint,
            "_type_error": _type_error,
            "_missing": _missing,
            "_unknown_keys": _unknown_keys,
            "_union_index": _union_index,
            "_pack_double": struct.Struct("<d").pack,
            "_pack_float": struct.Struct("<f").pack,
            "_Mapping": Mapping,
            "_MISSING": object(),
        }
        self.named: dict[str, Mapping[str, Any]] = {}
        self.functions: dict[str, str] = {}
        self.sources: list[str] = []
        self._counter = 0

    def const(self, value: Any) -> str:
        self._counter += 1
        name = f"_c{self._counter}"
        self.consts[name] = value
        return name

    def var(self) -> str:
        self._counter += 1
        return f"v{self._counter}"

    @staticmethod
    def full_name(name: str, namespace: str) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def lookup(self, name: str, namespace: str) -> tuple[str, Mapping[str, Any]]:
        for candidate in (self.full_name(name, namespace), name):
            if candidate in self.named:
                return candidate, self.named[candidate]
        raise ValueError(f"unknown named Avro type {name!r}")

    def kind(self, t: Any, namespace: str) -> str:
        if isinstance(t, str):
            return t if t in _PRIMITIVES else str(self.lookup(t, namespace)[1]["type"])
        if isinstance(t, Mapping):
            return str(t["type"])
        return "union"

    def record(self, t: Mapping[str, Any], namespace: str) -> str:
        """Generate the record's function (once) and return its name."""
        own_namespace = str(t.get("namespace", namespace))
        full = self.full_name(str(t["name"]), own_namespace)
        if "." in full:
            own_namespace = full.rsplit(".", 1)[0]
        if full in self.functions:
            return self.functions[full]
        self.named[full] = t
        function = f"_w{len(self.functions)}"
        self.functions[full] = function
        known = frozenset(str(f["name"]) for f in t["fields"])
        where = self.const(full)
        lines = [
            f"def {function}(out, d, isinstance=isinstance, _varint=_varint):",
            "    append = out.append",
            "    if d.__class__ is not dict and not isinstance(d, _Mapping):",
            f"        raise _type_error({where}, 'record', d)",
            f"    if not {self.const(known)}.issuperset(d):",
            f"        raise _unknown_keys({where}, d, {self.const(known)})",
            "    get = d.get",
        ]
        for f in t["fields"]:
            name = str(f["name"])
            v = self.var()
            if "default" in f:
                default = f["default"]
                fallback = "None" if default is None else self.const(default)
                lines.append(f"    {v} = get({name!r}, {fallback})")
            else:
                lines.append(f"    {v} = get({name!r}, _MISSING)")
                lines.append(f"    if {v} is _MISSING:")
                lines.append(f"        raise _missing({where}, {name!r})")
            self.value(lines, v, f["type"], own_namespace, where=f"{full}.{name}", ind="    ")
        self.sources.append("\n".join(lines))
        return function

    def field_writers(self, t: Mapping[str, Any], namespace: str) -> list[str]:
        """One function per top-level field, writing that field's encoding (union index
        included) on its own; used to write records that are mostly nulls."""
        own_namespace = str(t.get("namespace", namespace))
        full = self.full_name(str(t["name"]), own_namespace)
        if "." in full:
            own_namespace = full.rsplit(".", 1)[0]
        names = []
        for i, f in enumerate(t["fields"]):
            function = f"_f{i}"
            lines = [
                f"def {function}(out, v, isinstance=isinstance, _varint=_varint):",
                "    append = out.append",
            ]
            self.value(
                lines, "v", f["type"], own_namespace, where=f"{full}.{f['name']}", ind="    "
            )
            self.sources.append("\n".join(lines))
            names.append(function)
        return names

    def value(
        self, lines: list[str], v: str, t: Any, namespace: str, *, where: str, ind: str
    ) -> None:
        """Append code writing variable ``v`` of Avro type ``t``."""
        if isinstance(t, list):
            self.union(lines, v, t, namespace, where=where, ind=ind)
            return
        if isinstance(t, str) and t not in _PRIMITIVES:
            _, named = self.lookup(t, namespace)
            t = named
        kind = t if isinstance(t, str) else str(t.get("type"))
        w = self.const(where)
        if isinstance(t, Mapping) and kind in _PRIMITIVES and "logicalType" in t:
            raise ValueError(f"{where}: logical types are not supported (got {dict(t)})")
        if kind == "null":
            lines.append(f"{ind}if {v} is not None:")
            lines.append(f"{ind}    raise _type_error({w}, 'null', {v})")
        elif kind == "boolean":
            lines.append(f"{ind}if {v} is True:")
            lines.append(f"{ind}    append(1)")
            lines.append(f"{ind}elif {v} is False:")
            lines.append(f"{ind}    append(0)")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    raise _type_error({w}, 'boolean', {v})")
        elif kind in ("int", "long"):
            low, high = _INT_RANGE[kind]
            lines.append(f"{ind}if {v}.__class__ is not int or not {low} <= {v} < {high}:")
            lines.append(f"{ind}    raise _type_error({w}, {kind!r}, {v})")
            lines.append(f"{ind}{v} = ({v} << 1) ^ ({v} >> 63)")
            lines.append(f"{ind}if {v} < 128:")
            lines.append(f"{ind}    append({v})")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    out += _varint({v})")
        elif kind in ("float", "double"):
            pack = "_pack_double" if kind == "double" else "_pack_float"
            lines.append(f"{ind}if {v}.__class__ is float or {v}.__class__ is int:")
            lines.append(f"{ind}    out += {pack}({v})")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    raise _type_error({w}, {kind!r}, {v})")
        elif kind in ("string", "bytes"):
            check = "str" if kind == "string" else "(bytes, bytearray)"
            lines.append(f"{ind}if not isinstance({v}, {check}):")
            lines.append(f"{ind}    raise _type_error({w}, {kind!r}, {v})")
            if kind == "string":
                lines.append(f"{ind}{v} = {v}.encode('utf-8')")
            n = self.var()
            lines.append(f"{ind}{n} = len({v}) << 1")
            lines.append(f"{ind}if {n} < 128:")
            lines.append(f"{ind}    append({n})")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    out += _varint({n})")
            lines.append(f"{ind}out += {v}")
        elif kind == "enum":
            assert isinstance(t, Mapping)
            self.named[self.full_name(str(t["name"]), str(t.get("namespace", namespace)))] = t
            symbols = {s: _varint(i << 1) for i, s in enumerate(t["symbols"])}
            table = self.const(symbols)
            encoded = self.var()
            lines.append(f"{ind}{encoded} = {table}.get({v}) if isinstance({v}, str) else None")
            lines.append(f"{ind}if {encoded} is None:")
            lines.append(f"{ind}    raise _type_error({w}, 'enum ' + repr(list({table})), {v})")
            lines.append(f"{ind}out += {encoded}")
        elif kind == "record":
            assert isinstance(t, Mapping)
            function = self.record(t, namespace)
            lines.append(f"{ind}{function}(out, {v})")
        elif kind in ("array", "map"):
            assert isinstance(t, Mapping)
            item = self.var()
            check = "(list, tuple)" if kind == "array" else "_Mapping"
            lines.append(f"{ind}if not isinstance({v}, {check}):")
            lines.append(f"{ind}    raise _type_error({w}, {kind!r}, {v})")
            lines.append(f"{ind}if {v}:")
            lines.append(f"{ind}    out += _varint(len({v}) << 1)")
            if kind == "array":
                lines.append(f"{ind}    for {item} in {v}:")
                self.value(
                    lines, item, t["items"], namespace, where=f"{where}[]", ind=ind + "        "
                )
            else:
                key = self.var()
                lines.append(f"{ind}    for {key}, {item} in {v}.items():")
                self.value(
                    lines, key, "string", namespace, where=f"{where} key", ind=ind + "        "
                )
                self.value(
                    lines, item, t["values"], namespace, where=f"{where}{{}}", ind=ind + "        "
                )
            lines.append(f"{ind}append(0)")
        else:
            raise ValueError(f"{where}: unsupported Avro type {t!r}")

    def union(
        self, lines: list[str], v: str, branches: list[Any], namespace: str, *, where: str, ind: str
    ) -> None:
        kinds = tuple(self.kind(b, namespace) for b in branches)
        if len(branches) == 2 and kinds[0] == "null":
            # ["null", T], the shape of every body field: None is one zero byte.
            lines.append(f"{ind}if {v} is None:")
            lines.append(f"{ind}    append(0)")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    append(2)")
            self.value(lines, v, branches[1], namespace, where=where, ind=ind + "    ")
            return
        index = self.var()
        lines.append(f"{ind}{index} = _union_index({self.const(kinds)}, {v})")
        lines.append(f"{ind}if {index} < 0:")
        expected = self.const(f"union {list(kinds)}")
        lines.append(f"{ind}    raise _type_error({self.const(where)}, {expected}, {v})")
        lines.append(f"{ind}append({index} << 1)")
        for i, branch in enumerate(branches):
            lines.append(f"{ind}{'if' if i == 0 else 'elif'} {index} == {i}:")
            if kinds[i] == "null":
                lines.append(f"{ind}    pass")
            else:
                self.value(lines, v, branch, namespace, where=where, ind=ind + "    ")


class AvroWriter:
    """Writes records of one schema in Avro binary (no container header, no schema).

    With ``first_field=k`` it writes only fields ``k..`` of the top-level record: an Avro record
    is the concatenation of its fields' encodings, so a caller that encodes the first ``k``
    fields itself (a change event header) prepends them to get the whole record.
    """

    def __init__(self, schema: EventSchema | Mapping[str, Any], *, first_field: int = 0) -> None:
        raw = schema.raw if isinstance(schema, EventSchema) else schema
        if not isinstance(raw, Mapping) or raw.get("type") != "record":
            raise ValueError(f"AvroWriter writes records (got a {type(raw).__name__} schema)")
        if first_field:
            raw = {**raw, "fields": list(raw["fields"])[first_field:]}
        generator = _Generator()
        entry = generator.record(raw, str(raw.get("namespace", "")))
        fields = list(raw["fields"])
        # A record whose fields are all ["null", ...] unions defaulting to null (a change event
        # body) can be written sparsely: one zero byte per null, the present values in order.
        self._sparse = all(
            isinstance(f["type"], list) and f["type"][0] == "null" and f.get("default", 0) is None
            for f in fields
        )
        field_functions = generator.field_writers(raw, "") if self._sparse else []
        namespace: dict[str, Any] = dict(generator.consts)
        source = "\n\n".join(generator.sources)
        # The source is generated above from the schema's structure; field names only ever appear
        # in it as repr() string literals, never as code.
        exec(compile(source, f"<avro writer {raw['name']}>", "exec"), namespace)
        self._write: Callable[[bytearray, Any], None] = namespace[entry]
        self._field_writers: list[Callable[[bytearray, Any], None]] = [
            namespace[f] for f in field_functions
        ]
        self._index = {str(f["name"]): i for i, f in enumerate(fields)}
        self._count = len(fields)
        self._zeros = bytes(len(fields))
        self._name = str(raw["name"])
        self._source = source

    def write(self, datum: Mapping[str, Any]) -> bytes:
        """The Avro binary encoding of ``datum``."""
        if self._sparse and isinstance(datum, dict) and len(datum) * 3 < self._count:
            return self._write_sparse(datum)
        out = bytearray()
        self._write(out, datum)
        return bytes(out)

    def _write_sparse(self, datum: dict[str, Any]) -> bytes:
        index = self._index
        try:
            present = sorted([(index[k], v) for k, v in datum.items() if v is not None])
        except KeyError:
            raise _unknown_keys(self._name, datum, frozenset(index)) from None
        out = bytearray()
        zeros = self._zeros
        writers = self._field_writers
        previous = 0
        for i, value in present:
            if i > previous:
                out += zeros[: i - previous]
            writers[i](out, value)
            previous = i + 1
        if previous < self._count:
            out += zeros[: self._count - previous]
        return bytes(out)


_SMALL_LONGS: tuple[bytes, ...] = tuple(bytes(((i << 1),)) for i in range(64))

_HEADER_LAYOUT = (
    ("entityName", "string"),
    ("recordIds", "strings"),
    ("changeType", "enum"),
    ("changeOrigin", "string"),
    ("transactionKey", "string"),
    ("sequenceNumber", "int"),
    ("commitTimestamp", "long"),
    ("commitNumber", "long"),
    ("commitUser", "string"),
    ("nulledFields", "strings"),
    ("diffFields", "strings"),
    ("changedFields", "strings"),
)


class HeaderEncoder:
    """Encodes the pieces of a ``ChangeEventHeader`` laid out as Salesforce serves it.

    The header is a record, so its encoding is the concatenation of its twelve fields'
    encodings; a generator can encode the per-transaction ones (origin, key, commit time,
    number and user) once and join them with the per-event ones. :meth:`for_schema` returns
    ``None`` for a header with any other layout.
    """

    def __init__(self, symbols: tuple[str, ...]) -> None:
        self._change_types = {s: _varint(i << 1) for i, s in enumerate(symbols)}

    @classmethod
    def for_schema(cls, schema: EventSchema) -> HeaderEncoder | None:
        if not schema.is_change_event:
            return None
        header = schema.fields[0]
        layout = []
        symbols: tuple[str, ...] = ()
        for child in header.children:
            t = child.value_type
            if isinstance(t, Mapping) and t.get("type") == "array" and t.get("items") == "string":
                layout.append((child.name, "strings"))
            elif isinstance(t, Mapping) and t.get("type") == "enum":
                layout.append((child.name, "enum"))
                symbols = tuple(t["symbols"])
            else:
                layout.append((child.name, str(t)))
        if tuple(layout) != _HEADER_LAYOUT or any(c.nullable for c in header.children):
            return None
        return cls(symbols)

    @staticmethod
    def string(value: str) -> bytes:
        data = value.encode("utf-8")
        return _varint(len(data) << 1) + data

    @staticmethod
    def long(value: int) -> bytes:
        if value.__class__ is int and 0 <= value < 64:
            return _SMALL_LONGS[value]
        if value.__class__ is not int or not -(2**63) <= value < 2**63:
            raise _type_error("ChangeEventHeader", "long", value)
        return _varint((value << 1) ^ (value >> 63))

    @staticmethod
    def strings(values: Any) -> bytes:
        if not values:
            return b"\x00"
        if len(values) == 1:
            data: bytes = values[0].encode("utf-8")
            if len(data) < 64:
                # One record id: the common case, written without a loop.
                return b"\x02" + _SMALL_LONGS[len(data)] + data + b"\x00"
        parts = [_varint(len(values) << 1)]
        for value in values:
            data = value.encode("utf-8")
            parts.append(_varint(len(data) << 1))
            parts.append(data)
        parts.append(b"\x00")
        return b"".join(parts)

    def change_type(self, name: str) -> bytes:
        try:
            return self._change_types[name]
        except KeyError:
            raise TypeError(
                f"ChangeEventHeader.changeType: expected one of {list(self._change_types)} "
                f"(got {name!r})"
            ) from None
