"""The Spark <-> Arrow <-> Delta type mapping and the SQL text the engines build (no JVM)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from ingest.errors import LakeError
from pipelines.engines.arrow import (
    arrow_schema_from_delta_json,
    arrow_schema_to_spark,
    arrow_type_to_spark,
    conform_to_schema,
    delta_schema,
    delta_type,
    delta_type_name,
    normalize_arrow,
    same_delta_type,
    same_type,
    spark_schema_from_delta_json,
    spark_schema_to_arrow,
    spark_type_to_arrow,
)
from pipelines.engines.base import (
    TableRef,
    Txn,
    decode_user_metadata,
    encode_user_metadata,
    merge_keys,
)
from pipelines.engines.sql import (
    column_list_ddl,
    conform_expression,
    quote_identifier,
    quote_string,
    spark_type_sql,
)

ADDRESS = T.StructType(
    [T.StructField("City", T.StringType()), T.StructField("Latitude", T.DoubleType())]
)

# Every Spark type the mapping supports, with the Arrow type Delta stores for it.
PAIRS: list[tuple[T.DataType, pa.DataType]] = [
    (T.StringType(), pa.string()),
    (T.BinaryType(), pa.binary()),
    (T.BooleanType(), pa.bool_()),
    (T.ByteType(), pa.int8()),
    (T.ShortType(), pa.int16()),
    (T.IntegerType(), pa.int32()),
    (T.LongType(), pa.int64()),
    (T.FloatType(), pa.float32()),
    (T.DoubleType(), pa.float64()),
    (T.DecimalType(18, 2), pa.decimal128(18, 2)),
    (T.DateType(), pa.date32()),
    (T.TimestampType(), pa.timestamp("us", tz="UTC")),
    (T.TimestampNTZType(), pa.timestamp("us")),
    (T.ArrayType(T.StringType(), True), pa.list_(pa.field("element", pa.string()))),
    (
        T.ArrayType(T.LongType(), False),
        pa.list_(pa.field("element", pa.int64(), nullable=False)),
    ),
    (
        T.MapType(T.StringType(), T.LongType(), True),
        pa.map_(pa.string(), pa.field("value", pa.int64())),
    ),
    (
        ADDRESS,
        pa.struct([pa.field("City", pa.string()), pa.field("Latitude", pa.float64())]),
    ),
]


@pytest.mark.parametrize(("spark", "arrow"), PAIRS, ids=str)
def test_mapping_round_trips(spark: T.DataType, arrow: pa.DataType) -> None:
    assert spark_type_to_arrow(spark) == arrow
    assert arrow_type_to_spark(arrow) == spark


@pytest.mark.parametrize(
    ("arrow", "spark"),
    [
        (pa.large_string(), T.StringType()),
        (pa.string_view(), T.StringType()),
        (pa.large_binary(), T.BinaryType()),
        (pa.binary(16), T.BinaryType()),
        (pa.uint8(), T.ShortType()),
        (pa.uint16(), T.IntegerType()),
        (pa.uint32(), T.LongType()),
        (pa.dictionary(pa.int32(), pa.string()), T.StringType()),
        (pa.timestamp("ms", tz="UTC"), T.TimestampType()),
        (pa.timestamp("ns", tz="Europe/Paris"), T.TimestampType()),
        (pa.timestamp("s"), T.TimestampNTZType()),
        (pa.date64(), T.DateType()),
        (pa.large_list(pa.int32()), T.ArrayType(T.IntegerType(), True)),
    ],
)
def test_arrow_types_widen_without_loss(arrow: pa.DataType, spark: T.DataType) -> None:
    assert arrow_type_to_spark(arrow) == spark


@pytest.mark.parametrize(
    ("arrow", "message"),
    [
        (pa.uint64(), "cast it to int64 or decimal(20, 0) first"),
        (pa.null(), "its values are all null so its type is unknown"),
        (pa.time32("ms"), "has no Delta Lake type"),
        (pa.duration("s"), "has no Delta Lake type"),
    ],
)
def test_arrow_types_without_delta_twin_are_refused(arrow: pa.DataType, message: str) -> None:
    with pytest.raises(LakeError, match="column 'c'") as info:
        arrow_schema_to_spark(pa.schema([pa.field("c", arrow)]))
    assert message in str(info.value)


def test_spark_types_without_delta_twin_are_refused() -> None:
    with pytest.raises(LakeError, match=r"column 'x': Spark type void has no Delta Lake"):
        spark_schema_to_arrow(T.StructType([T.StructField("x", T.NullType())]))


def test_nullability_survives_both_ways() -> None:
    spark = T.StructType(
        [
            T.StructField("Id", T.StringType(), False),
            T.StructField("Name", T.StringType(), True),
        ]
    )
    arrow = spark_schema_to_arrow(spark)
    assert [f.nullable for f in arrow] == [False, True]
    assert arrow_schema_to_spark(arrow) == spark


def test_delta_schema_json_is_spark_json() -> None:
    schema = T.StructType(
        [T.StructField(str(i), spark, True) for i, (spark, _arrow) in enumerate(PAIRS)]
    )
    assert spark_schema_from_delta_json(schema.json()) == schema
    # The Delta names of the types, as they appear in a table's schemaString.
    names = [f["type"] for f in json.loads(schema.json())["fields"]][:13]
    assert names == [
        "string", "binary", "boolean", "byte", "short", "integer", "long", "float", "double",
        "decimal(18,2)", "date", "timestamp", "timestamp_ntz",
    ]  # fmt: skip


def test_normalize_casts_to_delta_types() -> None:
    table = pa.table(
        {
            "s": pa.array(["a"], pa.large_string()),
            "u": pa.array([7], pa.uint32()),
            "t": pa.array([1_700_000_000_000], pa.timestamp("ms", tz="America/New_York")),
            "d": pa.array(["x"]).dictionary_encode(),
        }
    )
    out = normalize_arrow(table)
    assert out.schema == pa.schema(
        [
            ("s", pa.string()),
            ("u", pa.int64()),
            ("t", pa.timestamp("us", tz="UTC")),
            ("d", pa.string()),
        ]
    )
    assert out.column("t")[0].as_py() == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)


def test_normalize_refuses_lossy_timestamps() -> None:
    table = pa.table({"t": pa.array([1], pa.timestamp("ns", tz="UTC"))})
    with pytest.raises(LakeError, match="column 't': cannot store Arrow timestamp"):
        normalize_arrow(table)


def test_conform_reorders_casts_and_fills_missing_nullable_columns() -> None:
    target = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
    data = pa.table({"B": ["x"], "a": pa.array([1], pa.int32())})
    out, grows = conform_to_schema(data, target, evolve=False)
    assert not grows
    assert out.schema == target
    assert out.to_pylist() == [{"a": 1, "b": "x", "c": None}]


def test_conform_keeps_new_columns_only_when_evolving() -> None:
    target = pa.schema([("a", pa.int64())])
    data = pa.table({"a": [1], "z": ["new"]})
    out, grows = conform_to_schema(data, target, evolve=True)
    assert grows and out.column_names == ["a", "z"]
    with pytest.raises(LakeError, match=r"columns gold\.x does not have: 'z'; pass evolve_schema"):
        conform_to_schema(data, target, evolve=False, table_name="gold.x")


def test_conform_errors_name_the_column() -> None:
    with pytest.raises(LakeError, match="column 'a': t stores bigint, the data has string"):
        conform_to_schema(
            pa.table({"a": ["x"]}), pa.schema([("a", pa.int64())]), evolve=True, table_name="t"
        )
    required = pa.schema([pa.field("id", pa.string(), nullable=False)])
    with pytest.raises(LakeError, match="column 'id' is NOT NULL in t but missing"):
        conform_to_schema(pa.table({"b": [1]}), required, evolve=True, table_name="t")


def test_conform_without_filling_keeps_only_source_columns() -> None:
    target = pa.schema([("a", pa.int64()), ("b", pa.string())])
    out, _ = conform_to_schema(pa.table({"a": [1]}), target, evolve=False, fill_missing=False)
    assert out.column_names == ["a"]


def test_same_type_ignores_nullability() -> None:
    a = T.StructType([T.StructField("x", T.ArrayType(T.LongType(), True), True)])
    b = T.StructType([T.StructField("x", T.ArrayType(T.LongType(), False), False)])
    assert same_type(a, b)
    assert not same_type(a, T.StructType([T.StructField("y", T.ArrayType(T.LongType()))]))


# Arrow types as data arrive in them: the Arrow-alone functions must say of each what the
# Spark mapping says.
ARROW_TYPES: list[pa.DataType] = [
    *(arrow for _spark, arrow in PAIRS),
    pa.large_string(),
    pa.string_view(),
    pa.binary(16),
    pa.uint8(),
    pa.uint32(),
    pa.float16(),
    pa.date64(),
    pa.timestamp("ns", tz="Europe/Paris"),
    pa.timestamp("s"),
    pa.decimal256(38, 10),
    pa.dictionary(pa.int32(), pa.large_string()),
    pa.large_list(pa.field("x", pa.uint16(), nullable=False)),
    pa.list_(pa.int32(), 3),
    pa.map_(pa.large_string(), pa.field("v", pa.list_(pa.uint8()), nullable=False)),
    pa.struct(
        [
            pa.field("A", pa.int32(), nullable=False),
            pa.field("b", pa.struct([("c", pa.map_(pa.string(), pa.timestamp("ms")))])),
        ]
    ),
]


@pytest.mark.parametrize("arrow", ARROW_TYPES, ids=str)
def test_arrow_alone_agrees_with_the_spark_mapping(arrow: pa.DataType) -> None:
    spark = arrow_type_to_spark(arrow)
    assert delta_type(arrow) == spark_type_to_arrow(spark)
    assert delta_type_name(arrow) == spark.simpleString()
    schema = pa.schema([pa.field("c", arrow, nullable=False), pa.field("d", arrow)])
    stored = spark_schema_to_arrow(arrow_schema_to_spark(schema))
    assert delta_schema(schema).equals(stored)
    # A table's schema read from its log is the same Arrow schema.
    assert arrow_schema_from_delta_json(arrow_schema_to_spark(schema).json()).equals(stored)
    for other in ARROW_TYPES:
        assert same_delta_type(arrow, other) == same_type(spark, arrow_type_to_spark(other))


def test_arrow_alone_refuses_what_the_spark_mapping_refuses() -> None:
    with pytest.raises(LakeError, match=r"column 'c\[\]': Arrow type null has no Delta Lake"):
        delta_schema(pa.schema([pa.field("c", pa.list_(pa.null()))]))
    variant = '{"type":"struct","fields":[{"name":"v","type":"variant","nullable":true}]}'
    with pytest.raises(LakeError, match=r"column 'v': Spark type variant has no Delta Lake"):
        arrow_schema_from_delta_json(variant)


def test_delta_json_chars_and_bare_decimals() -> None:
    spark = T.StructType(
        [
            T.StructField("a", T.CharType(3)),
            T.StructField("b", T.VarcharType(4)),
            T.StructField("d", T.DecimalType()),
        ]
    )
    assert arrow_schema_from_delta_json(spark.json()) == pa.schema(
        [("a", pa.string()), ("b", pa.string()), ("d", pa.decimal128(10, 0))]
    )
    bare = '{"type":"struct","fields":[{"name":"d","type":"decimal","nullable":true}]}'
    assert arrow_schema_from_delta_json(bare) == pa.schema([("d", pa.decimal128(10, 0))])


# --------------------------------------------------------------------------------- SQL


def test_quoting() -> None:
    assert quote_identifier("Name") == "`Name`"
    assert quote_identifier("we`ird") == "`we``ird`"
    assert quote_string("it's a \\ test") == "'it\\'s a \\\\ test'"


def test_type_ddl_quotes_nested_names() -> None:
    dt = T.StructType(
        [
            T.StructField("Billing Address", ADDRESS, True),
            T.StructField("tags", T.ArrayType(T.StringType()), False),
            T.StructField("m", T.MapType(T.StringType(), T.DecimalType(10, 2))),
            T.StructField("at", T.TimestampNTZType()),
        ]
    )
    assert spark_type_sql(dt) == (
        "STRUCT<`Billing Address`: STRUCT<`City`: STRING, `Latitude`: DOUBLE>, "
        "`tags`: ARRAY<STRING> NOT NULL, `m`: MAP<STRING, DECIMAL(10,2)>, `at`: TIMESTAMP_NTZ>"
    )
    assert column_list_ddl(dt) == (
        "(`Billing Address` STRUCT<`City`: STRING, `Latitude`: DOUBLE>, `tags` ARRAY<STRING> "
        "NOT NULL, `m` MAP<STRING, DECIMAL(10,2)>, `at` TIMESTAMP_NTZ)"
    )


def test_conform_expression_rebuilds_evolved_structs() -> None:
    old = T.StructType([T.StructField("City", T.StringType())])
    assert conform_expression("`a`", ADDRESS, ADDRESS) == "`a`"
    assert conform_expression("`n`", T.IntegerType(), T.LongType()) == "CAST(`n` AS BIGINT)"
    assert conform_expression("", None, T.LongType()) == "CAST(NULL AS BIGINT)"
    assert conform_expression("`a`", old, ADDRESS) == (
        "CASE WHEN `a` IS NULL THEN NULL ELSE named_struct('City', `a`.`City`, "
        "'Latitude', CAST(NULL AS DOUBLE)) END"
    )
    assert conform_expression("`l`", T.ArrayType(old), T.ArrayType(ADDRESS)).startswith(
        "transform(`l`, x -> CASE WHEN x IS NULL"
    )


# ------------------------------------------------------------------------------ values


def test_table_ref_and_txn_validate() -> None:
    assert str(TableRef("gold", "account")) == "gold.account"
    with pytest.raises(ValueError, match="table layer must be one of bronze, silver, gold"):
        TableRef("platinum", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got 'x; DROP TABLE y'"):
        TableRef("gold", "x; DROP TABLE y")
    with pytest.raises(ValueError, match="txn version must be an integer >= 0"):
        Txn("app", -1)
    with pytest.raises(ValueError, match="non-empty string"):
        Txn("", 1)


def test_user_metadata_round_trip() -> None:
    text = encode_user_metadata({"batch": "7"}, Txn("bronze:/data/X", 42))
    assert json.loads(text or "") == {
        "batch": "7",
        "sfcdc.txn.app_id": "bronze:/data/X",
        "sfcdc.txn.version": "42",
    }
    assert decode_user_metadata(text) == ({"batch": "7"}, Txn("bronze:/data/X", 42))
    assert decode_user_metadata("written by someone else") == (
        {"userMetadata": "written by someone else"},
        None,
    )
    assert decode_user_metadata(None) == ({}, None)
    assert encode_user_metadata(None, None) is None
    with pytest.raises(LakeError, match="reserved"):
        encode_user_metadata({"sfcdc.txn.version": "1"}, None)
    with pytest.raises(LakeError, match="must map str to str"):
        encode_user_metadata({"n": 1}, None)  # type: ignore[dict-item]


def test_merge_keys_reject_a_bare_string() -> None:
    assert merge_keys(["Id"]) == ["Id"]
    with pytest.raises(LakeError, match="got 'Id', a str"):
        merge_keys("Id")
    with pytest.raises(LakeError, match="non-empty list"):
        merge_keys([])


def test_conform_never_drops_new_struct_fields() -> None:
    narrow = pa.struct([("x", pa.int64())])
    wide = pa.struct([("x", pa.int64()), ("y", pa.string())])
    target = pa.schema([("a", narrow), ("l", pa.list_(narrow))])
    data = pa.table(
        {
            "a": pa.array([{"x": 1, "y": "new"}], wide),
            "l": pa.array([[{"x": 2, "y": "deep"}]], pa.list_(wide)),
        }
    )
    out, grows = conform_to_schema(data, target, evolve=True)
    assert grows and out.to_pylist() == data.to_pylist()
    with pytest.raises(LakeError, match=r"fields t does not have: a\.y; pass evolve_schema"):
        conform_to_schema(data.select(["a"]), target, evolve=False, table_name="t")
    with pytest.raises(LakeError, match=r"l\[\]\.y"):
        conform_to_schema(data.select(["l"]), target, evolve=False, table_name="t")


@pytest.mark.parametrize(
    "name",
    [
        "pipelines.engines",
        "pipelines.engines.arrow",
        "pipelines.engines.base",
        "pipelines.engines.local",
        "pipelines.engines.local_maintenance",
        "pipelines.engines.local_reads",
        "pipelines.engines.local_sql",
        "pipelines.engines.local_tables",
        "pipelines.engines.local_writes",
        "pipelines.engines.spark",
        "pipelines.engines.spark_sql",
        "pipelines.engines.spark_tables",
        "pipelines.engines.spark_write",
        "pipelines.engines.sql",
    ],
)
def test_public_api_is_curated(name: str) -> None:
    import importlib

    module = importlib.import_module(name)
    assert len(set(module.__all__)) == len(module.__all__)
    for symbol in module.__all__:
        assert not symbol.startswith("_")
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"
