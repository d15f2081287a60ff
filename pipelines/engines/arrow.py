"""Spark <-> Arrow <-> Delta types: the one mapping every engine uses.

Delta stores a table's schema as Spark's JSON schema format (``schemaString`` in the log), so
Delta <-> Spark is exact (:func:`spark_schema_from_delta_json`). Arrow sits between Spark and
delta-rs and is what the fast paths write, so Arrow <-> Spark is defined here once:

========================  ===========================  ==============================
Spark                     Arrow                        Delta
========================  ===========================  ==============================
string (char, varchar)    string                       string
binary                    binary                       binary
boolean                   bool                         boolean
byte / short / int / long int8 / int16 / int32 / int64 byte / short / integer / long
float / double            float32 / float64            float / double
decimal(p, s)             decimal128(p, s)             decimal(p,s)
date                      date32                       date
timestamp                 timestamp[us, tz=UTC]        timestamp
timestamp_ntz             timestamp[us]                timestamp_ntz
array<T>                  list<element: T>             array
map<K, V>                 map<K, V>                    map
struct<...>               struct<...>                  struct
========================  ===========================  ==============================

Arrow types without a Delta twin are widened when that loses nothing (``large_string``,
``string_view``, dictionaries, ``uint8``..``uint32``, other timestamp units and zones) and
refused otherwise (``uint64``, ``null``, time-of-day, durations), with the column named.

The local engine works in Arrow alone: :func:`delta_schema` (the Arrow types Delta stores for
an Arrow schema), :func:`arrow_schema_from_delta_json` (a table's schema from its log),
:func:`same_delta_type` and :func:`delta_type_name` need no Spark type, and neither do
:func:`normalize_arrow`, :func:`conform_to_schema` and :func:`fit_to_schema`. The Spark
functions (``spark_*``, ``arrow_*_to_spark``, :func:`same_type`) serve the spark engine and
the edges where a Spark schema comes in or goes out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import types as T

from ingest.errors import LakeError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "arrow_schema_from_delta_json",
    "arrow_schema_to_spark",
    "arrow_to_dataframe",
    "arrow_type_to_spark",
    "conform_to_schema",
    "dataframe_to_arrow",
    "delta_schema",
    "delta_type",
    "delta_type_name",
    "fit_to_schema",
    "normalize_arrow",
    "same_delta_type",
    "same_type",
    "spark_schema_from_delta_json",
    "spark_schema_to_arrow",
    "spark_type_to_arrow",
]

_SIMPLE_TO_ARROW: dict[type[T.DataType], pa.DataType] = {
    T.StringType: pa.string(),
    T.CharType: pa.string(),
    T.VarcharType: pa.string(),
    T.BinaryType: pa.binary(),
    T.BooleanType: pa.bool_(),
    T.ByteType: pa.int8(),
    T.ShortType: pa.int16(),
    T.IntegerType: pa.int32(),
    T.LongType: pa.int64(),
    T.FloatType: pa.float32(),
    T.DoubleType: pa.float64(),
    T.DateType: pa.date32(),
    # Delta timestamps are instants stored as UTC microseconds.
    T.TimestampType: pa.timestamp("us", tz="UTC"),
    T.TimestampNTZType: pa.timestamp("us"),
}


def spark_type_to_arrow(dt: T.DataType, *, column: str = "") -> pa.DataType:
    """The Arrow type Delta stores for a Spark type."""
    for spark_type, arrow_type in _SIMPLE_TO_ARROW.items():
        if isinstance(dt, spark_type):
            return arrow_type
    if isinstance(dt, T.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    if isinstance(dt, T.ArrayType):
        element = spark_type_to_arrow(dt.elementType, column=f"{column}[]")
        return pa.list_(pa.field("element", element, nullable=dt.containsNull))
    if isinstance(dt, T.MapType):
        key = spark_type_to_arrow(dt.keyType, column=f"{column}.key")
        value = spark_type_to_arrow(dt.valueType, column=f"{column}.value")
        return pa.map_(key, pa.field("value", value, nullable=dt.valueContainsNull))
    if isinstance(dt, T.StructType):
        return pa.struct(
            [
                pa.field(
                    f.name,
                    spark_type_to_arrow(f.dataType, column=_sub(column, f.name)),
                    nullable=f.nullable,
                )
                for f in dt.fields
            ]
        )
    raise LakeError(
        f"column {column or '?'!r}: Spark type {dt.simpleString()} has no Delta Lake equivalent "
        "(supported: string, binary, boolean, integers, float, double, decimal, date, "
        "timestamp, timestamp_ntz, array, map, struct)"
    )


def spark_schema_to_arrow(schema: T.StructType) -> pa.Schema:
    """Arrow schema of a Spark schema (nullability kept)."""
    return pa.schema(
        [
            pa.field(f.name, spark_type_to_arrow(f.dataType, column=f.name), nullable=f.nullable)
            for f in schema.fields
        ]
    )


def _sub(column: str, name: str) -> str:
    return f"{column}.{name}" if column else name


def arrow_type_to_spark(t: pa.DataType, *, column: str = "") -> T.DataType:
    """The Spark type of an Arrow type, widening where that loses nothing: the Spark type of
    the Arrow type Delta stores for it (:func:`delta_type`)."""
    return _spark_type_of_delta(delta_type(t, column=column))


def _spark_type_of_delta(t: pa.DataType) -> T.DataType:
    """The Spark type of an Arrow type :func:`delta_type` gives, one for one."""
    simple = _SPARK_OF_DELTA.get(t)
    if simple is not None:
        return simple
    types = pa.types
    if types.is_timestamp(t):
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if types.is_decimal(t):
        return T.DecimalType(t.precision, t.scale)
    if types.is_list(t):
        return T.ArrayType(_spark_type_of_delta(t.value_type), t.value_field.nullable)
    if types.is_map(t):
        return T.MapType(
            _spark_type_of_delta(t.key_type),
            _spark_type_of_delta(t.item_type),
            t.item_field.nullable,
        )
    assert types.is_struct(t), t
    return T.StructType(
        [
            T.StructField(f.name, _spark_type_of_delta(f.type), f.nullable)
            for f in (t.field(i) for i in range(t.num_fields))
        ]
    )


def arrow_schema_to_spark(schema: pa.Schema) -> T.StructType:
    """Spark schema of an Arrow schema (nullability kept)."""
    return T.StructType(
        [
            T.StructField(f.name, arrow_type_to_spark(f.type, column=f.name), f.nullable)
            for f in schema
        ]
    )


def spark_schema_from_delta_json(schema_json: str) -> T.StructType:
    """A Delta ``schemaString`` (as in the log's metaData action) to a Spark schema."""
    parsed = T.StructType.fromJson(json.loads(schema_json))
    assert isinstance(parsed, T.StructType)
    return parsed


# ------------------------------------------------------------------------ Arrow alone

_DELTA_INTS: dict[Any, pa.DataType] = {
    pa.int8(): pa.int8(),
    pa.int16(): pa.int16(),
    pa.int32(): pa.int32(),
    pa.int64(): pa.int64(),
    # Delta has no unsigned integers: widen to the next signed type that holds every value.
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.float16(): pa.float32(),
    pa.float32(): pa.float32(),
    pa.float64(): pa.float64(),
    pa.date32(): pa.date32(),
    pa.date64(): pa.date32(),
}


# The Spark type of each Arrow type delta_type gives that has no parameters.
_SPARK_OF_DELTA: dict[Any, T.DataType] = {
    pa.string(): T.StringType(),
    pa.binary(): T.BinaryType(),
    pa.bool_(): T.BooleanType(),
    pa.int8(): T.ByteType(),
    pa.int16(): T.ShortType(),
    pa.int32(): T.IntegerType(),
    pa.int64(): T.LongType(),
    pa.float32(): T.FloatType(),
    pa.float64(): T.DoubleType(),
    pa.date32(): T.DateType(),
}


def delta_type(t: pa.DataType, *, column: str = "") -> pa.DataType:
    """The Arrow type Delta stores for values of the Arrow type ``t``, widening where that
    loses nothing (the same as mapping ``t`` to Spark and back, without Spark)."""
    types = pa.types
    if types.is_string(t) or types.is_large_string(t) or types.is_string_view(t):
        return pa.string()
    if (
        types.is_binary(t)
        or types.is_large_binary(t)
        or types.is_binary_view(t)
        or types.is_fixed_size_binary(t)
    ):
        return pa.binary()
    if types.is_boolean(t):
        return pa.bool_()
    if t in _DELTA_INTS:
        return _DELTA_INTS[t]
    if types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC") if t.tz is not None else pa.timestamp("us")
    if types.is_decimal(t) and t.precision <= 38:
        return pa.decimal128(t.precision, t.scale)
    if types.is_dictionary(t):
        return delta_type(t.value_type, column=column)
    if (
        types.is_list(t)
        or types.is_large_list(t)
        or types.is_fixed_size_list(t)
        or types.is_list_view(t)
        or types.is_large_list_view(t)
    ):
        item = t.value_field
        element = delta_type(item.type, column=f"{column}[]")
        return pa.list_(pa.field("element", element, nullable=item.nullable))
    if types.is_map(t):
        key = delta_type(t.key_type, column=f"{column}.key")
        value = delta_type(t.item_type, column=f"{column}.value")
        return pa.map_(key, pa.field("value", value, nullable=t.item_field.nullable))
    if types.is_struct(t):
        return pa.struct(
            [
                pa.field(
                    t.field(i).name,
                    delta_type(t.field(i).type, column=_sub(column, t.field(i).name)),
                    nullable=t.field(i).nullable,
                )
                for i in range(t.num_fields)
            ]
        )
    advice = {
        "uint64": "cast it to int64 or decimal(20, 0) first",
        "null": "its values are all null so its type is unknown; give it a type",
    }.get(str(t), "convert it to a supported type first")
    raise LakeError(f"column {column or '?'!r}: Arrow type {t} has no Delta Lake type; {advice}")


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column in the Arrow type Delta stores for it (nullability kept,
    metadata dropped)."""
    return pa.schema(
        [pa.field(f.name, delta_type(f.type, column=f.name), nullable=f.nullable) for f in schema]
    )


_DELTA_NAMES: dict[Any, str] = {
    pa.string(): "string",
    pa.binary(): "binary",
    pa.bool_(): "boolean",
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.date32(): "date",
    pa.timestamp("us", tz="UTC"): "timestamp",
    pa.timestamp("us"): "timestamp_ntz",
}


def delta_type_name(t: pa.DataType) -> str:
    """The name of the Delta type an Arrow type is stored as, spelled as Spark SQL spells it
    (``bigint``, ``array<string>``, ``struct<City:string>``)."""
    t = delta_type(t)
    if t in _DELTA_NAMES:
        return _DELTA_NAMES[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t):
        return f"array<{delta_type_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{delta_type_name(t.key_type)},{delta_type_name(t.item_type)}>"
    fields = (t.field(i) for i in range(t.num_fields))
    return "struct<" + ",".join(f"{f.name}:{delta_type_name(f.type)}" for f in fields) + ">"


def same_delta_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether two Arrow types are stored as the same Delta type, ignoring nullability and
    field metadata (what :func:`same_type` says of their Spark types)."""
    return bool(_loose(delta_type(a)).equals(_loose(delta_type(b))))


def _loose(t: pa.DataType) -> pa.DataType:
    """A Delta Arrow type with every nested field nullable and without metadata."""
    if pa.types.is_list(t):
        return pa.list_(pa.field("element", _loose(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(_loose(t.key_type), pa.field("value", _loose(t.item_type)))
    if pa.types.is_struct(t):
        return pa.struct(
            [pa.field(t.field(i).name, _loose(t.field(i).type)) for i in range(t.num_fields)]
        )
    return t


_DELTA_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_DELTA_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")
_DELTA_CHARS = re.compile(r"(char|varchar)\(\s*\d+\s*\)")


def arrow_schema_from_delta_json(schema_json: str) -> pa.Schema:
    """A Delta ``schemaString`` (as in the log's metaData action) as the Arrow schema of the
    types Delta stores (what :func:`spark_schema_to_arrow` makes of its Spark schema)."""
    parsed = json.loads(schema_json)
    return pa.schema(
        [
            pa.field(f["name"], _delta_json_type(f["type"], f["name"]), nullable=f["nullable"])
            for f in parsed["fields"]
        ]
    )


def _delta_json_type(value: Any, column: str) -> pa.DataType:
    if isinstance(value, str):
        if value in _DELTA_PRIMITIVES:
            return _DELTA_PRIMITIVES[value]
        if value == "decimal":
            return pa.decimal128(10, 0)
        decimal = _DELTA_DECIMAL.fullmatch(value)
        if decimal is not None:
            return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
        if _DELTA_CHARS.fullmatch(value):
            return pa.string()
        name = value
    else:
        kind = value.get("type")
        if kind == "array":
            element = _delta_json_type(value["elementType"], f"{column}[]")
            return pa.list_(pa.field("element", element, nullable=value["containsNull"]))
        if kind == "map":
            key = _delta_json_type(value["keyType"], f"{column}.key")
            item = _delta_json_type(value["valueType"], f"{column}.value")
            return pa.map_(key, pa.field("value", item, nullable=value["valueContainsNull"]))
        if kind == "struct":
            return pa.struct(
                [
                    pa.field(
                        f["name"],
                        _delta_json_type(f["type"], _sub(column, f["name"])),
                        nullable=f["nullable"],
                    )
                    for f in value["fields"]
                ]
            )
        name = str(kind)
    raise LakeError(
        f"column {column or '?'!r}: Spark type {name} has no Delta Lake equivalent "
        "(supported: string, binary, boolean, integers, float, double, decimal, date, "
        "timestamp, timestamp_ntz, array, map, struct)"
    )


def _cast_column(column: pa.ChunkedArray, target: pa.DataType, name: str) -> pa.ChunkedArray:
    if column.type == target:
        return column
    try:
        return column.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise LakeError(
            f"column {name!r}: cannot store Arrow {column.type} as Delta "
            f"{delta_type_name(target)} without losing data ({exc})"
        ) from exc


def normalize_arrow(table: pa.Table) -> pa.Table:
    """``table`` with every column in the Arrow type Delta stores for it (see module doc)."""
    target = delta_schema(table.schema)
    if table.schema.equals(target, check_metadata=False):
        return table
    columns = [
        _cast_column(table.column(i), target.field(i).type, target.field(i).name)
        for i in range(table.num_columns)
    ]
    return pa.Table.from_arrays(columns, schema=target)


def conform_to_schema(
    table: pa.Table,
    target: pa.Schema,
    *,
    evolve: bool,
    table_name: str = "the table",
    fill_missing: bool = True,
) -> tuple[pa.Table, bool]:
    """Fit ``table`` to an existing table's Arrow schema.

    Columns are matched by name (case-insensitively, as Delta does, taking the table's
    spelling), cast to the table's types and put in the table's order; missing nullable
    columns are added as nulls when ``fill_missing`` (appends; a merge source keeps only its
    own columns). New columns (and new struct fields) are kept when ``evolve`` and refused
    otherwise. Returns the table and whether the table's schema has to grow.
    """
    table = normalize_arrow(table)
    by_lower = {name.lower(): i for i, name in enumerate(table.column_names)}
    used: set[int] = set()
    arrays: list[pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    grows = False
    for field in target:
        index = by_lower.get(field.name.lower())
        if index is None:
            if not fill_missing:
                continue
            if not field.nullable:
                raise LakeError(
                    f"column {field.name!r} is NOT NULL in {table_name} but missing from the data"
                )
            arrays.append(pa.chunked_array([pa.nulls(table.num_rows, field.type)]))
            fields.append(field)
            continue
        used.add(index)
        column = table.column(index)
        if column.type == field.type:
            arrays.append(column)
            fields.append(field.with_nullable(field.nullable or table.schema.field(index).nullable))
            continue
        added = _new_nested_fields(column.type, field.type, field.name)
        if added:
            # Casting would silently drop these struct fields: grow the table or refuse.
            if not evolve:
                raise LakeError(
                    f"the data has fields {table_name} does not have: {', '.join(added)}; "
                    "pass evolve_schema=True to add them"
                )
            arrays.append(column)
            fields.append(pa.field(field.name, column.type, nullable=True))
            grows = True
            continue
        try:
            arrays.append(column.cast(field.type, safe=True))
            fields.append(field)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            expected = delta_type_name(field.type)
            got = delta_type_name(column.type)
            raise LakeError(
                f"column {field.name!r}: {table_name} stores {expected}, the data has {got} "
                f"and cannot be cast without losing data ({exc})"
            ) from exc
    extra = [i for i in range(table.num_columns) if i not in used]
    if extra and not evolve:
        names = ", ".join(repr(table.column_names[i]) for i in extra)
        raise LakeError(
            f"the data has columns {table_name} does not have: {names}; "
            "pass evolve_schema=True to add them"
        )
    for i in extra:
        arrays.append(table.column(i))
        fields.append(table.schema.field(i))
        grows = True
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields)), grows


def fit_to_schema(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` as rows of ``target``: its columns by name (case-insensitively), in
    ``target``'s order and types (view and large types included), columns it lacks as nulls;
    nullability is ``target``'s where the data allows it."""
    if table.schema.equals(target, check_metadata=False):
        return table
    by_lower = {name.lower(): i for i, name in enumerate(table.column_names)}
    arrays = []
    fields = []
    for field in target:
        index = by_lower.get(field.name.lower())
        if index is None:
            arrays.append(pa.chunked_array([pa.nulls(table.num_rows, field.type)]))
            fields.append(field.with_nullable(True))
            continue
        column = table.column(index)
        arrays.append(
            column if column.type == field.type else _cast_column(column, field.type, field.name)
        )
        fields.append(
            field if field.nullable or column.null_count == 0 else field.with_nullable(True)
        )
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def same_type(a: T.DataType, b: T.DataType) -> bool:
    """Equal Spark types, ignoring nullability and field metadata."""
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and same_type(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True)
        )
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        return same_type(a.elementType, b.elementType)
    if isinstance(a, T.MapType) and isinstance(b, T.MapType):
        return same_type(a.keyType, b.keyType) and same_type(a.valueType, b.valueType)
    return a == b


def _new_nested_fields(have: pa.DataType, want: pa.DataType, path: str) -> list[str]:
    """Struct fields (at any depth) present in ``have`` but not in ``want``."""
    types = pa.types
    if types.is_struct(have) and types.is_struct(want):
        known = {want.field(i).name.lower(): want.field(i) for i in range(want.num_fields)}
        found: list[str] = []
        for i in range(have.num_fields):
            child = have.field(i)
            match = known.get(child.name.lower())
            sub = f"{path}.{child.name}"
            found.extend(
                [sub] if match is None else _new_nested_fields(child.type, match.type, sub)
            )
        return found
    if (types.is_list(have) or types.is_large_list(have)) and types.is_list(want):
        return _new_nested_fields(have.value_type, want.value_type, f"{path}[]")
    if types.is_map(have) and types.is_map(want):
        return _new_nested_fields(have.item_type, want.item_type, f"{path}{{}}")
    return []


def dataframe_to_arrow(df: DataFrame) -> pa.Table:
    """Collect a DataFrame to the driver as Arrow, in the types Delta stores."""
    to_arrow = getattr(df, "toArrow", None)
    if to_arrow is not None:  # Spark 4
        table = to_arrow()
    else:  # Spark 3.5 has no public Arrow collect
        collect: Any = getattr(df, "_collect_as_arrow", None)
        batches = collect()
        table = (
            pa.Table.from_batches(batches)
            if batches
            else spark_schema_to_arrow(df.schema).empty_table()
        )
    return normalize_arrow(table)


def arrow_to_dataframe(
    spark: SparkSession, table: pa.Table, schema: T.StructType | None = None
) -> DataFrame:
    """A DataFrame over an Arrow table (``schema`` defaults to the mapped Arrow schema)."""
    schema = schema or arrow_schema_to_spark(table.schema)
    table = _fit_names(normalize_arrow(table), schema.names)
    try:
        return spark.createDataFrame(table, schema=schema)
    except TypeError:  # Spark 3.5 takes Arrow data through pandas
        return spark.createDataFrame(table.to_pandas(), schema=schema)


def _fit_names(table: pa.Table, names: Sequence[str]) -> pa.Table:
    return table.select(list(names)) if table.column_names != list(names) else table
