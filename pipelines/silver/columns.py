"""The columns of a silver table, derived from every schema version an object was written with.

A silver table is one object's events, typed. Its columns are the union of the fields of all
the object's schema versions in the schema registry (oldest version first, fields in schema
order, fields a later version adds at the end), so an event is decoded with its own writer
schema and lands in the same table as events written before or after a schema change. A new
field is a new column; nothing breaks.

Type mapping (from the field's Avro type and its ``doc`` annotation, see :mod:`ingest.schema`):

=====================================  =================  ====================================
Salesforce field                       Avro               silver column
=====================================  =================  ====================================
id, lookup, text, picklist, email ...  string             STRING
long / rich text area                  string             STRING (an UPDATE may carry a diff)
multi-select picklist                  string             STRING (``;``-separated)
checkbox                               boolean            BOOLEAN
number, currency, percent              double             DOUBLE
integer                                int                INT
Date (``Data:DateOnly``)               long (epoch ms)    DATE
DateTime (``*:DateTime``)              long (epoch ms)    TIMESTAMP (UTC instant)
Time (``Data:TimeOnly``)               long (ms of day)   STRING ``HH:mm:ss.SSS``
Address, Location, PersonName          record             STRUCT, or flattened ``Parent_Child``
Account ``Name`` (person accounts)     string | record    ``Name`` STRING + ``Name_PersonName``
=====================================  =================  ====================================

Delta Lake has no time-of-day type, so a Time field is text that sorts and compares like the
time it holds (``08:30:00.000``). Compound fields (Address, Location, PersonName) are STRUCT
columns by default (``BillingAddress.City``) or, per object, flattened into one column per
child (``BillingAddress_City``).

Account's ``Name`` is a three-way union when person accounts are enabled: a business account
writes the string branch, a person account the ``Switchable_PersonName`` record. Silver keeps
both: ``Name`` (STRING) holds the string branch and ``Name_PersonName`` (STRUCT, or
``Name_FirstName``... when flattened) the record branch; for any event at most one of them is
set. A change of ``Name`` (top-level bit) replaces both; a change of ``Name.FirstName`` (a
``1-0x..`` element) touches only that child. :meth:`SilverLayout.column_for` and
:meth:`SilverLayout.columns_for` tell gold where each changed field name lands, in both modes.

When two versions disagree on a field's type, the column takes a type that holds both: INT and
BIGINT widen to BIGINT, integers and DOUBLE to DOUBLE, DATE and TIMESTAMP to TIMESTAMP, and
anything else to STRING (values written as text).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from pyspark.sql import types as T

from ingest.schema import HEADER_FIELD, EventSchema, FieldInfo

__all__ = [
    "CDC_COLUMNS",
    "EPOCH_KINDS",
    "EVENT_COLUMNS",
    "ID_COLUMN",
    "PERSON_NAME_SUFFIX",
    "POLLED",
    "POLLED_DELETED",
    "CompoundMode",
    "FieldLayout",
    "LeafKind",
    "LeafLayout",
    "SilverLayout",
    "build_layout",
    "leaf_kind",
    "leaf_kind_of",
    "spark_type",
    "widen",
]

CompoundMode = Literal["struct", "flattened"]
LeafKind = Literal[
    "string", "boolean", "int", "long", "double", "date", "timestamp", "time", "binary", "json"
]
Shape = Literal["leaf", "struct", "switchable"]

ID_COLUMN = "Id"
PERSON_NAME_SUFFIX = "PersonName"
# The change types of rows read by a poll (objects without change events): a full record as
# Salesforce holds it, live or in the Recycle Bin. sfcdc's own words: no change event has them.
POLLED = "POLLED"
POLLED_DELETED = "POLLED_DELETED"

# The CDC header and sfcdc's own columns, in table order, after Id (change events only).
CDC_COLUMNS: tuple[tuple[str, T.DataType], ...] = (
    ("_cdc_change_type", T.StringType()),
    ("_cdc_entity", T.StringType()),
    ("_cdc_commit_timestamp", T.TimestampType()),
    ("_cdc_commit_number", T.LongType()),
    ("_cdc_transaction_key", T.StringType()),
    ("_cdc_sequence_number", T.IntegerType()),
    ("_cdc_commit_user", T.StringType()),
    ("_cdc_change_origin", T.StringType()),
    ("_cdc_event_id", T.StringType()),
    ("_cdc_replay_id", T.BinaryType()),
    ("_cdc_schema_id", T.StringType()),
    ("_cdc_changed_fields", T.ArrayType(T.StringType())),
    ("_cdc_nulled_fields", T.ArrayType(T.StringType())),
    ("_cdc_diff_fields", T.ArrayType(T.StringType())),
    ("_cdc_record_count", T.IntegerType()),
    ("_cdc_is_wildcard", T.BooleanType()),
    ("_cdc_bronze_batch_id", T.LongType()),
    ("_cdc_bronze_batch_seq", T.IntegerType()),
)
# What a platform event row carries besides its fields.
EVENT_COLUMNS: tuple[tuple[str, T.DataType], ...] = (
    ("_cdc_event_id", T.StringType()),
    ("_cdc_replay_id", T.BinaryType()),
    ("_cdc_schema_id", T.StringType()),
    ("_cdc_bronze_batch_id", T.LongType()),
    ("_cdc_bronze_batch_seq", T.IntegerType()),
)
_RESERVED_PREFIX = "_cdc_"

_SPARK: dict[str, T.DataType] = {
    "string": T.StringType(),
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "date": T.DateType(),
    "timestamp": T.TimestampType(),
    "time": T.StringType(),
    "binary": T.BinaryType(),
    "json": T.StringType(),
}
# Kinds that arrive as epoch milliseconds (or ms of the day) and are converted in Spark.
EPOCH_KINDS = frozenset({"date", "timestamp", "time"})
_NUMERIC_RANK = {"int": 0, "long": 1, "double": 2}


def spark_type(kind: LeafKind, *, raw: bool = False) -> T.DataType:
    """The silver column type of a leaf kind; ``raw`` is the type decoding produces (epoch
    milliseconds as BIGINT for dates, timestamps and times)."""
    if raw and kind in EPOCH_KINDS:
        return T.LongType()
    return _SPARK[kind]


def leaf_kind_of(data_type: T.DataType) -> LeafKind:
    """The leaf kind whose silver column has ``data_type`` (text for any other type)."""
    for kind, spark in _SPARK.items():
        if kind not in ("time", "json") and spark == data_type:
            return kind  # type: ignore[return-value]
    return "string"


def leaf_kind(info: FieldInfo) -> LeafKind:
    """The leaf kind of a non-record field (or of a compound's child)."""
    kind = info.kind
    if kind in ("id", "string", "long_text", "multi_picklist"):
        return "string"
    if kind == "datetime":
        return "timestamp"
    if kind in ("boolean", "int", "long", "double", "date", "time"):
        return kind
    value_type = info.value_type
    primitive = value_type.get("type") if isinstance(value_type, dict) else value_type
    if primitive in ("bytes", "fixed"):
        return "binary"
    if primitive in ("string", "enum"):
        return "string"
    if primitive == "float":
        return "double"
    return "json"


def widen(a: LeafKind, b: LeafKind) -> LeafKind:
    """A kind that holds values of both (see the module docstring)."""
    if a == b:
        return a
    if a in _NUMERIC_RANK and b in _NUMERIC_RANK:
        return a if _NUMERIC_RANK[a] > _NUMERIC_RANK[b] else b
    if {a, b} == {"date", "timestamp"}:
        return "timestamp"
    return "json" if "json" in (a, b) else "string"


@dataclass(frozen=True)
class LeafLayout:
    """A child of a compound field: its Avro name and kind."""

    name: str
    kind: LeafKind


@dataclass(frozen=True)
class FieldLayout:
    """One top-level field of the object across its schema versions.

    ``shape`` is ``leaf`` (a plain value of ``kind``), ``struct`` (Address, Location,
    PersonName: ``children``) or ``switchable`` (Account's ``Name``: a ``kind`` value or a
    ``children`` record).
    """

    name: str
    shape: Shape
    kind: LeafKind = "string"
    children: tuple[LeafLayout, ...] = ()

    @property
    def person_column(self) -> str:
        """The column holding the record branch of a switchable field (``Name_PersonName``)."""
        return f"{self.name}_{PERSON_NAME_SUFFIX}"

    def child_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.children)

    def child(self, name: str) -> LeafLayout:
        for c in self.children:
            if c.name == name:
                return c
        known = ", ".join(self.child_names()) or "none"
        raise KeyError(f"{self.name} has no child {name!r} (children: {known})")


def _struct(children: Sequence[LeafLayout], *, raw: bool) -> T.StructType:
    return T.StructType([T.StructField(c.name, spark_type(c.kind, raw=raw)) for c in children])


def _field_layout(info: FieldInfo) -> FieldLayout:
    if info.kind == "switchable_name":
        branches = info.value_type if isinstance(info.value_type, list) else [info.value_type]
        others = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "record")]
        kind: LeafKind = "string"
        if others and all(b in ("int", "long", "double", "float", "boolean") for b in others):
            kind = "json"  # never seen from Salesforce: keep the value as text
        return FieldLayout(info.name, "switchable", kind, _children(info.children))
    if info.children:  # compound (Address, Location, PersonName) or another nested record
        return FieldLayout(info.name, "struct", "string", _children(info.children))
    return FieldLayout(info.name, "leaf", leaf_kind(info))


def _children(children: Iterable[FieldInfo]) -> tuple[LeafLayout, ...]:
    out = []
    for c in children:
        # A record nested in a compound does not occur in Salesforce schemas; keep it as text.
        out.append(LeafLayout(c.name, "json" if c.children else leaf_kind(c)))
    return tuple(out)


def _merge_children(a: tuple[LeafLayout, ...], b: tuple[LeafLayout, ...]) -> tuple[LeafLayout, ...]:
    merged = {c.name: c for c in a}
    for c in b:
        old = merged.get(c.name)
        merged[c.name] = c if old is None else LeafLayout(c.name, widen(old.kind, c.kind))
    return tuple(merged.values())


def _merge(old: FieldLayout, new: FieldLayout) -> FieldLayout:
    if old.shape == new.shape == "leaf":
        return FieldLayout(old.name, "leaf", widen(old.kind, new.kind))
    if old.shape == new.shape:
        return FieldLayout(
            old.name,
            old.shape,
            widen(old.kind, new.kind),
            _merge_children(old.children, new.children),
        )
    if {old.shape, new.shape} == {"struct", "switchable"}:
        switchable = old if old.shape == "switchable" else new
        return FieldLayout(
            old.name,
            "switchable",
            switchable.kind,
            _merge_children(old.children, new.children),
        )
    # A value in one version and a record in another: keep both as JSON text.
    return FieldLayout(old.name, "leaf", "json")


@dataclass(frozen=True)
class SilverLayout:
    """The columns of one object's silver table and where each field name lands.

    Built by :func:`build_layout` from the object's schema versions. ``fields`` are the body
    fields (the header is not one of them); ``schema_ids`` the versions it covers.
    """

    entity: str
    change_events: bool
    fields: tuple[FieldLayout, ...]
    compounds: CompoundMode = "struct"
    schema_ids: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        reserved = {name.lower() for name, _ in (*CDC_COLUMNS, *EVENT_COLUMNS)}
        reserved.add(ID_COLUMN.lower())
        for name, source in self._column_sources():
            lower = name.lower()
            if lower in reserved or lower.startswith(_RESERVED_PREFIX):
                raise ValueError(
                    f"{self.entity}: field {source!r} would become column {name!r}, which sfcdc "
                    "reserves for its own columns"
                )
            if lower in seen:
                raise ValueError(
                    f"{self.entity}: fields {seen[lower]!r} and {source!r} both become column "
                    f"{name!r} (column names are case-insensitive in Delta); use "
                    "silver.compound_fields: struct for this object"
                )
            seen[lower] = source

    def _column_sources(self) -> Iterable[tuple[str, str]]:
        flat = self.compounds == "flattened"
        for f in self.fields:
            if f.shape == "leaf":
                yield f.name, f.name
            elif f.shape == "struct":
                if flat:
                    yield from ((f"{f.name}_{c.name}", f"{f.name}.{c.name}") for c in f.children)
                else:
                    yield f.name, f.name
            else:
                yield f.name, f.name
                if flat:
                    yield from ((f"{f.name}_{c.name}", f"{f.name}.{c.name}") for c in f.children)
                else:
                    yield f.person_column, f"{f.name} (record branch)"

    # ---------------------------------------------------------------- decoded (raw) form

    def raw_columns(self) -> tuple[tuple[str, T.DataType], ...]:
        """The decoded body columns: dates and times still epoch milliseconds (BIGINT),
        compounds as structs, a switchable field split into its two branches."""
        out: list[tuple[str, T.DataType]] = []
        for f in self.fields:
            if f.shape == "leaf":
                out.append((f.name, spark_type(f.kind, raw=True)))
            elif f.shape == "struct":
                out.append((f.name, _struct(f.children, raw=True)))
            else:
                out.append((f.name, spark_type(f.kind, raw=True)))
                out.append((f.person_column, _struct(f.children, raw=True)))
        return tuple(out)

    def raw_struct(self) -> T.StructType:
        """:meth:`raw_columns` as one struct (the shape the decoder emits per object)."""
        return T.StructType([T.StructField(n, t) for n, t in self.raw_columns()])

    # ------------------------------------------------------------------- silver form

    def field_columns(self) -> tuple[tuple[str, T.DataType], ...]:
        """The typed body columns of the silver table, in table order."""
        flat = self.compounds == "flattened"
        out: list[tuple[str, T.DataType]] = []
        for f in self.fields:
            if f.shape == "leaf":
                out.append((f.name, spark_type(f.kind)))
                continue
            if f.shape == "switchable":
                out.append((f.name, spark_type(f.kind)))
            if flat:
                out.extend((f"{f.name}_{c.name}", spark_type(c.kind)) for c in f.children)
            else:
                name = f.name if f.shape == "struct" else f.person_column
                out.append((name, _struct(f.children, raw=False)))
        return tuple(out)

    def metadata_columns(self) -> tuple[tuple[str, T.DataType], ...]:
        """``Id`` and the ``_cdc_*`` columns (change events) or the event columns."""
        if self.change_events:
            return ((ID_COLUMN, T.StringType()), *CDC_COLUMNS)
        return EVENT_COLUMNS

    def silver_schema(self) -> T.StructType:
        """The silver table's schema: metadata columns, then the fields."""
        return T.StructType(
            [T.StructField(n, t) for n, t in (*self.metadata_columns(), *self.field_columns())]
        )

    # ----------------------------------------------------------- field name -> column

    @cached_property
    def _by_name(self) -> Mapping[str, FieldLayout]:
        return {f.name: f for f in self.fields}

    def _field(self, path: str) -> tuple[FieldLayout, str | None]:
        if not isinstance(path, str) or not path:
            raise KeyError(f"a field name must be a non-empty str (got {path!r})")
        parent, dot, child = path.partition(".")
        f = self._by_name.get(parent)
        if f is None:
            raise KeyError(
                f"{self.entity} has no field {parent!r} in schema versions "
                f"{', '.join(self.schema_ids) or '(none)'}"
            )
        if not dot:
            return f, None
        if f.shape == "leaf":
            raise KeyError(f"{self.entity}.{parent} is not a compound field; {path!r} names none")
        f.child(child)
        return f, child

    def column_for(self, path: str) -> str:
        """Where a field name of ``changedFields`` / ``nulledFields`` / ``diffFields`` lands:
        a column (``Phone``, ``BillingAddress_City`` when flattened) or a struct member
        (``BillingAddress.City``, ``Name_PersonName.FirstName``).

        For a whole compound (``BillingAddress``) this is the struct column (struct mode) or
        raises (flattened: use :meth:`columns_for`); for Account's ``Name`` it is the string
        column. Raises ``KeyError`` for a name the object's schemas do not have.
        """
        f, child = self._field(path)
        flat = self.compounds == "flattened"
        if child is None:
            if f.shape == "struct" and flat:
                raise KeyError(
                    f"{self.entity}.{f.name} is flattened into several columns; "
                    "use columns_for() for the whole compound"
                )
            return f.name
        if flat:
            return f"{f.name}_{child}"
        base = f.name if f.shape == "struct" else f.person_column
        return f"{base}.{child}"

    def columns_for(self, path: str) -> tuple[str, ...]:
        """Every column (or struct member) a change of ``path`` sets, in table order.

        ``Phone`` -> ``("Phone",)``; ``BillingAddress`` -> ``("BillingAddress",)`` (struct)
        or each ``BillingAddress_<Child>`` (flattened); Account's ``Name`` ->
        ``("Name", "Name_PersonName")`` (struct) or ``Name`` and each ``Name_<Child>``
        (flattened); ``BillingAddress.City`` -> the one column of :meth:`column_for`.
        """
        f, child = self._field(path)
        if child is not None or f.shape == "leaf":
            return (self.column_for(path),)
        flat = self.compounds == "flattened"
        own = (f.name,) if f.shape == "switchable" else ()
        if flat:
            return (*own, *(f"{f.name}_{c.name}" for c in f.children))
        if f.shape == "struct":
            return (f.name,)
        return (f.name, f.person_column)

    def epoch_columns(self) -> dict[str, LeafKind]:
        """Top-level columns decoded as epoch milliseconds, with the kind they become."""
        return {f.name: f.kind for f in self.fields if f.shape == "leaf" and f.kind in EPOCH_KINDS}

    def nested_epoch_columns(self) -> dict[tuple[str, str], LeafKind]:
        """Struct members decoded as epoch milliseconds (none in Salesforce schemas)."""
        out: dict[tuple[str, str], LeafKind] = {}
        for f in self.fields:
            if f.shape == "leaf":
                continue
            struct = f.name if f.shape == "struct" else f.person_column
            for c in f.children:
                if c.kind in EPOCH_KINDS:
                    out[(struct, c.name)] = c.kind
        return out


def build_layout(
    entity: str,
    schemas: Sequence[EventSchema],
    *,
    compounds: CompoundMode = "struct",
) -> SilverLayout:
    """The silver layout of ``entity`` from its schema versions, oldest first.

    Raises ``ValueError`` when no version is given, when versions mix change events and
    platform events, or when two fields would become the same column.
    """
    if not schemas:
        raise ValueError(f"{entity}: no schema version to build the silver columns from")
    if compounds not in ("struct", "flattened"):
        raise ValueError(f"compounds must be 'struct' or 'flattened' (got {compounds!r})")
    kinds = {s.is_change_event for s in schemas}
    if len(kinds) > 1:
        raise ValueError(
            f"{entity}: schema versions mix change events and platform events "
            f"({', '.join(s.schema_id for s in schemas)})"
        )
    merged: dict[str, FieldLayout] = {}
    for schema in schemas:
        for info in schema.fields:
            if info.name == HEADER_FIELD and schema.is_change_event:
                continue
            new = _field_layout(info)
            old = merged.get(info.name)
            merged[info.name] = new if old is None else _merge(old, new)
    return SilverLayout(
        entity=entity,
        change_events=kinds.pop(),
        fields=tuple(merged.values()),
        compounds=compounds,
        schema_ids=tuple(s.schema_id for s in schemas),
    )
