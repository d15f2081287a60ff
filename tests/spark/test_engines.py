"""Both lake engines against the same contract, on real Delta tables under ``tmp_path``:
writes, idempotent app transactions, schema evolution, types, the change data feed, MERGE,
history, maintenance, execution of layer functions, and each engine reading what the other
wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import types as T

from ingest.errors import LakeError
from pipelines.engines import LakeEngine, SparkEngine, TableRef, Txn
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.local import LocalEngine
from pipelines.engines.spark_sql import TXN_APP_ID_CONF, TXN_VERSION_CONF
from pipelines.spec import SchemasSpec
from tests.lake_helpers import arrow_of, column_of, rows_of

BRONZE = TableRef("bronze", "account_change_event")
GOLD = TableRef("gold", "account")
UTC = timezone.utc


def events(start: int, n: int, **extra: pa.Array) -> pa.Table:
    columns = {
        "event_id": pa.array([f"e{i}" for i in range(start, start + n)], pa.string()),
        "replay_id": pa.array(
            [i.to_bytes(10, "big") for i in range(start, start + n)], pa.binary()
        ),
        "received_at": pa.array(
            [datetime(2024, 5, 1, tzinfo=UTC)] * n, pa.timestamp("us", tz="UTC")
        ),
    }
    return pa.table({**columns, **extra})


# The tests of what the spark engine does with its session's settings: once on the classic
# session, once over Spark Connect.
SPARK_SESSIONS = pytest.mark.parametrize(
    "session",
    [
        pytest.param("spark", marks=[pytest.mark.spark_engine, pytest.mark.spark]),
        pytest.param("spark_connect", marks=[pytest.mark.spark_connect, pytest.mark.spark]),
    ],
)
ID_AND_N = T.StructType([T.StructField("Id", T.StringType()), T.StructField("n", T.LongType())])


def ids(engine: LakeEngine, rows: Any) -> list[str]:
    return column_of(engine, rows, "event_id")


# -------------------------------------------------------------------------------- writing


def test_append_creates_a_delta_table_any_reader_opens(lake_engine: LakeEngine) -> None:
    result = lake_engine.append(BRONZE, events(0, 3), metadata={"batch": "b0"})
    assert not result.skipped and result.rows == 3
    assert ids(lake_engine, lake_engine.read(BRONZE)) == ["e0", "e1", "e2"]
    # An ordinary table: delta-rs opens what either engine wrote, change data feed on.
    dt = DeltaTable(str(Path(lake_engine.location) / "bronze" / "account_change_event"))  # type: ignore[attr-defined]
    assert dt.version() == result.version
    assert dt.metadata().partition_columns == []
    assert dt.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert dt.to_pyarrow_table().num_rows == 3
    (last,) = lake_engine.history(BRONZE, limit=1)
    assert last.metadata == {"batch": "b0"}


def test_append_with_txn_is_idempotent_across_processes(
    lake_engine: LakeEngine, make_engine: Any
) -> None:
    app = "bronze:/data/AccountChangeEvent"
    first = lake_engine.append(BRONZE, events(0, 2), txn=Txn(app, 5))
    same = lake_engine.append(BRONZE, events(0, 2), txn=Txn(app, 5))
    lower = lake_engine.append(BRONZE, events(0, 2), txn=Txn(app, 4))
    assert not first.skipped and same.skipped and lower.skipped and same.rows == 0
    assert lake_engine.version(BRONZE) == first.version
    assert lake_engine.txn_version(BRONZE, app) == 5
    assert lake_engine.txn_version(BRONZE, "someone-else") is None
    # The txn lives in the Delta log: another process, with no engine and no Spark, sees it.
    probe = (
        "import sys; from deltalake import DeltaTable; "
        "print(DeltaTable(sys.argv[1]).transaction_version(sys.argv[2]))"
    )
    path = Path(lake_engine.location) / "bronze" / "account_change_event"  # type: ignore[attr-defined]
    out = subprocess.run(
        [sys.executable, "-c", probe, str(path), app], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "5"
    # A new engine (a new run) reads the txn from the table, not from memory.
    again = make_engine(lake_engine.location)  # type: ignore[attr-defined]
    assert again.append(BRONZE, events(0, 2), txn=Txn(app, 5)).skipped
    assert not again.append(BRONZE, events(2, 2), txn=Txn(app, 6)).skipped
    assert ids(again, again.read(BRONZE)) == ["e0", "e1", "e2", "e3"]


def test_a_writer_keeps_up_with_its_own_commits_and_sees_another_writers(
    lake_engine: LakeEngine, make_engine: Any
) -> None:
    """The transactions an engine knows of a table follow the commits it makes itself, and a
    commit another process makes in between is read from the table before the next write."""
    other = make_engine(lake_engine.location)  # type: ignore[attr-defined]
    lake_engine.append(BRONZE, events(0, 1), txn=Txn("mine", 1))
    assert lake_engine.txn_version(BRONZE, "mine") == 1
    lake_engine.append(BRONZE, events(1, 1), txn=Txn("mine", 2))
    assert lake_engine.txn_version(BRONZE, "mine") == 2
    other.append(BRONZE, events(2, 1), txn=Txn("theirs", 1))
    lake_engine.append(BRONZE, events(3, 1), txn=Txn("mine", 3))
    assert lake_engine.txn_version(BRONZE, "theirs") == 1
    assert lake_engine.append(BRONZE, events(2, 1), txn=Txn("theirs", 1)).skipped
    other.append(BRONZE, events(4, 1), txn=Txn("theirs", 2))
    assert lake_engine.txn_version(BRONZE, "theirs") == 2
    assert ids(lake_engine, lake_engine.read(BRONZE)) == ["e0", "e1", "e2", "e3", "e4"]
    (newest,) = lake_engine.history(BRONZE, limit=1)
    assert lake_engine.version(BRONZE) == other.version(BRONZE) == newest.version


@pytest.mark.append_parts
def test_append_parts_record_each_txn(lake_engine: LakeEngine, make_engine: Any) -> None:
    before = lake_engine.append(BRONZE, events(0, 1)).version
    assert before is not None
    results = lake_engine.append_parts(
        BRONZE, [(events(1, 1), Txn("a", 1)), (events(2, 2), Txn("b", 1))]
    )
    assert [(r.skipped, r.rows) for r in results] == [(False, 1), (False, 2)]
    # The local engine, and the spark engine's one-commit append, record the parts'
    # transactions in one commit; the spark engine's DataFrameWriter, a commit per part.
    one_commit = not isinstance(lake_engine, SparkEngine) or lake_engine.one_commit_appends
    expected = [before + 1] * 2 if one_commit else [before + 1, before + 2]
    assert [r.version for r in results] == expected
    assert lake_engine.version(BRONZE) == expected[-1]
    assert lake_engine.txn_version(BRONZE, "a") == 1
    assert lake_engine.txn_version(BRONZE, "b") == 1
    # Another engine (another process) reads both from the table.
    other = make_engine(lake_engine.location)  # type: ignore[attr-defined]
    assert other.txn_version(BRONZE, "a") == other.txn_version(BRONZE, "b") == 1
    again = lake_engine.append_parts(
        BRONZE, [(events(1, 1), Txn("a", 1)), (events(4, 1), Txn("b", 2))]
    )
    assert [(r.skipped, r.rows) for r in again] == [(True, 0), (False, 1)]
    assert ids(lake_engine, lake_engine.read(BRONZE)) == ["e0", "e1", "e2", "e3", "e4"]
    with pytest.raises(LakeError, match="app id twice"):
        lake_engine.append_parts(BRONZE, [(events(5, 1), Txn("c", 1)), (events(6, 1), Txn("c", 2))])


def test_a_txn_older_than_the_retained_log_is_read_from_the_checkpoint(
    lake_engine: LakeEngine, make_engine: Any
) -> None:
    """Log cleanup removes the commits before a checkpoint: a txn written there is no longer in
    the history (which the spark engine reads), yet the table still records it."""
    lake_engine.append(BRONZE, events(0, 1), txn=Txn("old", 7))
    for i in range(1, 12):
        lake_engine.append(BRONZE, events(i, 1))
    log = Path(lake_engine.location) / "bronze" / "account_change_event" / "_delta_log"  # type: ignore[attr-defined]
    if not (log / "_last_checkpoint").exists():  # delta-rs checkpoints when asked
        lake_engine.maintain(BRONZE, compact=False)
    checkpoint = json.loads((log / "_last_checkpoint").read_text())["version"]
    assert checkpoint >= 10
    for commit in log.glob("*.json"):
        if int(commit.name.split(".")[0]) < checkpoint:
            commit.unlink()  # what Delta's log cleanup does after delta.logRetentionDuration
    lake_engine.append(BRONZE, events(12, 1), txn=Txn("new", 1))
    later = make_engine(lake_engine.location)  # type: ignore[attr-defined]
    assert later.txn_version(BRONZE, "old") == 7
    assert later.txn_version(BRONZE, "new") == 1
    assert later.txn_version(BRONZE, "never") is None
    assert later.append(BRONZE, events(0, 1), txn=Txn("old", 7)).skipped


def test_empty_appends(lake_engine: LakeEngine) -> None:
    nothing = lake_engine.append(BRONZE, events(0, 0))
    assert nothing.version is None and not lake_engine.exists(BRONZE)
    # With a txn an empty batch still commits, so the txn (e.g. a keepalive) is recorded.
    keepalive = lake_engine.append(BRONZE, events(0, 0), txn=Txn("bronze", 1))
    assert keepalive.version is not None and lake_engine.txn_version(BRONZE, "bronze") == 1
    assert lake_engine.count(lake_engine.read(BRONZE)) == 0
    schema = lake_engine.schema(BRONZE)
    assert schema is not None and schema.names == ["event_id", "replay_id", "received_at"]


def test_schema_evolution_on_append(lake_engine: LakeEngine) -> None:
    lake_engine.append(BRONZE, events(0, 2))
    lake_engine.append(BRONZE, events(2, 1, batch=pa.array([7], pa.int64())))
    with pytest.raises(LakeError, match="extra"):
        lake_engine.append(BRONZE, events(3, 1, extra=pa.array(["x"])), evolve_schema=False)
    # A batch without the new column still appends; the column is null there.
    lake_engine.append(BRONZE, events(3, 1))
    schema = lake_engine.schema(BRONZE)
    assert schema is not None and schema["batch"].dataType == T.LongType()
    rows = rows_of(lake_engine, BRONZE)
    assert sorted((r["event_id"], r["batch"]) for r in rows) == [
        ("e0", None),
        ("e1", None),
        ("e2", 7),
        ("e3", None),
    ]
    with pytest.raises(LakeError):
        lake_engine.append(BRONZE, events(4, 1, batch=pa.array(["seven"])))


def test_nested_struct_evolution(lake_engine: LakeEngine) -> None:
    address = pa.struct([("City", pa.string())])
    wider = pa.struct([("City", pa.string()), ("PostalCode", pa.string())])
    lake_engine.append(
        GOLD, pa.table({"Id": ["1"], "BillingAddress": pa.array([{"City": "Paris"}], address)})
    )
    lake_engine.append(
        GOLD,
        pa.table(
            {
                "Id": ["2"],
                "BillingAddress": pa.array([{"City": "Lyon", "PostalCode": "69001"}], wider),
            }
        ),
    )
    rows = {r["Id"]: r["BillingAddress"] for r in rows_of(lake_engine, GOLD)}
    assert rows == {
        "1": {"City": "Paris", "PostalCode": None},
        "2": {"City": "Lyon", "PostalCode": "69001"},
    }


def test_ensure_table_creates_and_evolves(lake_engine: LakeEngine) -> None:
    schema = T.StructType(
        [T.StructField("Id", T.StringType(), False), T.StructField("Name", T.StringType())]
    )
    lake_engine.ensure_table(GOLD, schema, properties={"delta.appendOnly": "false"})
    created = lake_engine.version(GOLD)
    assert lake_engine.schema(GOLD) == schema
    lake_engine.ensure_table(GOLD, schema)  # converged: nothing to do
    assert lake_engine.version(GOLD) == created
    wider = T.StructType([*schema.fields, T.StructField("Rating", T.StringType(), False)])
    lake_engine.ensure_table(
        GOLD, wider, properties={"delta.logRetentionDuration": "interval 30 days"}
    )
    got = lake_engine.schema(GOLD)
    assert got is not None and got["Rating"].nullable  # existing rows cannot hold NOT NULL
    path = Path(lake_engine.location) / "gold" / "account"  # type: ignore[attr-defined]
    config = DeltaTable(str(path)).metadata().configuration
    assert config["delta.logRetentionDuration"] == "interval 30 days"
    with pytest.raises(LakeError, match=r"column 'Name' of .* is string, not bigint"):
        lake_engine.ensure_table(GOLD, T.StructType([T.StructField("Name", T.LongType())]))
    with pytest.raises(LakeError):
        lake_engine.append(GOLD, pa.table({"Name": ["x"]}))  # Id is NOT NULL


def test_schemas_may_be_given_in_arrow(lake_engine: LakeEngine) -> None:
    # An Arrow schema means the Delta types of its columns (large_string: string, uint8: short).
    arrow = pa.schema(
        [pa.field("Id", pa.large_string(), nullable=False), pa.field("Rank", pa.uint8())]
    )
    lake_engine.ensure_table(GOLD, arrow)
    spark = T.StructType(
        [T.StructField("Id", T.StringType(), False), T.StructField("Rank", T.ShortType())]
    )
    assert lake_engine.schema(GOLD) == spark
    created = lake_engine.version(GOLD)
    lake_engine.ensure_table(GOLD, spark)  # the same schema: nothing to do
    assert lake_engine.version(GOLD) == created
    with pytest.raises(LakeError, match=r"column 'Rank' of .* is smallint, not bigint"):
        lake_engine.ensure_table(GOLD, pa.schema([("Rank", pa.int64())]))
    kn = pa.schema([("k", pa.large_string()), ("n", pa.int64())])
    rows = lake_engine.rows(pa.table({"k": ["a", "b"], "n": [1, 2]}), kn)
    mapped = lake_engine.map_batches(rows, PlusOne(), kn)
    both = lake_engine.union([rows, mapped], kn)
    totals = lake_engine.map_groups(both, key="k", function=Totals(), schema=kn)
    got = lake_engine.to_arrow(totals)
    assert got.schema.field("k").type == pa.string()
    assert {r["k"]: r["n"] for r in got.to_pylist()} == {"a": 3, "b": 5}


def test_ensure_table_checks_again_after_another_writers_commit(
    lake_engine: LakeEngine, make_engine: Any
) -> None:
    """A table found as asked is not checked again until it changes; a change another
    process makes is seen."""
    schema = T.StructType(
        [T.StructField("Id", T.StringType()), T.StructField("Name", T.StringType())]
    )
    lake_engine.ensure_table(GOLD, schema)
    lake_engine.ensure_table(GOLD, schema)
    other = make_engine(lake_engine.location)  # type: ignore[attr-defined]
    other.ensure_table(GOLD, T.StructType([*schema.fields, T.StructField("Rating", T.LongType())]))
    with pytest.raises(LakeError, match=r"column 'Rating' of .* is bigint, not string"):
        lake_engine.ensure_table(
            GOLD, T.StructType([*schema.fields, T.StructField("Rating", T.StringType())])
        )
    other.ensure_table(GOLD, schema, properties={"delta.logRetentionDuration": "interval 9 days"})
    lake_engine.ensure_table(GOLD, schema)  # the property is not asked for: left as it is
    lake_engine.ensure_table(
        GOLD, schema, properties={"delta.logRetentionDuration": "interval 8 days"}
    )
    path = Path(lake_engine.location) / "gold" / "account"  # type: ignore[attr-defined]
    config = DeltaTable(str(path)).metadata().configuration
    assert config["delta.logRetentionDuration"] == "interval 8 days"


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


def test_every_mapped_type_round_trips(lake_engine: LakeEngine) -> None:
    table = TableRef("silver", "every_type")
    lake_engine.ensure_table(table, ALL_TYPES)
    data = pa.Table.from_pylist([ALL_VALUES, {}], schema=spark_schema_to_arrow(ALL_TYPES))
    lake_engine.append(table, data)
    assert lake_engine.schema(table) == ALL_TYPES
    rows = rows_of(lake_engine, table)
    full = next(r for r in rows if r["s"] is not None)
    assert full == ALL_VALUES
    empty = next(r for r in rows if r["s"] is None)
    assert all(v is None for v in empty.values())
    # And back: the engine's own rows append unchanged.
    again = lake_engine.read(table)
    lake_engine.append(table, again)
    assert sum(1 for r in rows_of(lake_engine, table) if r == ALL_VALUES) == 2


# ---------------------------------------------------------------------------- read_appends


def test_read_appends_across_commits_and_compaction(lake_engine: LakeEngine) -> None:
    versions = [
        lake_engine.append(BRONZE, events(i * 2, 2), txn=Txn("b", i)).version for i in range(4)
    ]
    changes = lake_engine.read_appends(BRONZE, after_version=versions[1])
    assert (changes.start_version, changes.end_version, changes.full_read) == (
        versions[1] + 1,  # type: ignore[operator]
        versions[3],
        False,
    )
    assert ids(lake_engine, changes.rows) == ["e4", "e5", "e6", "e7"]
    everything = lake_engine.read_appends(BRONZE, after_version=None)
    assert len(ids(lake_engine, everything.rows)) == 8
    assert everything.end_version == versions[3]

    report = lake_engine.maintain(BRONZE)
    assert report.files_removed == 4 and report.files_added == 1
    compacted = lake_engine.version(BRONZE)
    lake_engine.append(BRONZE, events(8, 1))
    after_compaction = lake_engine.read_appends(BRONZE, after_version=versions[3])
    assert ids(lake_engine, after_compaction.rows) == ["e8"] and not after_compaction.full_read
    latest = lake_engine.version(BRONZE)
    assert latest is not None and compacted is not None and latest > compacted
    nothing = lake_engine.read_appends(BRONZE, after_version=latest)
    assert nothing.start_version is None and lake_engine.count(nothing.rows) == 0
    with pytest.raises(LakeError, match=f"before the requested after_version {latest + 1}"):
        lake_engine.read_appends(BRONZE, after_version=latest + 1)


def test_read_appends_up_to_a_version_and_of_some_columns(lake_engine: LakeEngine) -> None:
    v = [lake_engine.append(BRONZE, events(i * 2, 2), txn=Txn("b", i)).version for i in range(4)]
    assert all(x is not None for x in v)
    middle = lake_engine.read_appends(BRONZE, after_version=v[0], until_version=v[2])
    assert middle.end_version == v[2] and not middle.full_read
    assert ids(lake_engine, middle.rows) == ["e2", "e3", "e4", "e5"]
    first = lake_engine.read_appends(
        BRONZE, after_version=None, until_version=v[1], columns=["event_id"]
    )
    assert lake_engine.to_arrow(first.rows).column_names == ["event_id"]
    assert ids(lake_engine, first.rows) == ["e0", "e1", "e2", "e3"]
    same = lake_engine.read_appends(BRONZE, after_version=v[2], until_version=v[2])
    assert same.start_version is None and lake_engine.count(same.rows) == 0
    with pytest.raises(LakeError, match=f"cannot read appends up to version {v[3] + 1}"):  # type: ignore[operator]
        lake_engine.read_appends(BRONZE, after_version=v[0], until_version=v[3] + 1)  # type: ignore[operator]
    with pytest.raises(LakeError, match="is before after_version"):
        lake_engine.read_appends(BRONZE, after_version=v[2], until_version=v[1])


def test_read_appends_reads_inserts_across_rewrites(lake_engine: LakeEngine) -> None:
    first = lake_engine.append(BRONZE, events(0, 2)).version
    lake_engine.overwrite(BRONZE, events(10, 1))
    lake_engine.append(BRONZE, events(11, 1))
    changes = lake_engine.read_appends(BRONZE, after_version=first)
    assert not changes.full_read
    assert ids(lake_engine, changes.rows) == ["e10", "e11"]


def test_read_appends_falls_back_to_the_table_when_the_feed_is_gone(
    lake_engine: LakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    no_feed = {"delta.enableChangeDataFeed": "false"}
    schema = T.StructType([T.StructField("event_id", T.StringType())])
    lake_engine.ensure_table(BRONZE, schema, properties=no_feed)
    start = lake_engine.append(BRONZE, pa.table({"event_id": ["e0"]})).version
    lake_engine.append(BRONZE, pa.table({"event_id": ["e1"]}))
    changes = lake_engine.read_appends(BRONZE, after_version=start)
    assert changes.full_read and ids(lake_engine, changes.rows) == ["e0", "e1"]
    assert "reading the whole table" in caplog.text


def test_read_keyed_finds_the_rows_of_some_keys(lake_engine: LakeEngine) -> None:
    for start in (0, 100, 200):
        ids_ = [f"r{i:04d}" for i in range(start, start + 100)]
        lake_engine.append(GOLD, pa.table({"Id": ids_, "n": pa.array(range(100), pa.int64())}))
    keys = lake_engine.rows(pa.table({"Id": ["r0005", "r0150", "nope", None, "r0005"]}))
    found = lake_engine.read_keyed(GOLD, key="Id", keys=keys, columns=["Id"])
    assert column_of(lake_engine, found, "Id") == ["r0005", "r0150"]
    none = lake_engine.read_keyed(GOLD, key="Id", keys=lake_engine.rows(pa.table({"Id": ["x"]})))
    assert lake_engine.count(none) == 0


# ---------------------------------------------------------------------------------- merge


def test_merge_inserts_updates_deletes_with_metrics(lake_engine: LakeEngine) -> None:
    first = pa.table(
        {"Id": ["001A", "001B"], "Name": ["Acme", "Globex"], "ts": pa.array([1, 1], pa.int64())}
    )
    created = lake_engine.merge(GOLD, first, on=["Id"])
    assert (created.inserted, created.updated, created.deleted, created.source_rows) == (2, 0, 0, 2)
    assert not created.skipped

    changes = pa.table(
        {
            "Id": ["001A", "001B", "001C"],  # newer: updated; deleted; new: inserted
            "Name": ["Acme Corp", "Globex", "Initech"],
            "ts": pa.array([2, 0, 1], pa.int64()),
            "deleted": [False, True, False],
        }
    )
    metrics = lake_engine.merge(
        GOLD,
        lake_engine.rows(changes),
        on=["Id"],
        update_condition="source.ts > target.ts",
        delete_condition="source.deleted",
        txn=Txn("gold:account", 1),
    )
    assert (metrics.inserted, metrics.updated, metrics.deleted, metrics.source_rows) == (1, 1, 1, 3)
    assert metrics.duration_s >= 0
    rows = sorted((r["Id"], r["Name"], r["ts"], r["deleted"]) for r in rows_of(lake_engine, GOLD))
    assert rows == [("001A", "Acme Corp", 2, False), ("001C", "Initech", 1, False)]

    again = lake_engine.merge(GOLD, changes, on=["Id"], txn=Txn("gold:account", 1))
    assert again.skipped and again.version == metrics.version

    stale = pa.table({"Id": ["001A"], "Name": ["Old"], "ts": pa.array([1], pa.int64())})
    noop = lake_engine.merge(
        GOLD,
        stale,
        on=["Id"],
        update_condition="source.ts > target.ts",
        insert=False,
        txn=Txn("gold:account", 2),
    )
    assert (noop.inserted, noop.updated, noop.deleted) == (0, 0, 0)
    # Nothing changed, yet the txn is recorded so a rerun skips.
    assert lake_engine.txn_version(GOLD, "gold:account") == 2
    assert "Old" not in {r["Name"] for r in rows_of(lake_engine, GOLD)}


def test_a_merge_with_deletion_vectors_leaves_the_files_it_touches_in_place(
    lake_engine: LakeEngine,
) -> None:
    schema = ID_AND_N
    lake_engine.ensure_table(GOLD, schema, deletion_vectors=True)
    n = 2_000
    lake_engine.append(
        GOLD,
        pa.table({"Id": [f"001{i:06d}" for i in range(n)], "n": pa.array(range(n), pa.int64())}),
    )
    path = str(Path(lake_engine.location) / "gold" / "account")  # type: ignore[attr-defined]
    changes = pa.table({"Id": ["001000007", "001999999"], "n": pa.array([-7, -1], pa.int64())})
    metrics = lake_engine.merge(GOLD, changes, on=["Id"])
    assert (metrics.inserted, metrics.updated) == (1, 1)
    rows = {r["Id"]: r["n"] for r in rows_of(lake_engine, GOLD)}
    assert len(rows) == n + 1 and rows["001000007"] == -7 and rows["001000008"] == 8
    if isinstance(lake_engine, SparkEngine):
        # delta-spark marks the replaced row deleted: the file written first is still live.
        assert lake_engine.properties(GOLD)["delta.enableDeletionVectors"] == "true"
        last = lake_engine.history(GOLD)[0]
        assert last.operation == "MERGE"
        assert int(last.metrics["numTargetRowsCopied"]) == 0
        assert int(last.metrics["numTargetDeletionVectorsAdded"]) >= 1
    else:
        # delta-rs cannot write deletion vectors (nor read a table with them): the table stays
        # one every reader opens.
        table = DeltaTable(path)
        assert "delta.enableDeletionVectors" not in table.metadata().configuration
        assert table.to_pyarrow_table().num_rows == n + 1


def test_merge_errors(lake_engine: LakeEngine) -> None:
    lake_engine.merge(GOLD, pa.table({"Id": ["1"], "Name": ["a"]}), on=["Id"])
    duplicated = pa.table({"Id": ["1", "1"], "Name": ["b", "c"]})
    with pytest.raises(LakeError, match=r"merge into .*(multiple source rows|MULTIPLE_SOURCE)"):
        lake_engine.merge(GOLD, duplicated, on=["Id"])
    with pytest.raises(LakeError, match=r"key columns \['RecordId'\] are not in the source"):
        lake_engine.merge(GOLD, pa.table({"Id": ["1"]}), on=["RecordId"])
    with pytest.raises(LakeError, match="got 'Id', a str"):
        lake_engine.merge(GOLD, pa.table({"Id": ["1"]}), on="Id")  # type: ignore[arg-type]


def test_merge_evolves_the_schema(lake_engine: LakeEngine) -> None:
    lake_engine.merge(GOLD, pa.table({"Id": ["1"], "Name": ["a"]}), on=["Id"])
    lake_engine.merge(GOLD, pa.table({"Id": ["1"], "Rating": ["Hot"]}), on=["Id"])
    assert rows_of(lake_engine, GOLD) == [{"Id": "1", "Name": "a", "Rating": "Hot"}]


class HeldUntil:
    """Rows unchanged, once the file ``release`` exists (``started`` is created first): holds
    a statement reading them mid-way, in the Python worker that runs it."""

    def __init__(self, started: Path, release: Path) -> None:
        self.started = str(started)
        self.release = str(release)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        Path(self.started).touch()
        deadline = time.monotonic() + 300
        while not Path(self.release).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.release} never appeared")
            time.sleep(0.05)
        yield from batches


@SPARK_SESSIONS
def test_a_write_beside_a_merge_of_another_thread_takes_none_of_its_settings(
    session: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Delta takes a MERGE's txn and userMetadata from the session's settings, and so does
    every commit without writer options of its own: one of another thread sharing the session
    must not run while those are set (nor record that MERGE's txn as its own)."""
    engine = SparkEngine(request.getfixturevalue(session), location=tmp_path / "lake")
    schema = ID_AND_N
    engine.merge(GOLD, pa.table({"Id": ["1"], "n": pa.array([1], pa.int64())}), on=["Id"])
    engine.append(BRONZE, events(0, 1))
    started, release = tmp_path / "started", tmp_path / "release"
    held = engine.map_batches(
        engine.rows(pa.table({"Id": ["2"], "n": pa.array([2], pa.int64())}), schema),
        HeldUntil(started, release),
        schema,
    )
    failures: list[BaseException] = []

    def run(work: Any) -> threading.Thread:
        def target() -> None:
            try:
                work()
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        return thread

    merging = run(
        lambda: engine.merge(
            GOLD, held, on=["Id"], txn=Txn("gold:held", 1), metadata={"run": "held"}
        )
    )
    deadline = time.monotonic() + 300
    while not started.exists():
        assert not failures and time.monotonic() < deadline, failures
        time.sleep(0.05)
    # The MERGE is running (its settings are set): a write without a txn, and a CREATE TABLE.
    appending = run(lambda: engine.append(BRONZE, events(1, 1)))
    creating = run(lambda: engine.ensure_table(TableRef("silver", "other"), schema))
    appending.join(timeout=3)
    release.touch()
    for thread in (merging, appending, creating):
        thread.join(timeout=300)
    assert not failures, failures

    fresh = SparkEngine(engine.spark, location=tmp_path / "lake")  # reads the log anew
    assert fresh.txn_version(GOLD, "gold:held") == 1
    assert fresh.history(GOLD, limit=1)[0].metadata == {"run": "held"}
    assert fresh.txn_version(BRONZE, "gold:held") is None
    assert fresh.txn_version(TableRef("silver", "other"), "gold:held") is None
    for table in (BRONZE, TableRef("silver", "other")):
        assert [(h.txn, h.metadata) for h in fresh.history(table, limit=1)] == [(None, {})]
    assert ids(engine, engine.read(BRONZE)) == ["e0", "e1"]


@SPARK_SESSIONS
def test_a_txn_left_in_the_session_settings_makes_no_write_a_no_op(
    session: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Delta takes a txn from the session's settings when a write has none of its own, and
    skips the write once the table has that txn. Settings someone else left there (a notebook,
    a foreachBatch function stopped mid-MERGE on a Spark Connect session it shares) would make
    every write without a txn after the first a silent no-op; the engine's writes run without
    them, and leave them as they were."""
    spark = request.getfixturevalue(session)
    engine = SparkEngine(spark, location=tmp_path / "lake")
    schema = ID_AND_N

    def row(key: str, n: int) -> pa.Table:
        return pa.table({"Id": [key], "n": pa.array([n], pa.int64())})

    engine.ensure_table(GOLD, schema)
    left = {TXN_APP_ID_CONF: "someone:else", TXN_VERSION_CONF: "7"}
    for key, value in left.items():
        spark.conf.set(key, value)
    try:
        for n in range(3):
            merged = engine.merge(GOLD, row(f"m{n}", n), on=["Id"])
            assert not merged.skipped and merged.inserted == 1, merged
            appended = engine.append(BRONZE, events(n, 1))
            assert not appended.skipped and appended.rows == 1, appended
            updated = engine.update_columns(GOLD, row(f"m{n}", 10 + n), on=["Id"], columns=["n"])
            assert not updated.skipped and updated.updated == 1, updated
        assert {k: spark.conf.get(k, None) for k in left} == left
    finally:
        for key in left:
            spark.conf.unset(key)
    fresh = SparkEngine(spark, location=tmp_path / "lake")  # reads the log anew
    assert fresh.txn_version(GOLD, "someone:else") is None
    assert fresh.txn_version(BRONZE, "someone:else") is None
    got = rows_of(fresh, GOLD)
    assert sorted((r["Id"], r["n"]) for r in got) == [("m0", 10), ("m1", 11), ("m2", 12)]
    assert ids(fresh, fresh.read(BRONZE)) == ["e0", "e1", "e2"]


# -------------------------------------------------------------------- history and maintain


def test_history_records_operations_metadata_and_txn(lake_engine: LakeEngine) -> None:
    lake_engine.append(BRONZE, events(0, 1), txn=Txn("bronze", 1), metadata={"batch": "b1"})
    lake_engine.append(BRONZE, events(1, 1))
    lake_engine.merge(BRONZE, events(1, 1), on=["event_id"], metadata={"run": "r7"})
    history = lake_engine.history(BRONZE, limit=3)
    assert [h.operation for h in history] == ["MERGE", "WRITE", "WRITE"]
    assert history[2].metadata == {"batch": "b1"} and history[2].txn == Txn("bronze", 1)
    assert history[1].txn is None and history[0].metadata == {"run": "r7"}
    assert history[0].timestamp.tzinfo is not None
    assert len(lake_engine.history(BRONZE, limit=1)) == 1


def test_the_spark_engine_reads_its_commits_from_the_log_as_describe_history_shows_them(
    spark: Any, tmp_path: Path
) -> None:
    # After each write the spark engine reads what it committed (version, row counts, txn)
    # from the newest commit file of a local table's log, without DESCRIBE HISTORY's job.
    engine = SparkEngine(spark, location=tmp_path / "lake")
    access = engine._access
    fields = ("version", "operation", "operationMetrics", "userMetadata")

    def described() -> dict[str, Any]:
        (row,) = access.history_rows(BRONZE, 1)
        return {k: row[k] for k in fields}

    written = engine.append(BRONZE, events(0, 3), txn=Txn("bronze", 1), metadata={"b": "1"})
    assert access.newest_commit(BRONZE) == described()
    assert (written.version, written.rows) == (described()["version"], 3)
    merged = engine.merge(BRONZE, events(2, 2), on=["event_id"], txn=Txn("gold", 4))
    assert access.newest_commit(BRONZE) == described()
    assert (merged.version, merged.inserted, merged.updated) == (described()["version"], 1, 1)
    engine.maintain(BRONZE)  # a log checkpoint of the newest version beside its commit file
    engine.append(BRONZE, events(4, 1))
    assert access.newest_commit(BRONZE) == described()
    assert engine.txn_version(BRONZE, "bronze") == 1 and engine.txn_version(BRONZE, "gold") == 4


def test_vacuum_deletes_unreferenced_files(lake_engine: LakeEngine) -> None:
    for i in range(3):
        lake_engine.append(BRONZE, events(i, 1))
    lake_engine.maintain(BRONZE, checkpoint=False)
    path = Path(lake_engine.location) / "bronze" / "account_change_event"  # type: ignore[attr-defined]

    def parquet() -> list[Path]:
        return sorted(path.glob("*.parquet"))

    assert len(parquet()) == 4
    lake_engine.maintain(BRONZE, compact=False, checkpoint=False, vacuum_hours=0)
    assert len(parquet()) == 1
    assert ids(lake_engine, lake_engine.read(BRONZE)) == ["e0", "e1", "e2"]


def test_vacuum_with_a_retention_of_seconds_keeps_it_for_a_whole_hour(
    lake_engine: LakeEngine,
) -> None:
    path = Path(lake_engine.location) / "bronze" / "account_change_event"  # type: ignore[attr-defined]
    for i in range(3):
        lake_engine.append(BRONZE, events(i, 1))
    lake_engine.maintain(BRONZE, checkpoint=False)  # the 3 appended files leave the table
    assert len(list(path.glob("*.parquet"))) == 4
    vacuumed = lake_engine.maintain(
        BRONZE, compact=False, checkpoint=False, vacuum_hours=5 / 3600
    ).vacuumed_files
    # Both engines' VACUUM count whole hours and round a fraction up (Delta Spark would round
    # 5 s down to nothing and delete every unreferenced file): nothing goes yet.
    assert len(list(path.glob("*.parquet"))) == 4
    assert vacuumed == 0
    assert ids(lake_engine, lake_engine.read(BRONZE)) == ["e0", "e1", "e2"]


def test_read_of_an_old_version_and_missing_tables(lake_engine: LakeEngine) -> None:
    first = lake_engine.append(BRONZE, events(0, 1)).version
    lake_engine.append(BRONZE, events(1, 1))
    assert ids(lake_engine, lake_engine.read(BRONZE, version=first)) == ["e0"]
    with pytest.raises(LakeError):
        lake_engine.to_arrow(lake_engine.read(BRONZE, version=70))
    missing = TableRef("silver", "nothing_here")
    assert not lake_engine.exists(missing) and lake_engine.version(missing) is None
    assert lake_engine.schema(missing) is None
    with pytest.raises(LakeError, match=r"does not exist"):
        lake_engine.read(missing)


# ----------------------------------------------------------------------------- execution


class PlusOne:
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield pa.RecordBatch.from_arrays(
                [batch.column(0), pc.add(batch.column(1), 1)], names=["k", "n"]
            )


class Totals:
    """Per key: the sum of ``n`` -- wrong unless every row of a key is in one call."""

    def __call__(self, table: pa.Table) -> pa.Table:
        grouped = table.group_by("k").aggregate([("n", "sum")])
        return pa.table({"k": grouped.column("k"), "n": grouped.column("n_sum")})


KN = T.StructType([T.StructField("k", T.StringType()), T.StructField("n", T.LongType())])


def test_layer_functions_run_where_the_engine_puts_them(lake_engine: LakeEngine) -> None:
    data = pa.table(
        {"k": [f"k{i % 7}" for i in range(1000)], "n": pa.array(range(1000), pa.int64())}
    )
    rows = lake_engine.rows(data, KN)
    mapped = lake_engine.map_batches(rows, PlusOne(), KN)
    assert lake_engine.count(mapped) == 1000
    both = lake_engine.union([rows, mapped], KN)
    totals = lake_engine.persist(
        lake_engine.map_groups(both, key="k", function=Totals(), schema=KN, partitions=3)
    )
    got = {r["k"]: r["n"] for r in lake_engine.to_arrow(totals).to_pylist()}
    expected: dict[str, int] = {}
    for i in range(1000):
        expected[f"k{i % 7}"] = expected.get(f"k{i % 7}", 0) + 2 * i + 1
    assert got == expected
    lake_engine.release(totals)


# ------------------------------------------------------------------ one lake, two engines


def test_each_engine_reads_and_continues_what_the_other_wrote(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    local = LocalEngine(location=lake)
    remote = SparkEngine(spark, location=lake)
    first = local.append(BRONZE, events(0, 2), txn=Txn("b", 1)).version
    remote.append(BRONZE, events(2, 2), txn=Txn("b", 2))
    local.append_parts(BRONZE, [(events(4, 1), Txn("b", 3)), (events(5, 1), Txn("c", 1))])
    assert remote.txn_version(BRONZE, "b") == 3 and remote.txn_version(BRONZE, "c") == 1
    assert local.txn_version(BRONZE, "b") == 3
    assert remote.append(BRONZE, events(4, 1), txn=Txn("b", 3)).skipped
    remote.maintain(BRONZE)  # OPTIMIZE by delta-spark, then delta-rs appends again
    local.append(BRONZE, events(6, 1), txn=Txn("b", 4))
    remote.ensure_table(
        BRONZE,
        T.StructType([*remote.schema(BRONZE).fields, T.StructField("extra", T.LongType())]),  # type: ignore[union-attr]
    )
    local.append(BRONZE, events(7, 1, extra=pa.array([7], pa.int64())))
    local.maintain(BRONZE)  # delta-rs compaction and checkpoint, read by delta-spark
    expected = [f"e{i}" for i in range(8)]
    assert ids(local, local.read(BRONZE)) == expected
    assert ids(remote, remote.read(BRONZE)) == expected
    appended = remote.read_appends(BRONZE, after_version=first)
    assert not appended.full_read
    assert ids(remote, appended.rows) == expected[2:]
    assert ids(local, local.read_appends(BRONZE, after_version=first).rows) == expected[2:]


def test_spark_engine_names_catalog_tables_with_three_parts(spark: Any, tmp_path: Path) -> None:
    engine = SparkEngine(
        spark, catalog="spark_catalog", schemas=SchemasSpec(bronze="uc_bronze_test")
    )
    table = TableRef("bronze", "three_parts")
    assert engine.qualified_name(table) == "`spark_catalog`.`uc_bronze_test`.`three_parts`"
    engine.append(table, events(0, 2), txn=Txn("b", 1))
    assert engine.exists(table) and engine.txn_version(table, "b") == 1
    assert engine.append(table, events(0, 2), txn=Txn("b", 1)).skipped
    assert ids(engine, engine.read(table)) == ["e0", "e1"]
    assert engine.register_sql([table]) == ["`spark_catalog`.`uc_bronze_test`.`three_parts`"]
    (row,) = engine.sql(
        "SELECT count(*) AS n FROM spark_catalog.uc_bronze_test.three_parts"
    ).collect()
    assert row.n == 2
    spark.sql("DROP SCHEMA spark_catalog.uc_bronze_test CASCADE")


def test_tables_lists_the_tables_of_a_lake(lake_engine: LakeEngine) -> None:
    lake_engine.append(BRONZE, events(0, 2))
    lake_engine.ensure_table(GOLD, T.StructType([T.StructField("Id", T.StringType())]))
    assert set(lake_engine.tables()) == {BRONZE, GOLD}


def test_arrow_reads_of_both_engines_agree(lake_engine: LakeEngine) -> None:
    lake_engine.append(BRONZE, events(0, 5, batch=pa.array([1, 1, 2, 2, 3], pa.int64())))
    picked = lake_engine.read_arrow(
        BRONZE, columns=["event_id"], where=[("batch", ">=", 2), ("event_id", "!=", "e3")]
    )
    assert sorted(picked.column("event_id").to_pylist()) == ["e2", "e4"]
    assert arrow_of(lake_engine, BRONZE).num_rows == 5


def test_a_merge_of_some_columns_keeps_null_structs_null(lake_engine: LakeEngine) -> None:
    address = pa.struct([("City", pa.string()), ("PostalCode", pa.string())])
    first = pa.table(
        {
            "Id": ["1", "2"],
            "Address": pa.array([None, {"City": "Lyon", "PostalCode": None}], address),
            "n": pa.array([1, 2], pa.int64()),
        }
    )
    lake_engine.merge(GOLD, first, on=["Id"])
    # A source without ``n``: only the columns it has change; an empty compound stays NULL.
    later = pa.table({"Id": ["2", "3"], "Address": pa.array([None, None], address)})
    lake_engine.merge(GOLD, later, on=["Id"])
    rows = {r["Id"]: r for r in rows_of(lake_engine, GOLD)}
    assert rows == {
        "1": {"Id": "1", "Address": None, "n": 1},
        "2": {"Id": "2", "Address": None, "n": 2},
        "3": {"Id": "3", "Address": None, "n": None},
    }
