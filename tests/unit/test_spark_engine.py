"""The spark engine without a JVM: names, SQL text and writer options, and auto-detection.
Its flows run on real delta-spark tables in tests/spark (test_engines.py and every
engine-parametrized test)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
from pyspark.sql import Row
from pyspark.sql import types as T

from ingest.errors import LakeError
from pipelines.engines import (
    LocalEngine,
    SparkEngine,
    TableRef,
    Txn,
    WriteLayout,
    delta_classes_present,
    detect_engine,
    make_engine,
)
from pipelines.engines.base import LakeEngine, encode_user_metadata
from pipelines.engines.spark_sql import (
    add_columns_sql,
    create_table_sql,
    history_entry,
    is_append_only,
    merge_condition,
    merge_counts,
    merge_sql,
    select_sql,
    set_properties_sql,
    write_options,
)
from pipelines.spec import LakeSpec, SchemasSpec

SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType(), False),
        T.StructField("payload", T.BinaryType()),
        T.StructField("received_at", T.TimestampType()),
    ]
)
BRONZE = TableRef("bronze", "account_change_event")


# ----------------------------------------------------------------------------- the fake


class FakeConf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class FakeSpark:
    """A session without a JVM (as over Spark Connect): only its settings are read here."""

    def __init__(self) -> None:
        self.conf = FakeConf()


@pytest.fixture
def spark() -> FakeSpark:
    return FakeSpark()


@pytest.fixture
def engine(spark: FakeSpark) -> Iterator[SparkEngine]:
    yield SparkEngine(spark, catalog="main", table_prefix="sf_")  # type: ignore[arg-type]


# ------------------------------------------------------------------- names and SQL text


def test_qualified_names(engine: SparkEngine) -> None:
    assert engine.qualified_name(BRONZE) == "`main`.`bronze`.`sf_account_change_event`"
    two_part = SparkEngine(FakeSpark(), location="/lake", schemas=SchemasSpec(gold="curated"))  # type: ignore[arg-type]
    assert two_part.qualified_name(TableRef("gold", "account")) == "`curated`.`account`"
    assert two_part.path(TableRef("gold", "account")) == "/lake/gold/account"
    with pytest.raises(LakeError, match="needs a catalog or a location"):
        SparkEngine(FakeSpark())  # type: ignore[arg-type]
    assert engine.schema_name("gold") == "`main`.`gold`"


def test_create_table_sql() -> None:
    assert create_table_sql("`c`.`s`.`t`", SCHEMA, {"delta.enableChangeDataFeed": "true"}) == (
        "CREATE TABLE IF NOT EXISTS `c`.`s`.`t` (`event_id` STRING NOT NULL, `payload` BINARY, "
        "`received_at` TIMESTAMP) USING DELTA TBLPROPERTIES "
        "('delta.enableChangeDataFeed' = 'true')"
    )
    assert create_table_sql("`s`.`t`", T.StructType([T.StructField("x", T.LongType())])) == (
        "CREATE TABLE IF NOT EXISTS `s`.`t` (`x` BIGINT) USING DELTA"
    )


def test_alter_sql() -> None:
    fields = [T.StructField("Rating", T.StringType(), False)]
    assert add_columns_sql("`s`.`t`", fields) == "ALTER TABLE `s`.`t` ADD COLUMNS (`Rating` STRING)"
    assert set_properties_sql("`s`.`t`", {"b": "2", "a": "it's"}) == (
        "ALTER TABLE `s`.`t` SET TBLPROPERTIES ('a' = 'it\\'s', 'b' = '2')"
    )


def test_write_options() -> None:
    # mergeSchema is always given: Delta falls back to the session's setting without it.
    assert write_options(None, None) == {"mergeSchema": "false"}
    options = write_options(Txn("bronze", 5), {"batch": "5"}, merge_schema=True)
    assert options == {
        "txnAppId": "bronze",
        "txnVersion": "5",
        "userMetadata": encode_user_metadata({"batch": "5"}, Txn("bronze", 5)),
        "mergeSchema": "true",
    }
    assert write_options(None, None, merge_schema=True, overwrite_schema=True) == {
        "overwriteSchema": "true"
    }


def test_write_layout_turns_dictionaries_off_per_column() -> None:
    options = write_options(None, None, layout=WriteLayout(distinct=("event_id", "payload")))
    assert options == {
        "parquet.enable.dictionary#event_id": "false",
        "parquet.enable.dictionary#payload": "false",
        "mergeSchema": "false",
    }


def test_select_sql_quotes_columns_and_renders_literals() -> None:
    assert select_sql("`bronze`.`sfcdc_checkpoints`", None) == (
        "SELECT * FROM `bronze`.`sfcdc_checkpoints`"
    )
    text = select_sql(
        "`bronze`.`t`",
        ["replay_id", "batch_seq"],
        [
            ("topic", "=", "/data/O'Brien__ChangeEvent"),
            ("batch_id", ">=", 7),
            ("replay_id", "=", b"\x00\x01\xff"),
            ("kind", "in", ["events", "keepalive"]),
            ("enabled", "!=", False),
        ],
    )
    assert text == (
        "SELECT `replay_id`, `batch_seq` FROM `bronze`.`t` WHERE "
        "`topic` = '/data/O\\'Brien__ChangeEvent' AND `batch_id` >= 7 AND "
        "`replay_id` = X'0001ff' AND `kind` IN ('events', 'keepalive') AND `enabled` != FALSE"
    )
    with pytest.raises(LakeError, match="op must be one of"):
        select_sql("`t`", None, [("a", "LIKE", "x")])  # type: ignore[list-item]


def test_merge_condition_quotes_keys() -> None:
    assert merge_condition(["Id", "we`ird"]) == (
        "target.`Id` = source.`Id` AND target.`we``ird` = source.`we``ird`"
    )
    with pytest.raises(LakeError):
        merge_condition("Id")


def test_merge_sql_uses_a_view_and_every_clause_asked_for() -> None:
    full = merge_sql(
        "delta.`/lake/gold/account`",
        "sfcdc_merge_source_1",
        on=["Id"],
        update_condition="source.ts > target.ts",
        delete_condition="source.deleted",
    )
    assert full == (
        "MERGE WITH SCHEMA EVOLUTION INTO delta.`/lake/gold/account` AS target USING "
        "`sfcdc_merge_source_1` AS source ON target.`Id` = source.`Id` "
        "WHEN MATCHED AND (source.deleted) THEN DELETE "
        "WHEN MATCHED AND (source.ts > target.ts) THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    plain = merge_sql("`t`", "v", on=["Id", "Ts"], insert=False, evolve_schema=False)
    assert plain == (
        "MERGE INTO `t` AS target USING `v` AS source ON target.`Id` = source.`Id` AND "
        "target.`Ts` = source.`Ts` WHEN MATCHED THEN UPDATE SET *"
    )
    with pytest.raises(LakeError, match="got 'Id', a str"):
        merge_sql("`t`", "v", on="Id")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("operation", "parameters", "metrics", "expected"),
    [
        ("WRITE", {"mode": "Append"}, {}, True),
        ("WRITE", {"mode": "Overwrite"}, {}, False),
        ("STREAMING UPDATE", {"outputMode": "Append"}, {}, True),
        ("STREAMING UPDATE", {"outputMode": "Complete"}, {}, False),
        ("MERGE", {}, {"numTargetRowsUpdated": "0", "numTargetRowsDeleted": "0"}, True),
        ("MERGE", {}, {"numTargetRowsUpdated": "3"}, False),
        ("OPTIMIZE", {}, {}, True),
        ("SET TBLPROPERTIES", {}, {}, True),
        ("DELETE", {}, {}, False),
        ("UPDATE", {}, {}, False),
        ("RESTORE", {}, {}, False),
        ("TRUNCATE", {}, {}, False),
        ("SOMETHING NEW", {}, {}, False),
    ],
)
def test_append_only_operations(operation: str, parameters, metrics, expected: bool) -> None:
    assert is_append_only(operation, parameters, metrics) is expected


def test_history_entry_from_a_describe_history_row() -> None:
    row = Row(
        version=12,
        timestamp=datetime(2024, 5, 1, 12, 0),
        operation="MERGE",
        operationParameters={"predicate": '["(target.Id = source.Id)"]'},
        operationMetrics={
            "numTargetRowsInserted": "3",
            "numTargetRowsUpdated": "2",
            "numTargetRowsDeleted": "1",
            "numSourceRows": "6",
        },
        userMetadata=encode_user_metadata({"run": "r1"}, Txn("gold:account", 9)),
    )
    entry = history_entry(row.asDict(recursive=True))
    assert entry.version == 12
    assert entry.timestamp.tzinfo is not None
    assert entry.metadata == {"run": "r1"}
    assert entry.txn == Txn("gold:account", 9)
    assert merge_counts(entry.metrics) == (3, 2, 1, 6)


# ---------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("databricks", "classes", "extensions", "expected"),
    [
        (True, False, "", "spark"),
        (False, True, "", "spark"),
        (False, False, "io.delta.sql.DeltaSparkSessionExtension", "local"),
        (False, None, "io.delta.sql.DeltaSparkSessionExtension", "spark"),
        (False, None, "", "local"),
    ],
)
def test_detect_engine(
    databricks: bool, classes: bool | None, extensions: str, expected: str
) -> None:
    assert (
        detect_engine(on_databricks=databricks, delta_classes=classes, sql_extensions=extensions)
        == expected
    )


def test_no_jvm_means_unknown(spark: FakeSpark) -> None:
    assert delta_classes_present(spark) is None  # type: ignore[arg-type]


def test_make_engine(spark: FakeSpark, tmp_path) -> None:
    lake = LakeSpec(engine="auto", location=str(tmp_path), catalog="main")
    on_databricks = make_engine(lake, spark, environ={"DATABRICKS_RUNTIME_VERSION": "15.4"})  # type: ignore[arg-type]
    assert isinstance(on_databricks, SparkEngine) and on_databricks.catalog == "main"
    plain = make_engine(lake, spark, environ={}, probe=lambda _s: False)  # type: ignore[arg-type]
    assert isinstance(plain, LocalEngine) and plain.location == tmp_path
    with_jar = make_engine(lake, spark, environ={}, probe=lambda _s: True)  # type: ignore[arg-type]
    assert isinstance(with_jar, SparkEngine)
    connect = make_engine(lake, spark, environ={}, probe=lambda _s: None)  # type: ignore[arg-type]
    assert isinstance(connect, LocalEngine)
    spark.conf.set("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    assert isinstance(make_engine(lake, spark, environ={}, probe=lambda _s: None), SparkEngine)  # type: ignore[arg-type]
    assert isinstance(make_engine(lake, None), LocalEngine)
    with pytest.raises(LakeError, match="needs a Spark session"):
        make_engine(LakeSpec(engine="spark"), None)
    for built in (on_databricks, plain):
        assert isinstance(built, LakeEngine)
