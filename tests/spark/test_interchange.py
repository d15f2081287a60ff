"""sfcdc's writers and delta-spark's on one table, in random order, judged by delta-spark.

A stateful property-based test (hypothesis): a table created by delta-spark -- plain, or with
deletion vectors, column mapping, row tracking or V2 checkpoints -- gets a random sequence of
sfcdc appends (its own commits where the table allows them), delta-rs appends, delta-spark
appends, OPTIMIZE and MERGE, a schema change, sfcdc's gold MERGE, ``sfcdc maintain`` with a
retention of zero, and checkpoints (multi-part ones too). After every step delta-spark --
and delta-rs, on the tables it reads -- holds the rows of a model of the table, and
delta-spark's change data feed holds the model's changes of every version since the last
maintenance; a filter on the longest text finds its rows (file statistics bound them). A
table with features never gets a commit written by sfcdc itself: sfcdc's writes to it go
through delta-spark (the spark engine).

CI runs one fixed example of five steps per kind of table (the ``ci`` profile: derandomized,
so the same steps every run); ``SFCDC_HYPOTHESIS_PROFILE=long python -m pytest -n 0
tests/spark/test_interchange.py`` runs twelve random examples of fourteen steps per kind.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pipelines.engines import LakeEngine, SparkEngine, TableRef, Txn
from pipelines.engines.local import LocalEngine

# Every step runs Spark jobs (the spark engine's maintenance several): minutes per kind of table
# on a busy machine.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]

settings.register_profile(
    "ci",
    max_examples=1,
    stateful_step_count=5,
    derandomize=True,
    deadline=None,
    # Each step runs Spark jobs: a failure is reported as found, not shrunk.
    phases=[Phase.explicit, Phase.generate],
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=12,
    stateful_step_count=14,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("SFCDC_HYPOTHESIS_PROFILE", "ci")

TABLE = TableRef("silver", "interchange")
KEYS = [f"k{i}" for i in range(8)]
# Table features and what delta-rs does with them (1.6.6: it refuses deletion vectors and v2
# checkpoints, reads a column-mapped table as nulls, and writes neither column mapping nor row
# tracking).
FEATURES: dict[str, dict[str, str]] = {
    "plain": {},
    "deletion_vectors": {"delta.enableDeletionVectors": "true"},
    "column_mapping": {
        "delta.columnMapping.mode": "name",
        "delta.minReaderVersion": "2",
        "delta.minWriterVersion": "5",
    },
    "row_tracking": {"delta.enableRowTracking": "true"},
    "v2_checkpoints": {"delta.checkpointPolicy": "v2"},
}
DELTA_RS_READS = {"plain", "row_tracking"}
DELTA_RS_WRITES = {"plain"}
PART_SIZE = "spark.databricks.delta.checkpoint.partSize"

texts = st.one_of(
    st.text(alphabet="abcxyz", min_size=0, max_size=6),
    st.text(alphabet="abcé\U0001f600z", min_size=30, max_size=45),  # cut in statistics
)
rows_strategy = st.lists(
    st.tuples(st.sampled_from(KEYS), st.integers(-5, 5), st.one_of(st.none(), texts)),
    min_size=1,
    max_size=4,
)
merge_strategy = st.lists(
    st.tuples(st.sampled_from(KEYS), st.integers(-5, 5), st.one_of(st.none(), texts)),
    min_size=1,
    max_size=4,
    unique_by=lambda r: r[0],
)


def _spark_rows(frame: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r[c] for c in columns) for r in frame.collect()), key=repr)


class Interchange(RuleBasedStateMachine):
    spark: Any
    root: Path
    features: str

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[Any, ...]] = []
        self.columns = ["Id", "n", "s"]
        # version -> Counter of (change type, row) the change feed must hold
        self.changes: dict[int, Counter[tuple[Any, ...]]] = {}
        self.feed_from = 1
        self.txn = 0

    # ------------------------------------------------------------------------- set-up

    @initialize()
    def create(self) -> None:
        features = self.features
        self.lake = self.root / f"lake-{os.getpid()}"
        shutil.rmtree(self.lake, ignore_errors=True)
        self.path = str(self.lake / TABLE.layer / TABLE.name)
        properties = {"delta.enableChangeDataFeed": "true", **FEATURES[features]}
        props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        self.spark.sql(
            f"CREATE TABLE delta.`{self.path}` (Id STRING, n BIGINT, s STRING) USING delta "
            f"TBLPROPERTIES ({props})"
        )
        self.local = LocalEngine(location=self.lake)
        self.spark_engine = SparkEngine(self.spark, location=self.lake)

    @property
    def sfcdc(self) -> LakeEngine:
        """sfcdc's engine for this table: the local one where delta-rs writes it, else the
        spark engine (a table with features never gets a commit sfcdc writes itself)."""
        return self.local if self.features in DELTA_RS_WRITES else self.spark_engine

    # ---------------------------------------------------------------------- the model

    def _version(self) -> int:
        # Delta's own log object: no Spark job for a number.
        jvm = self.spark._jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, self.path)
        return int(log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()).version())

    def _arrow(self, rows: list[tuple[Any, ...]]) -> pa.Table:
        full = [(*r, *([None] * (len(self.columns) - len(r)))) for r in rows]
        arrays = {
            c: pa.array([r[i] for r in full], pa.int64() if c == "n" else pa.string())
            for i, c in enumerate(self.columns)
        }
        return pa.table(arrays)

    def _row(self, r: tuple[Any, ...]) -> tuple[Any, ...]:
        return (*r, *([None] * (len(self.columns) - len(r))))

    def _appended(self, rows: list[tuple[Any, ...]]) -> None:
        full = [self._row(r) for r in rows]
        self.rows += full
        self.changes[self._version()] = Counter(("insert", *r) for r in full)

    def _merged(self, source: list[tuple[Any, ...]]) -> None:
        change: Counter[tuple[Any, ...]] = Counter()
        by_key = {r[0]: self._row(r) for r in source}
        out = []
        for row in self.rows:
            new = by_key.get(row[0])
            if new is None:
                out.append(row)
            else:
                out.append(new)
                change[("update_preimage", *row)] += 1
                change[("update_postimage", *new)] += 1
        matched = {r[0] for r in self.rows}
        for key, new in by_key.items():
            if key not in matched:
                out.append(new)
                change[("insert", *new)] += 1
        self.rows = out
        if change:
            self.changes[self._version()] = change

    # ---------------------------------------------------------------------- the steps

    @rule(rows=rows_strategy)
    def sfcdc_append(self, rows: list[tuple[Any, ...]]) -> None:
        self.txn += 1
        self.sfcdc.append(TABLE, self._arrow(rows), txn=Txn("sfcdc.test", self.txn))
        self._appended(rows)

    @precondition(lambda self: self.features in DELTA_RS_WRITES)
    @rule(rows=rows_strategy)
    def delta_rs_append(self, rows: list[tuple[Any, ...]]) -> None:
        write_deltalake(self.path, self._arrow(rows), mode="append")
        self._appended(rows)

    @rule(rows=rows_strategy)
    def spark_append(self, rows: list[tuple[Any, ...]]) -> None:
        frame = self.spark.createDataFrame(self._arrow(rows).to_pandas())
        frame.write.format("delta").mode("append").save(self.path)
        self._appended(rows)

    @rule()
    def spark_optimize(self) -> None:
        self.spark.sql(f"OPTIMIZE delta.`{self.path}`").collect()

    @rule(source=merge_strategy)
    def spark_merge(self, source: list[tuple[Any, ...]]) -> None:
        self.spark.createDataFrame(self._arrow(source).to_pandas()).createOrReplaceTempView("src")
        self.spark.sql(
            f"MERGE INTO delta.`{self.path}` AS t USING src AS s ON t.Id = s.Id "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        ).collect()
        self._merged(source)

    @precondition(lambda self: "extra" not in self.columns)
    @rule()
    def add_column(self) -> None:
        self.spark.sql(f"ALTER TABLE delta.`{self.path}` ADD COLUMNS (extra STRING)")
        self.columns.append("extra")
        self.rows = [self._row(r) for r in self.rows]
        self.changes = {
            v: Counter({(*k, None): n for k, n in c.items()}) for v, c in self.changes.items()
        }

    @rule(source=merge_strategy)
    def sfcdc_gold_merge(self, source: list[tuple[Any, ...]]) -> None:
        self.txn += 1
        self.sfcdc.merge(TABLE, self._arrow(source), on=["Id"], txn=Txn("sfcdc.test", self.txn))
        self._merged(source)

    @rule()
    def sfcdc_maintain(self) -> None:
        # Tombstones are left at Delta's week: delta-spark refuses to read the change feed of
        # a version older than delta.deletedFileRetentionDuration, which the local engine
        # shortens on tables only it reads (docs/operations.md, Tombstones).
        self.sfcdc.maintain(TABLE, vacuum_hours=0, log_hours=0)
        # Time travel and the change feed of versions before maintenance are gone by design.
        self.feed_from = self._version() + 1
        self.changes = {}

    @rule(parts=st.sampled_from([None, 1, 2]))
    def checkpoint(self, parts: int | None) -> None:
        jvm = self.spark._jvm
        if parts is not None:
            self.spark.conf.set(PART_SIZE, str(parts))
        try:
            log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
                self.spark._jsparkSession, self.path
            )
            log.checkpoint()
        finally:
            self.spark.conf.unset(PART_SIZE)

    # ------------------------------------------------------------------ the judgement

    @invariant()
    def delta_spark_reads_the_model(self) -> None:
        if not hasattr(self, "path"):
            return
        frame = self.spark.read.format("delta").load(self.path)
        assert _spark_rows(frame, self.columns) == sorted(self.rows, key=repr)
        latest = self._version()
        if self.feed_from <= latest:
            feed = (
                self.spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", self.feed_from)
                .load(self.path)
            )
            got: dict[int, Counter[tuple[Any, ...]]] = {}
            for r in feed.collect():
                row = (r["_change_type"], *(r[c] for c in self.columns))
                got.setdefault(int(r["_commit_version"]), Counter())[row] += 1
            assert got == self.changes
        longest = max((r[2] for r in self.rows if r[2] is not None), key=len, default=None)
        if longest is not None:
            hits = frame.filter(frame["s"] == longest).count()
            assert hits == sum(1 for r in self.rows if r[2] == longest)
        if self.features != "plain":
            history = self.spark.sql(f"DESCRIBE HISTORY delta.`{self.path}`").collect()
            assert all((h["engineInfo"] or "") != "sfcdc" for h in history)

    @invariant()
    def delta_rs_reads_the_model(self) -> None:
        if not hasattr(self, "path") or self.features not in DELTA_RS_READS:
            return
        table = DeltaTable(self.path).to_pyarrow_table()
        rows = [tuple(r[c] for c in self.columns) for r in table.to_pylist()]
        assert sorted(rows, key=repr) == sorted(self.rows, key=repr)


@pytest.mark.parametrize("features", sorted(FEATURES))
def test_sfcdc_delta_rs_and_delta_spark_interleaved(
    spark: Any, tmp_path: Path, features: str
) -> None:
    Interchange.spark = spark
    Interchange.root = tmp_path
    Interchange.features = features
    case = Interchange.TestCase()
    case.settings = settings.get_profile(PROFILE)
    case.runTest()
