"""The local engine on real Delta tables under ``tmp_path``, read back through Spark."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from ingest.errors import LakeError
from pipelines.engines import LocalEngine, TableRef, Txn
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.spec import SchemasSpec

pytestmark = pytest.mark.spark

BRONZE = TableRef("bronze", "account_change_event")
GOLD = TableRef("gold", "account")
UTC = timezone.utc


@pytest.fixture
def engine(spark: SparkSession, tmp_path: Path) -> Iterator[LocalEngine]:
    # Views live in the session's catalog, shared by every test: give each test its own schemas.
    tag = uuid.uuid4().hex[:8]
    schemas = SchemasSpec(bronze=f"bronze_{tag}", silver=f"silver_{tag}", gold=f"gold_{tag}")
    yield LocalEngine(spark, location=tmp_path / "lake", schemas=schemas)
    for schema in (schemas.bronze, schemas.silver, schemas.gold):
        spark.sql(f"DROP DATABASE IF EXISTS {schema} CASCADE")


def events(start: int, n: int, **extra: pa.Array) -> pa.Table:
    columns = {
        "event_id": pa.array([f"e{i}" for i in range(start, start + n)], pa.string()),
        "replay_id": pa.array(
            [i.to_bytes(10, "big") for i in range(start, start + n)], pa.binary()
        ),
        "received_at": pa.array(
            [datetime(2024, 5, 1, tzinfo=UTC)] * n, pa.timestamp("ms", tz="UTC")
        ),
    }
    return pa.table({**columns, **extra})


def ids(df) -> list[str]:
    return sorted(r[0] for r in df.select("event_id").collect())


# -------------------------------------------------------------------------------- writing


def test_append_creates_a_valid_delta_table(engine: LocalEngine) -> None:
    result = engine.append(BRONZE, events(0, 3), metadata={"batch": "b0"})
    assert (result.version, result.skipped, result.rows) == (0, False, 3)
    path = engine.path(BRONZE)
    assert path == engine.location / "bronze" / "account_change_event"

    # Any Delta reader sees an ordinary table: protocol, metadata and schema are sane.
    dt = DeltaTable(str(path))
    assert dt.version() == 0
    assert (dt.protocol().min_reader_version, dt.protocol().min_writer_version) == (1, 2)
    assert dt.metadata().partition_columns == []
    first = [json.loads(line) for line in (path / "_delta_log" / f"{0:020d}.json").open()]
    kinds = {next(iter(action)) for action in first}
    assert {"protocol", "metaData", "add", "commitInfo"} <= kinds
    (meta,) = [a["metaData"] for a in first if "metaData" in a]
    assert [f["type"] for f in json.loads(meta["schemaString"])["fields"]] == [
        "string",
        "binary",
        "timestamp",
    ]
    assert dt.to_pyarrow_table().num_rows == 3
    (commit,) = [a["commitInfo"] for a in first if "commitInfo" in a]
    assert json.loads(commit["userMetadata"]) == {"batch": "b0"}
    assert engine.read(BRONZE).count() == 3


def test_append_with_txn_is_idempotent_across_processes(engine: LocalEngine) -> None:
    assert (
        engine.append(BRONZE, events(0, 2), txn=Txn("bronze:/data/AccountChangeEvent", 5)).version
        == 0
    )
    same = engine.append(BRONZE, events(0, 2), txn=Txn("bronze:/data/AccountChangeEvent", 5))
    lower = engine.append(BRONZE, events(0, 2), txn=Txn("bronze:/data/AccountChangeEvent", 4))
    assert same.skipped and lower.skipped and same.rows == 0
    assert engine.version(BRONZE) == 0
    assert engine.txn_version(BRONZE, "bronze:/data/AccountChangeEvent") == 5
    assert engine.txn_version(BRONZE, "someone-else") is None
    # The txn lives in the Delta log: another process, with no engine and no Spark, sees it.
    probe = (
        "import sys; from deltalake import DeltaTable; "
        "print(DeltaTable(sys.argv[1]).transaction_version('bronze:/data/AccountChangeEvent'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(engine.path(BRONZE))],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "5"
    writer_only = LocalEngine(None, location=engine.location)
    assert writer_only.append(
        BRONZE, events(0, 2), txn=Txn("bronze:/data/AccountChangeEvent", 5)
    ).skipped
    assert (
        writer_only.append(
            BRONZE, events(2, 2), txn=Txn("bronze:/data/AccountChangeEvent", 6)
        ).version
        == 1
    )
    with pytest.raises(LakeError, match="created without a Spark session"):
        writer_only.read(BRONZE)
    assert ids(engine.read(BRONZE)) == ["e0", "e1", "e2", "e3"]


def test_empty_appends(engine: LocalEngine) -> None:
    nothing = engine.append(BRONZE, events(0, 0))
    assert nothing.version is None and not engine.exists(BRONZE)
    # With a txn an empty batch still commits, so the txn (e.g. a keepalive) is recorded.
    keepalive = engine.append(BRONZE, events(0, 0), txn=Txn("bronze", 1))
    assert keepalive.version == 0 and engine.txn_version(BRONZE, "bronze") == 1
    assert engine.read(BRONZE).count() == 0
    assert engine.read(BRONZE).schema.names == ["event_id", "replay_id", "received_at"]


def test_schema_evolution_on_append_and_reading_the_evolved_table(engine: LocalEngine) -> None:
    engine.append(BRONZE, events(0, 2))
    wider = events(2, 1, batch=pa.array([7], pa.int64()))
    assert engine.append(BRONZE, wider).version == 1
    with pytest.raises(LakeError, match=r"columns .* does not have: 'extra'; pass evolve_schema"):
        engine.append(BRONZE, events(3, 1, extra=pa.array(["x"])), evolve_schema=False)
    # A batch without the new column still appends; the column is null there.
    engine.append(BRONZE, events(3, 1))
    df = engine.read(BRONZE)
    assert df.schema["batch"].dataType == T.LongType()
    assert sorted((r.event_id, r.batch) for r in df.collect()) == [
        ("e0", None),
        ("e1", None),
        ("e2", 7),
        ("e3", None),
    ]
    with pytest.raises(
        LakeError, match=r"column 'batch': bronze.account_change_event stores bigint"
    ):
        engine.append(BRONZE, events(4, 1, batch=pa.array(["seven"])))


def test_nested_struct_evolution(engine: LocalEngine) -> None:
    address = pa.struct([("City", pa.string())])
    wider = pa.struct([("City", pa.string()), ("PostalCode", pa.string())])
    engine.append(
        GOLD, pa.table({"Id": ["1"], "BillingAddress": pa.array([{"City": "Paris"}], address)})
    )
    engine.append(
        GOLD,
        pa.table(
            {
                "Id": ["2"],
                "BillingAddress": pa.array([{"City": "Lyon", "PostalCode": "69001"}], wider),
            }
        ),
    )
    rows = {r.Id: r.BillingAddress.asDict() for r in engine.read(GOLD).collect()}
    assert rows == {
        "1": {"City": "Paris", "PostalCode": None},
        "2": {"City": "Lyon", "PostalCode": "69001"},
    }
    engine.register_sql([GOLD])
    (row,) = engine.spark.sql(
        f"SELECT BillingAddress.PostalCode AS pc FROM {engine.qualified_name(GOLD)} WHERE Id = '1'"
    ).collect()
    assert row.pc is None


def test_ensure_table_creates_and_evolves(engine: LocalEngine) -> None:
    schema = T.StructType(
        [T.StructField("Id", T.StringType(), False), T.StructField("Name", T.StringType())]
    )
    engine.ensure_table(GOLD, schema, properties={"delta.appendOnly": "false"})
    assert engine.version(GOLD) == 0
    assert engine.schema(GOLD) == schema
    engine.ensure_table(GOLD, schema)  # converged: nothing to do
    assert engine.version(GOLD) == 0
    wider = T.StructType([*schema.fields, T.StructField("Rating", T.StringType(), False)])
    engine.ensure_table(GOLD, wider, properties={"delta.logRetentionDuration": "interval 30 days"})
    got = engine.schema(GOLD)
    assert got is not None and got["Rating"].nullable  # existing rows cannot hold NOT NULL
    config = DeltaTable(str(engine.path(GOLD))).metadata().configuration
    assert config["delta.logRetentionDuration"] == "interval 30 days"
    with pytest.raises(LakeError, match=r"column 'Name' of gold.account is string, not bigint"):
        engine.ensure_table(GOLD, T.StructType([T.StructField("Name", T.LongType())]))
    with pytest.raises(LakeError, match=r"column 'Id' is NOT NULL in gold.account but missing"):
        engine.append(GOLD, pa.table({"Name": ["x"]}))


ALL_TYPES = T.StructType(
    [
        T.StructField("s", T.StringType()),
        T.StructField("bin", T.BinaryType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("i8", T.ByteType()),
        T.StructField("i16", T.ShortType()),
        T.StructField("i32", T.IntegerType()),
        T.StructField("i64", T.LongType()),
        T.StructField("f32", T.FloatType()),
        T.StructField("f64", T.DoubleType()),
        T.StructField("dec", T.DecimalType(18, 2)),
        T.StructField("day", T.DateType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("ntz", T.TimestampNTZType()),
        T.StructField("names", T.ArrayType(T.StringType())),
        T.StructField("counts", T.MapType(T.StringType(), T.LongType())),
        T.StructField(
            "addr",
            T.StructType(
                [T.StructField("City", T.StringType()), T.StructField("Latitude", T.DoubleType())]
            ),
        ),
    ]
)
ALL_VALUES = {
    "s": "Acme",
    "bin": b"\x00\xff",
    "flag": True,
    "i8": -8,
    "i16": 1600,
    "i32": 2**31 - 1,
    "i64": 1709303151782928388,  # a real commitNumber: above 2**53
    "f32": 1.5,
    "f64": 0.1,
    "dec": Decimal("12345.67"),
    "day": date(2024, 2, 29),
    "ts": datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=UTC),
    "ntz": datetime(2024, 5, 1, 12, 30, 15),
    "names": ["a", None],
    "counts": [("k", 1)],
    "addr": {"City": "Paris", "Latitude": 48.85},
}


def test_every_mapped_type_round_trips(engine: LocalEngine) -> None:
    table = TableRef("silver", "every_type")
    engine.ensure_table(table, ALL_TYPES)
    data = pa.Table.from_pylist([ALL_VALUES, {}], schema=spark_schema_to_arrow(ALL_TYPES))
    engine.append(table, data)
    assert engine.schema(table) == ALL_TYPES
    df = engine.read(table)
    assert df.schema == ALL_TYPES
    engine.register_sql([table])
    viewed = engine.spark.table(engine.qualified_name(table))
    assert viewed.schema == ALL_TYPES
    for rows in (df.collect(), viewed.collect()):
        full = next(r for r in rows if r.s is not None).asDict(recursive=True)
        assert full["ts"] == datetime(2024, 5, 1, 12, 30, 15, 123000)  # session time zone: UTC
        assert full["counts"] == {"k": 1}
        assert full["addr"] == {"City": "Paris", "Latitude": 48.85}
        assert {k: v for k, v in full.items() if k not in ("ts", "counts", "addr")} == {
            k: v for k, v in ALL_VALUES.items() if k not in ("ts", "counts", "addr")
        }
        empty = next(r for r in rows if r.s is None)
        assert all(v is None for v in empty.asDict().values())
    # And back: a DataFrame of every type appends through Arrow unchanged.
    engine.append(table, df.where("s IS NOT NULL"))
    assert engine.read(table).where("s = 'Acme' AND i64 = 1709303151782928388").count() == 2


# ---------------------------------------------------------------------------- read_appends


def test_read_appends_across_commits_and_compaction(engine: LocalEngine) -> None:
    for i in range(4):
        engine.append(BRONZE, events(i * 2, 2), txn=Txn("b", i))  # versions 0..3
    changes = engine.read_appends(BRONZE, after_version=1)
    assert (changes.start_version, changes.end_version, changes.full_read) == (2, 3, False)
    assert ids(changes.df) == ["e4", "e5", "e6", "e7"]
    everything = engine.read_appends(BRONZE, after_version=None)
    assert len(ids(everything.df)) == 8 and everything.end_version == 3

    report = engine.maintain(BRONZE)
    assert report.files_removed == 4 and report.files_added == 1
    assert report.checkpoint_version == 4
    assert (engine.path(BRONZE) / "_delta_log" / f"{4:020d}.checkpoint.parquet").exists()
    engine.append(BRONZE, events(8, 1))  # version 5
    after_compaction = engine.read_appends(BRONZE, after_version=3)
    assert ids(after_compaction.df) == ["e8"] and not after_compaction.full_read
    nothing = engine.read_appends(BRONZE, after_version=5)
    assert nothing.start_version is None and nothing.df.count() == 0
    with pytest.raises(LakeError, match="before the requested after_version 6"):
        engine.read_appends(BRONZE, after_version=6)


def test_read_appends_up_to_a_version(engine: LocalEngine) -> None:
    for i in range(4):
        engine.append(BRONZE, events(i * 2, 2), txn=Txn("b", i))  # versions 0..3
    middle = engine.read_appends(BRONZE, after_version=0, until_version=2)
    assert (middle.start_version, middle.end_version, middle.full_read) == (1, 2, False)
    assert ids(middle.df) == ["e2", "e3", "e4", "e5"]
    first = engine.read_appends(BRONZE, after_version=None, until_version=1)
    assert first.end_version == 1 and ids(first.df) == ["e0", "e1", "e2", "e3"]
    same = engine.read_appends(BRONZE, after_version=2, until_version=2)
    assert same.start_version is None and same.df.count() == 0
    with pytest.raises(LakeError, match="cannot read appends up to version 4"):
        engine.read_appends(BRONZE, after_version=0, until_version=4)
    with pytest.raises(LakeError, match="until_version 1 is before after_version 2"):
        engine.read_appends(BRONZE, after_version=2, until_version=1)

    # A range that cannot be read incrementally falls back to the table at until_version.
    engine.overwrite(BRONZE, events(10, 1))  # version 4
    engine.append(BRONZE, events(11, 1))  # version 5
    fallback = engine.read_appends(BRONZE, after_version=3, until_version=4)
    assert fallback.full_read and fallback.end_version == 4 and ids(fallback.df) == ["e10"]


def test_read_appends_falls_back_when_rows_were_rewritten_or_the_log_cleaned(
    engine: LocalEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.append(BRONZE, events(0, 2))
    engine.overwrite(BRONZE, events(10, 1))
    changes = engine.read_appends(BRONZE, after_version=0)
    assert changes.full_read and ids(changes.df) == ["e10"]
    assert "commit 1 (WRITE) rewrote or deleted rows" in caplog.text

    engine.append(BRONZE, events(11, 1))  # version 2
    engine.ensure_table(
        BRONZE,
        engine.schema(BRONZE),  # type: ignore[arg-type]
        properties={"delta.logRetentionDuration": "interval 0 seconds"},
    )
    engine.maintain(BRONZE, compact=False)  # checkpoint, then log cleanup removes old commits
    assert not (engine.path(BRONZE) / "_delta_log" / f"{1:020d}.json").exists()
    cleaned = engine.read_appends(BRONZE, after_version=1)
    assert cleaned.full_read and ids(cleaned.df) == ["e10", "e11"]
    assert "was removed from the log by log cleanup" in caplog.text


# ---------------------------------------------------------------------------------- merge


def test_merge_inserts_updates_deletes_with_metrics(
    engine: LocalEngine, spark: SparkSession
) -> None:
    first = spark.createDataFrame(
        [("001A", "Acme", 1), ("001B", "Globex", 1)], "Id string, Name string, ts long"
    )
    created = engine.merge(GOLD, first, on=["Id"])
    assert (created.inserted, created.updated, created.deleted, created.source_rows) == (2, 0, 0, 2)
    assert created.version == 1 and not created.skipped  # 0 created the table

    changes = spark.createDataFrame(
        [
            ("001A", "Acme Corp", 2, False),  # newer: updated
            ("001B", "Globex", 0, True),  # deleted (the delete condition wins)
            ("001C", "Initech", 1, False),  # new: inserted
        ],
        "Id string, Name string, ts long, deleted boolean",
    )
    metrics = engine.merge(
        GOLD,
        changes,
        on=["Id"],
        update_condition="source.ts > target.ts",
        delete_condition="source.deleted",
        txn=Txn("gold:account", 1),
    )
    assert (metrics.inserted, metrics.updated, metrics.deleted, metrics.source_rows) == (1, 1, 1, 3)
    assert metrics.duration_s >= 0
    rows = sorted((r.Id, r.Name, r.ts, r.deleted) for r in engine.read(GOLD).collect())
    assert rows == [("001A", "Acme Corp", 2, False), ("001C", "Initech", 1, False)]

    again = engine.merge(GOLD, changes, on=["Id"], txn=Txn("gold:account", 1))
    assert again.skipped and again.version == metrics.version

    stale = spark.createDataFrame([("001A", "Old", 1)], "Id string, Name string, ts long")
    noop = engine.merge(
        GOLD,
        stale,
        on=["Id"],
        update_condition="source.ts > target.ts",
        insert=False,
        txn=Txn("gold:account", 2),
    )
    assert (noop.inserted, noop.updated, noop.deleted) == (0, 0, 0)
    # Nothing changed, yet the txn is recorded (in an empty commit) so a rerun skips.
    assert engine.txn_version(GOLD, "gold:account") == 2
    assert engine.read(GOLD).where("Name = 'Old'").count() == 0


def test_merge_errors(engine: LocalEngine, spark: SparkSession) -> None:
    engine.merge(GOLD, pa.table({"Id": ["1"], "Name": ["a"]}), on=["Id"])
    duplicated = pa.table({"Id": ["1", "1"], "Name": ["b", "c"]})
    with pytest.raises(
        LakeError, match=r"merge into gold.account .* failed: .*multiple source rows"
    ):
        engine.merge(GOLD, duplicated, on=["Id"])
    with pytest.raises(LakeError, match=r"key columns \['RecordId'\] are not in the source"):
        engine.merge(GOLD, pa.table({"Id": ["1"]}), on=["RecordId"])
    with pytest.raises(LakeError, match="got 'Id', a str"):
        engine.merge(GOLD, pa.table({"Id": ["1"]}), on="Id")  # type: ignore[arg-type]


def test_merge_evolves_the_schema(engine: LocalEngine) -> None:
    engine.merge(GOLD, pa.table({"Id": ["1"], "Name": ["a"]}), on=["Id"])
    engine.merge(GOLD, pa.table({"Id": ["1"], "Rating": ["Hot"]}), on=["Id"])
    (row,) = engine.read(GOLD).collect()
    assert row.asDict() == {"Id": "1", "Name": "a", "Rating": "Hot"}  # Name untouched
    with pytest.raises(LakeError):
        engine.merge(GOLD, pa.table({"Id": ["1"], "Other": ["x"]}), on=["Id"], evolve_schema=False)


# -------------------------------------------------------------------- history and maintain


def test_history_records_operations_metadata_and_txn(engine: LocalEngine) -> None:
    engine.append(BRONZE, events(0, 1), txn=Txn("bronze", 1), metadata={"batch": "b1"})
    engine.append(BRONZE, events(1, 1))
    engine.merge(BRONZE, events(1, 1), on=["event_id"], metadata={"run": "r7"})
    history = engine.history(BRONZE)
    assert [(h.version, h.operation) for h in history] == [(2, "MERGE"), (1, "WRITE"), (0, "WRITE")]
    assert history[2].metadata == {"batch": "b1"} and history[2].txn == Txn("bronze", 1)
    assert history[1].txn is None and history[0].metadata == {"run": "r7"}
    assert history[0].metrics["num_target_rows_updated"] == 1
    assert history[2].timestamp.tzinfo is UTC
    assert [h.version for h in engine.history(BRONZE, limit=1)] == [2]


def test_vacuum_deletes_unreferenced_files(engine: LocalEngine) -> None:
    for i in range(3):
        engine.append(BRONZE, events(i, 1))
    engine.maintain(BRONZE, checkpoint=False)
    parquet = lambda: sorted(engine.path(BRONZE).glob("*.parquet"))  # noqa: E731
    assert len(parquet()) == 4
    report = engine.maintain(BRONZE, compact=False, checkpoint=False, vacuum_hours=0)
    assert report.vacuumed_files == 3 and len(parquet()) == 1
    assert ids(engine.read(BRONZE)) == ["e0", "e1", "e2"]


# ----------------------------------------------------------------------------- SQL views


def test_register_sql_views_refresh_after_writes(engine: LocalEngine, spark: SparkSession) -> None:
    engine.append(BRONZE, events(0, 2))
    engine.ensure_table(GOLD, T.StructType([T.StructField("Id", T.StringType())]))
    names = engine.register_sql()
    bronze_name = engine.qualified_name(BRONZE)
    assert set(names) == {bronze_name, engine.qualified_name(GOLD)}
    assert bronze_name == f"`{engine.schemas.bronze}`.`account_change_event`"
    count = lambda: spark.sql(f"SELECT count(*) AS n FROM {bronze_name}").first().n  # noqa: E731
    assert count() == 2
    # Empty table: a typed, empty view.
    gold = spark.table(engine.qualified_name(GOLD))
    assert gold.count() == 0 and gold.schema["Id"].dataType == T.StringType()

    engine.append(BRONZE, events(2, 3, batch=pa.array([1, 2, 3], pa.int64())))
    assert count() == 5
    batches = spark.sql(f"SELECT batch FROM {bronze_name} WHERE event_id = 'e0'").first()
    assert batches.batch is None  # the older file lacks the column
    engine.maintain(BRONZE, vacuum_hours=0)  # old files are gone: the view follows
    assert count() == 5
    engine.merge(GOLD, pa.table({"Id": ["1"]}), on=["Id"])
    assert spark.table(engine.qualified_name(GOLD)).count() == 1


def test_view_over_many_files_of_several_schemas(engine: LocalEngine, spark: SparkSession) -> None:
    for i in range(6):
        extra = {"batch": pa.array([i], pa.int64())} if i % 2 else {}
        engine.append(BRONZE, events(i, 1, **extra))
    (name,) = engine.register_sql([BRONZE])
    rows = spark.sql(f"SELECT event_id, batch FROM {name} ORDER BY event_id").collect()
    assert [(r.event_id, r.batch) for r in rows] == [
        ("e0", None),
        ("e1", 1),
        ("e2", None),
        ("e3", 3),
        ("e4", None),
        ("e5", 5),
    ]


def test_read_of_an_old_version_and_missing_tables(engine: LocalEngine) -> None:
    engine.append(BRONZE, events(0, 1))
    engine.append(BRONZE, events(1, 1))
    assert ids(engine.read(BRONZE, version=0)) == ["e0"]
    with pytest.raises(LakeError, match=r"has versions 0..1; cannot read version 7"):
        engine.read(BRONZE, version=7)
    missing = TableRef("silver", "nothing_here")
    assert not engine.exists(missing) and engine.version(missing) is None
    assert engine.schema(missing) is None
    with pytest.raises(LakeError, match=r"table silver.nothing_here does not exist"):
        engine.read(missing)
