"""The spark engine without a Delta jar: names, SQL and options, auto-detection, and its flows
against a fake session that speaks the part of PySpark's API the engine uses (SQL text in,
Rows out; a DataFrameWriter that commits to a fake Delta history)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
from pipelines.engines.spark import (
    add_columns_sql,
    create_table_sql,
    history_entry,
    is_append_only,
    merge_condition,
    merge_counts,
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


@dataclass
class FakeTable:
    schema: T.StructType
    properties: dict[str, str]
    history: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    txns: dict[str, int] = field(default_factory=dict)  # what Delta's log records

    def commit(self, operation: str, **info: Any) -> None:
        self.history.append(
            {
                "version": len(self.history),
                "timestamp": datetime(2024, 5, 1, 12, 0, len(self.history)),
                "operation": operation,
                "operationParameters": info.get("parameters", {}),
                "operationMetrics": info.get("metrics", {}),
                "userMetadata": info.get("user_metadata"),
            }
        )


class FakeConf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.seen: list[dict[str, str]] = []

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class FakeCatalog:
    def __init__(self, spark: FakeSpark) -> None:
        self._spark = spark

    def tableExists(self, name: str) -> bool:
        return name in self._spark.tables


class FakeResult:
    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def collect(self) -> list[Row]:
        return self._rows


class FakeDataFrame:
    def __init__(self, spark: FakeSpark, schema: T.StructType, rows: int = 0) -> None:
        self.sparkSession = spark
        self.schema = schema
        self.rows = rows
        self.ops: list[tuple[str, Any]] = []

    @property
    def write(self) -> FakeWriter:
        return FakeWriter(self)

    def alias(self, name: str) -> FakeDataFrame:
        return self

    def where(self, condition: str) -> FakeDataFrame:
        self.ops.append(("where", condition))
        return self

    def drop(self, *columns: str) -> FakeDataFrame:
        self.ops.append(("drop", columns))
        return self

    def limit(self, n: int) -> FakeDataFrame:
        self.ops.append(("limit", n))
        return self


class FakeWriter:
    """DataFrameWriter that commits like Delta: a txn already in the log is skipped."""

    def __init__(self, df: FakeDataFrame) -> None:
        self._df = df
        self.options: dict[str, str] = {}
        self._mode = "error"
        self._format = ""

    def format(self, name: str) -> FakeWriter:
        self._format = name
        return self

    def mode(self, mode: str) -> FakeWriter:
        self._mode = mode
        return self

    def option(self, key: str, value: str) -> FakeWriter:
        self.options[key] = value
        return self

    def saveAsTable(self, name: str) -> None:
        spark = self._df.sparkSession
        spark.writes.append((name, self._format, self._mode, dict(self.options)))
        table = spark.tables[spark.unquote(name)]
        app, version = self.options.get("txnAppId"), self.options.get("txnVersion")
        if app is not None and version is not None:
            if int(version) <= table.txns.get(app, -1):
                return
            table.txns[app] = int(version)
        table.commit(
            "WRITE",
            parameters={"mode": self._mode.capitalize()},
            metrics={"numOutputRows": str(self._df.rows)},
            user_metadata=self.options.get("userMetadata"),
        )


class FakeReader:
    def __init__(self, spark: FakeSpark) -> None:
        self._spark = spark
        self.options: dict[str, str] = {}

    def format(self, name: str) -> FakeReader:
        self.options["format"] = name
        return self

    def option(self, key: str, value: str) -> FakeReader:
        self.options[key] = value
        return self

    def table(self, name: str) -> FakeDataFrame:
        self._spark.reads.append((name, dict(self.options)))
        return FakeDataFrame(self._spark, self._spark.tables[self._spark.unquote(name)].schema)


class FakeSpark:
    """The slice of SparkSession the spark engine calls, over an in-memory Delta catalog."""

    def __init__(self) -> None:
        self.tables: dict[str, FakeTable] = {}
        self.statements: list[str] = []
        self.writes: list[tuple[str, str, str, dict[str, str]]] = []
        self.reads: list[tuple[str, dict[str, str]]] = []
        self.conf = FakeConf()
        self.catalog = FakeCatalog(self)
        self.optimize_metrics = {"numFilesAdded": 1, "numFilesRemoved": 7}

    @staticmethod
    def unquote(name: str) -> str:
        return name.replace("`", "")

    @property
    def read(self) -> FakeReader:
        return FakeReader(self)

    def table(self, name: str) -> FakeDataFrame:
        return FakeDataFrame(self, self.tables[self.unquote(name)].schema)

    def sql(self, text: str) -> FakeResult | FakeDataFrame:
        self.statements.append(text)
        self.conf.seen.append(dict(self.conf.values))
        words = text.split()
        if text.startswith("DESCRIBE HISTORY"):
            table = self.tables[self.unquote(words[2])]
            rows = list(reversed(table.history))
            if "LIMIT" in words:
                rows = rows[: int(words[-1])]
            return FakeResult([Row(**r) for r in rows])
        if text.startswith("SHOW TBLPROPERTIES"):
            props = self.tables[self.unquote(words[2])].properties
            return FakeResult([Row(key=k, value=v) for k, v in props.items()])
        if text.startswith("CREATE TABLE IF NOT EXISTS"):
            name = self.unquote(words[5])
            props = {}
            if "TBLPROPERTIES" in text:
                inner = text.split("TBLPROPERTIES (", 1)[1].rstrip(")")
                for pair in inner.split(", "):
                    key, value = pair.split(" = ")
                    props[key.strip("'")] = value.strip("'")
            self.tables[name] = FakeTable(SCHEMA, props)
            self.tables[name].commit("CREATE TABLE")
            return FakeResult([])
        if text.startswith("OPTIMIZE"):
            self.tables[self.unquote(words[1])].commit("OPTIMIZE")
            return FakeResult([Row(path="/x", metrics=Row(**self.optimize_metrics))])
        if text.startswith("SELECT"):
            return FakeDataFrame(self, self.tables[self.unquote(words[3])].schema)
        return FakeResult([])


@pytest.fixture
def spark() -> FakeSpark:
    return FakeSpark()


@pytest.fixture
def engine(spark: FakeSpark) -> Iterator[SparkEngine]:
    yield SparkEngine(spark, catalog="main", table_prefix="sf_")  # type: ignore[arg-type]


# ------------------------------------------------------------------- names and SQL text


def test_qualified_names(engine: SparkEngine) -> None:
    assert engine.qualified_name(BRONZE) == "`main`.`bronze`.`sf_account_change_event`"
    two_part = SparkEngine(FakeSpark(), schemas=SchemasSpec(gold="curated"))  # type: ignore[arg-type]
    assert two_part.qualified_name(TableRef("gold", "account")) == "`curated`.`account`"
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
    assert write_options(None, None) == {}
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


# -------------------------------------------------------------------------------- flows


def test_ensure_table_creates_schema_and_table_with_change_data_feed(
    engine: SparkEngine, spark: FakeSpark
) -> None:
    engine.ensure_table(BRONZE, SCHEMA, properties={"delta.appendOnly": "true"})
    assert spark.statements == [
        "CREATE SCHEMA IF NOT EXISTS `main`.`bronze`",
        create_table_sql(
            "`main`.`bronze`.`sf_account_change_event`",
            SCHEMA,
            {"delta.enableChangeDataFeed": "true", "delta.appendOnly": "true"},
        ),
    ]
    assert engine.version(BRONZE) == 0


def test_ensure_table_evolves_an_existing_table(engine: SparkEngine, spark: FakeSpark) -> None:
    engine.ensure_table(BRONZE, SCHEMA)
    spark.statements.clear()
    wider = T.StructType([*SCHEMA.fields, T.StructField("batch", T.LongType())])
    engine.ensure_table(BRONZE, wider, properties={"delta.logRetentionDuration": "interval 7 days"})
    assert [s for s in spark.statements if s.startswith("ALTER")] == [
        "ALTER TABLE `main`.`bronze`.`sf_account_change_event` ADD COLUMNS (`batch` BIGINT)",
        "ALTER TABLE `main`.`bronze`.`sf_account_change_event` SET TBLPROPERTIES "
        "('delta.logRetentionDuration' = 'interval 7 days')",
    ]
    clashing = T.StructType([T.StructField("payload", T.StringType())])
    with pytest.raises(LakeError, match=r"column 'payload' of .* is binary, not string"):
        engine.ensure_table(BRONZE, clashing)


def test_append_with_txn_is_idempotent(engine: SparkEngine, spark: FakeSpark) -> None:
    df = FakeDataFrame(spark, SCHEMA, rows=3)
    first = engine.append(BRONZE, df, txn=Txn("bronze", 1), metadata={"batch": "1"})  # type: ignore[arg-type]
    assert (first.version, first.skipped, first.rows) == (1, False, 3)
    name, fmt, mode, options = spark.writes[0]
    assert (name, fmt, mode) == ("`main`.`bronze`.`sf_account_change_event`", "delta", "append")
    assert options == write_options(Txn("bronze", 1), {"batch": "1"}, merge_schema=True)

    again = engine.append(BRONZE, df, txn=Txn("bronze", 1))  # type: ignore[arg-type]
    assert again.skipped and len(spark.writes) == 1

    # A new process learns the recorded txn from the table history.
    fresh = SparkEngine(spark, catalog="main", table_prefix="sf_")  # type: ignore[arg-type]
    assert fresh.txn_version(BRONZE, "bronze") == 1
    assert fresh.append(BRONZE, df, txn=Txn("bronze", 0)).skipped  # type: ignore[arg-type]
    assert fresh.append(BRONZE, df, txn=Txn("bronze", 2)).version == 2  # type: ignore[arg-type]


def test_delta_skipping_a_duplicate_is_reported_as_skipped(
    engine: SparkEngine, spark: FakeSpark
) -> None:
    engine.ensure_table(BRONZE, SCHEMA)
    # Another writer committed txn 4 without our commit metadata: only Delta knows.
    spark.tables["main.bronze.sf_account_change_event"].txns["bronze"] = 4
    result = engine.append(BRONZE, FakeDataFrame(spark, SCHEMA, 2), txn=Txn("bronze", 4))  # type: ignore[arg-type]
    assert result.skipped and result.version == 0


def test_read_appends_uses_the_change_data_feed(engine: SparkEngine, spark: FakeSpark) -> None:
    engine.ensure_table(BRONZE, SCHEMA)
    for version in (1, 2, 3):
        engine.append(BRONZE, FakeDataFrame(spark, SCHEMA, 1), txn=Txn("b", version))  # type: ignore[arg-type]
    engine.maintain(BRONZE)  # OPTIMIZE adds no rows
    changes = engine.read_appends(BRONZE, after_version=1)
    assert (changes.start_version, changes.end_version, changes.full_read) == (2, 4, False)
    name, options = spark.reads[-1]
    assert name == "`main`.`bronze`.`sf_account_change_event`"
    assert options == {
        "format": "delta",
        "readChangeFeed": "true",
        "startingVersion": "2",
        "endingVersion": "4",
    }
    assert changes.df.ops == [  # type: ignore[attr-defined]
        ("where", "_change_type = 'insert'"),
        ("drop", ("_change_type", "_commit_version", "_commit_timestamp")),
    ]
    nothing = engine.read_appends(BRONZE, after_version=4)
    assert nothing.start_version is None and nothing.end_version == 4
    with pytest.raises(LakeError, match="before the requested after_version 9"):
        engine.read_appends(BRONZE, after_version=9)


def test_read_appends_up_to_a_version(engine: SparkEngine, spark: FakeSpark) -> None:
    engine.ensure_table(BRONZE, SCHEMA)
    for version in (1, 2, 3):
        engine.append(BRONZE, FakeDataFrame(spark, SCHEMA, 1), txn=Txn("b", version))  # type: ignore[arg-type]
    changes = engine.read_appends(BRONZE, after_version=0, until_version=2)
    assert (changes.start_version, changes.end_version, changes.full_read) == (1, 2, False)
    _, options = spark.reads[-1]
    assert (options["startingVersion"], options["endingVersion"]) == ("1", "2")
    with pytest.raises(LakeError, match="cannot read appends up to version 7"):
        engine.read_appends(BRONZE, after_version=0, until_version=7)
    with pytest.raises(LakeError, match="until_version 1 is before after_version 2"):
        engine.read_appends(BRONZE, after_version=2, until_version=1)
    # A rewrite after the range does not stop the range from being read incrementally.
    spark.tables["main.bronze.sf_account_change_event"].commit("DELETE")
    assert not engine.read_appends(BRONZE, after_version=1, until_version=3).full_read
    assert engine.read_appends(BRONZE, after_version=1).full_read


def test_read_appends_falls_back_to_a_full_read(
    engine: SparkEngine, spark: FakeSpark, caplog: pytest.LogCaptureFixture
) -> None:
    engine.ensure_table(BRONZE, SCHEMA)
    table = spark.tables["main.bronze.sf_account_change_event"]
    table.commit("DELETE")
    with caplog.at_level(logging.WARNING):
        changes = engine.read_appends(BRONZE, after_version=0)
    assert changes.full_read and changes.end_version == 1
    assert "version 1 (DELETE) rewrote or deleted rows" in caplog.text
    table.properties["delta.enableChangeDataFeed"] = "false"
    table.commit("WRITE", parameters={"mode": "Append"})
    assert engine.read_appends(BRONZE, after_version=1).full_read
    assert "delta.enableChangeDataFeed is off" in caplog.text


def test_maintain_and_history(engine: SparkEngine, spark: FakeSpark) -> None:
    engine.ensure_table(BRONZE, SCHEMA)
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "true")
    result = engine.maintain(BRONZE, vacuum_hours=1.5)
    assert (result.files_removed, result.files_added) == (7, 1)
    vacuum = spark.statements.index(
        "VACUUM `main`.`bronze`.`sf_account_change_event` RETAIN 2 HOURS"
    )
    assert (
        spark.conf.seen[vacuum]["spark.databricks.delta.retentionDurationCheck.enabled"] == "false"
    )
    assert spark.conf.values["spark.databricks.delta.retentionDurationCheck.enabled"] == "true"
    assert [e.operation for e in engine.history(BRONZE)] == ["OPTIMIZE", "CREATE TABLE"]
    assert engine.register_sql([BRONZE, TableRef("gold", "absent")]) == [
        "`main`.`bronze`.`sf_account_change_event`"
    ]


def test_merge_without_delta_spark_says_what_to_install(
    engine: SparkEngine, spark: FakeSpark
) -> None:
    pytest.importorskip("pyspark")
    try:
        import delta  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("delta-spark is installed here")
    with pytest.raises(LakeError, match=r"install sfcdc\[spark\]"):
        engine.merge(BRONZE, FakeDataFrame(spark, SCHEMA), on=["event_id"])  # type: ignore[arg-type]


def test_missing_tables_are_clear_errors(engine: SparkEngine) -> None:
    assert engine.version(BRONZE) is None and engine.schema(BRONZE) is None
    with pytest.raises(LakeError, match="does not exist"):
        engine.read(BRONZE)
