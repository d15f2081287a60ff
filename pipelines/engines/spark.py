"""The ``spark`` lake engine: delta-spark on Databricks or any Spark cluster with the Delta jars.

Where tables live:

- with a ``catalog`` (Unity Catalog on Databricks, or any catalog of the session), tables are
  the catalog's managed tables named ```catalog`.`schema`.`table```;
- without one, tables are Delta directories under ``location`` (``<location>/<layer>/<prefix>
  <name>``, the local engine's layout, so either engine reads and writes the other's lake),
  registered in the session catalog as ```schema`.`table``` external tables.

The layer functions run on the executors: :meth:`SparkEngine.map_batches` is ``mapInArrow``,
:meth:`SparkEngine.map_groups` repartitions by the key and runs the function on each
partition's rows. Everything else is plain Delta Spark:

- appends and overwrites are ``DataFrameWriter.saveAsTable`` with ``format("delta")``;
  idempotency uses Delta's own ``txnAppId`` / ``txnVersion`` writer options (and, for MERGE,
  the ``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` session settings), so Delta
  itself skips a write it has already committed;
- merges are ``MERGE [WITH SCHEMA EVOLUTION] INTO ... USING`` a temporary view;
- Delta takes some settings of a MERGE from the session rather than the statement (its
  application transaction, its commit's ``userMetadata``, schema evolution), and every write
  without writer options of its own takes them from there too. A write that sets them, or
  would take another thread's, holds the session's lock while it runs (:func:`session_lock`);
  appends and overwrites with a transaction carry all of them as writer options and run
  beside it;
- ``read_appends`` reads the change data feed (inserts) of the version range, which is why
  every table has ``delta.enableChangeDataFeed`` on;
- history, table properties, OPTIMIZE and VACUUM are SQL. Delta Spark writes log checkpoints
  by itself (every ``delta.checkpointInterval`` commits) and cleans the log up after them.

SQL and the DataFrame API only, so the same engine runs on a classic session and over Spark
Connect (Databricks serverless and standard access mode, where Python has no JVM gateway).
The one exception is optional: ``one_commit_appends`` commits several parts with their
transactions at once through Delta's classes over the py4j gateway of a classic session
(:mod:`pipelines.engines.spark_write`).

The writes (and their application transactions) are in :mod:`pipelines.engines.spark_write`,
table creation, history and maintenance in :mod:`pipelines.engines.spark_tables`; the SQL text,
writer options and history parsing are plain functions in :mod:`pipelines.engines.spark_sql`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from ingest.errors import LakeError
from pipelines.engines.arrow import arrow_to_dataframe, dataframe_to_arrow
from pipelines.engines.base import (
    CDF_PROPERTY,
    DEFAULT_PROPERTIES,
    LAYERS,
    BatchFunction,
    Condition,
    TableChanges,
    TableFunction,
    TableRef,
    check_until,
)
from pipelines.engines.spark_sql import PRESERVE_NULL_STRUCTS, history_entry, select_sql
from pipelines.engines.spark_tables import SparkTablesMixin
from pipelines.engines.spark_write import SparkWriteMixin, _TxnIndex
from pipelines.engines.sql import (
    quote_identifier,
    quote_string,
    spark_type_sql,
)
from pipelines.engines.writable import check_writable
from pipelines.spec.fields import has_scheme
from pipelines.spec.models import LakeSpec, SchemasSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["SparkEngine", "session_lock"]

_log = logging.getLogger(__name__)

_SESSION_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_SESSION_LOCKS_GUARD = threading.Lock()


def session_lock(spark: SparkSession) -> threading.RLock:
    """The lock of this process's writes that depend on ``spark``'s settings: one per
    session, whichever engines share it."""
    with _SESSION_LOCKS_GUARD:
        lock = _SESSION_LOCKS.get(spark)
        if lock is None:
            lock = _SESSION_LOCKS[spark] = threading.RLock()
        return lock


# ----------------------------------------------------------------------------- the engine


class _PerPartition:
    """Runs a :data:`~pipelines.engines.base.TableFunction` on all the rows of a partition
    (``mapInArrow`` after a repartition by key): picklable."""

    def __init__(self, function: TableFunction) -> None:
        self.function = function

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = list(batches)
        if not collected:
            return
        result = self.function(pa.Table.from_batches(collected))
        yield from result.to_batches()


class SparkEngine(SparkWriteMixin, SparkTablesMixin):
    """Delta tables through delta-spark: catalog tables (Unity Catalog on Databricks) when a
    ``catalog`` is given, else Delta directories under ``location``."""

    name: Literal["spark"] = "spark"

    def __init__(
        self,
        spark: SparkSession,
        *,
        catalog: str | None = None,
        location: str | Path | None = None,
        schemas: SchemasSpec | None = None,
        table_prefix: str = "",
        default_properties: Mapping[str, str] = DEFAULT_PROPERTIES,
        one_commit_appends: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if catalog is None and location is None:
            raise LakeError("the spark engine needs a catalog or a location for its tables")
        self._spark = spark
        self.catalog = catalog
        self.location = None if catalog else _absolute(location)
        self.schemas = schemas or SchemasSpec()
        self.table_prefix = table_prefix
        self.default_properties = dict(default_properties)
        self.one_commit_appends = one_commit_appends
        self._clock = clock
        self._writable = False
        self._txn_indexes: dict[TableRef, _TxnIndex] = {}
        # Per table: the version at which ensure_table last found it as asked, and what.
        self._ensured: dict[TableRef, tuple[int, tuple[str, tuple[tuple[str, str], ...]]]] = {}
        self._settings_lock = session_lock(spark)
        # What every write of the engine wants, set once: no write changes them back.
        for key, value in PRESERVE_NULL_STRUCTS.items():
            spark.conf.set(key, value)

    @classmethod
    def from_spec(
        cls, lake: LakeSpec, spark: SparkSession, *, clock: Callable[[], float] = time.perf_counter
    ) -> SparkEngine:
        """Catalog tables when ``lake.catalog`` is set, else tables under ``lake.location``."""
        return cls(
            spark,
            catalog=lake.catalog,
            location=None if lake.catalog else lake.location,
            schemas=lake.schemas,
            table_prefix=lake.table_prefix,
            clock=clock,
        )

    def __repr__(self) -> str:
        where = f"catalog={self.catalog!r}" if self.catalog else f"location={self.location!r}"
        return f"SparkEngine({where})"

    @property
    def spark(self) -> SparkSession:
        return self._spark

    # ------------------------------------------------------------------------- naming

    def _parts(self, table: TableRef) -> list[str]:
        schema = self.schemas.for_layer(table.layer)
        parts = [schema, f"{self.table_prefix}{table.name}"]
        return [self.catalog, *parts] if self.catalog else parts

    def qualified_name(self, table: TableRef) -> str:
        return ".".join(quote_identifier(p) for p in self._parts(table))

    def schema_name(self, layer: str) -> str:
        schema = self.schemas.for_layer(layer)  # type: ignore[arg-type]
        parts = [self.catalog, schema] if self.catalog else [schema]
        return ".".join(quote_identifier(p) for p in parts)

    def path(self, table: TableRef) -> str:
        """Directory of ``table`` (location mode): ``<location>/<layer>/<prefix><name>``."""
        if self.location is None:
            raise LakeError(f"{table} is a catalog table ({self.qualified_name(table)}): no path")
        return f"{self.location}/{table.layer}/{self.table_prefix}{table.name}"

    def _ident(self, table: TableRef) -> str:
        """How SQL names the table itself: its catalog name, or ``delta.`<path>```."""
        if self.location is None:
            return self.qualified_name(table)
        return f"delta.{quote_identifier(self.path(table))}"

    # ------------------------------------------------------------------------ helpers

    def _sql(self, text: str) -> DataFrame:
        _log.debug("spark sql: %s", text)
        return self._spark.sql(text)

    @contextlib.contextmanager
    def _session_conf(self, values: Mapping[str, str] | None = None) -> Iterator[None]:
        """Run the block with the session's lock held and ``values`` set in its settings
        (restored after): no other write of this process runs with them, nor changes them
        meanwhile."""
        with self._settings_lock:
            conf = self._spark.conf
            previous = {key: conf.get(key, None) for key in values or {}}
            for key, value in (values or {}).items():
                conf.set(key, value)
            try:
                yield
            finally:
                for key, old in previous.items():
                    if old is None:
                        conf.unset(key)
                    else:
                        conf.set(key, old)

    @contextlib.contextmanager
    def _errors(self, action: str, table: TableRef) -> Iterator[None]:
        try:
            yield
        except LakeError:
            raise
        except Exception as exc:  # py4j and pyspark raise many types; keep the cause
            raise LakeError(f"{action} {self._ident(table)} ({table}) failed: {exc}") from exc

    def _history_rows(self, table: TableRef, limit: int | None) -> list[dict[str, Any]]:
        text = f"DESCRIBE HISTORY {self._ident(table)}"
        if limit is not None:
            text += f" LIMIT {int(limit)}"
        with self._errors("read the history of", table):
            return [row.asDict(recursive=True) for row in self._sql(text).collect()]

    def _require(self, table: TableRef) -> int:
        """The table's version; a :class:`LakeError` when it does not exist."""
        version = self.version(table)
        if version is None:
            raise self._missing(table)
        return version

    def _require_exists(self, table: TableRef) -> None:
        """A :class:`LakeError` when the table does not exist (its version, which reading
        takes a Spark job, is not read)."""
        if not self.exists(table):
            raise self._missing(table)

    def _missing(self, table: TableRef) -> LakeError:
        return LakeError(f"table {self.qualified_name(table)} ({table}) does not exist")

    def _dataframe(self, data: Any) -> DataFrame:
        if isinstance(data, pa.Table):
            return self.rows(data)
        frame: DataFrame = data
        return frame

    def _reader(self, table: TableRef) -> Any:
        return self._spark.read.format("delta")

    def _load(self, reader: Any, table: TableRef) -> DataFrame:
        frame: DataFrame = (
            reader.table(self.qualified_name(table))
            if self.location is None
            else reader.load(self.path(table))
        )
        return frame

    # ----------------------------------------------------------------------- metadata

    def ensure_writable(self) -> None:
        location = self.location
        if self._writable or location is None or "://" in location:
            return  # catalog tables and object storage: their permissions are theirs to say
        check_writable(Path(location.removeprefix("file:")))
        self._writable = True

    def exists(self, table: TableRef) -> bool:
        if self.location is None:
            # Identifiers are validated plain names, so the dotted form needs no quoting.
            return bool(self._spark.catalog.tableExists(".".join(self._parts(table))))
        path = self.path(table)
        if "://" not in path:
            return _has_commit(Path(path, "_delta_log"))
        try:
            self._sql(f"DESCRIBE HISTORY {self._ident(table)} LIMIT 1").collect()
        except Exception:  # not a Delta table (yet): Spark raises its analysis errors
            return False
        return True

    def version(self, table: TableRef) -> int | None:
        if self.location is not None and "://" not in (path := self.path(table)):
            # A table on this machine's disk: its newest commit file, as Delta finds it (a
            # listing of the log). DESCRIBE HISTORY reads the same number in a Spark job.
            return _newest_commit(Path(path, "_delta_log"))
        if not self.exists(table):
            return None
        rows = self._history_rows(table, 1)
        return int(rows[0]["version"]) if rows else None

    def schema(self, table: TableRef) -> StructType | None:
        if not self.exists(table):
            return None
        with self._errors("read the schema of", table):
            return self._load(self._reader(table), table).schema

    # ------------------------------------------------------------------------- reading

    def read(
        self, table: TableRef, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        self._require_exists(table)
        reader = self._reader(table)
        if version is not None:
            reader = reader.option("versionAsOf", str(int(version)))
        with self._errors("read", table):
            df = self._load(reader, table)
            if version is not None:
                # Spark Connect analyses a plan when it is first used: a version the table
                # does not have fails here, as on a classic session.
                df.schema  # noqa: B018
        return df if columns is None else df.select(*[quote_identifier(c) for c in columns])

    def read_keyed(
        self, table: TableRef, *, key: str, keys: Any, columns: Sequence[str] | None = None
    ) -> DataFrame:
        # Columns come from their DataFrames, never from pyspark.sql.functions: those build
        # classic or Spark Connect columns by the process's mode, not by this session's.
        frame = self._dataframe(keys)
        wanted = frame.select(frame[quote_identifier(key)].alias(key))
        # The batch's keys are few next to the table's rows: broadcast them, so the table's
        # rows are filtered where they are read instead of being shuffled for the join.
        ids = wanted.where(wanted[quote_identifier(key)].isNotNull()).distinct().hint("broadcast")
        return self.read(table, columns=columns).join(ids, on=key, how="left_semi")

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        self._require_exists(table)
        text = select_sql(self._ident(table), columns, where)
        with self._errors("read", table):
            return dataframe_to_arrow(self._sql(text))

    def read_appends(
        self,
        table: TableRef,
        *,
        after_version: int | None,
        until_version: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> TableChanges:
        latest = self._require(table)
        current = check_until(table, latest, after_version, until_version)
        if after_version is None:
            return TableChanges(
                table, self.read(table, version=current, columns=columns), 0, current
            )
        if after_version == current:
            empty = self.read(table, version=current, columns=columns).limit(0)
            return TableChanges(table, empty, None, current)
        reason = self._incremental_obstacle(table, after_version + 1, current, latest)
        if reason is not None:
            _log.warning(
                "%s: cannot read the rows added after version %d from the change data feed "
                "(%s); reading the whole table at version %d instead",
                table,
                after_version,
                reason,
                current,
            )
            rows = self.read(table, version=current, columns=columns)
            return TableChanges(table, rows, after_version + 1, current, True)
        reader = (
            self._reader(table)
            .option("readChangeFeed", "true")
            .option("startingVersion", str(after_version + 1))
            .option("endingVersion", str(current))
        )
        with self._errors("read the change data feed of", table):
            df = self._load(reader, table).where("_change_type = 'insert'")
        df = df.drop("_change_type", "_commit_version", "_commit_timestamp")
        if columns is not None:
            df = df.select(*[quote_identifier(c) for c in columns])
        return TableChanges(table, df, after_version + 1, current)

    def _incremental_obstacle(
        self, table: TableRef, first: int, last: int, latest: int
    ) -> str | None:
        if self.properties(table).get(CDF_PROPERTY, "false").lower() != "true":
            return f"{CDF_PROPERTY} is off; ensure_table turns it on"
        since = [history_entry(r) for r in self._history_rows(table, latest - first + 1)]
        since = [e for e in since if e.version >= first]
        if not set(range(first, last + 1)) <= {e.version for e in since}:
            return "part of the range is no longer in the table history"
        for entry in since:
            if (
                entry.version <= last
                and entry.operation in ("SET TBLPROPERTIES", "UNSET TBLPROPERTIES")
                and CDF_PROPERTY in str(entry.parameters)
            ):
                return f"{CDF_PROPERTY} changed in version {entry.version}"
            # The feed of a version reads the files it added; a vacuum since may have deleted
            # them (compacted away, then unreferenced long enough): those of the versions
            # committed before its horizon (its time minus its retention), which
            # pipelines.maintenance keeps before the oldest version a consumer needs.
            if entry.operation.startswith("VACUUM") and entry.operation != "VACUUM END":
                retention = _vacuum_retention_ms(entry.parameters)
                for read in since:
                    if not first <= read.version < entry.version or read.operation in _NO_DATA:
                        continue
                    if retention is None or read.timestamp < entry.timestamp - timedelta(
                        milliseconds=retention
                    ):
                        return (
                            f"version {entry.version} ({entry.operation}) may have deleted the "
                            f"files of version {read.version}"
                        )
        return None

    # ---------------------------------------------------------------------- execution

    def rows(self, data: pa.Table, schema: StructType | None = None) -> DataFrame:
        # Rows of this process: one partition, so that writing them makes one file.
        return arrow_to_dataframe(self._spark, data, schema).coalesce(1)

    def map_batches(self, rows: Any, function: BatchFunction, schema: StructType) -> DataFrame:
        return self._dataframe(rows).mapInArrow(function, schema)  # type: ignore[arg-type]

    def map_groups(
        self,
        rows: Any,
        *,
        key: str,
        function: TableFunction,
        schema: StructType,
        partitions: int | None = None,
    ) -> DataFrame:
        frame = self._dataframe(rows)
        column = frame[quote_identifier(key)]
        grouped = frame.repartition(partitions, column) if partitions else frame.repartition(column)
        return grouped.mapInArrow(_PerPartition(function), schema)  # type: ignore[arg-type]

    def union(self, parts: Sequence[Any], schema: StructType) -> DataFrame:
        frames = [self.rows(p, schema) if isinstance(p, pa.Table) else p for p in parts] or [
            self._spark.createDataFrame([], schema)
        ]
        shaped = [
            f.selectExpr(
                *[
                    "CAST({} AS {}) AS {}".format(
                        quote_identifier(field.name) if field.name in f.columns else "NULL",
                        spark_type_sql(field.dataType),
                        quote_identifier(field.name),
                    )
                    for field in schema.fields
                ]
            )
            for f in frames
        ]
        out = shaped[0]
        for frame in shaped[1:]:
            out = out.unionByName(frame)
        return out

    def persist(self, rows: Any) -> DataFrame:
        # Computed now and cut off from the tables it was read from: a cached DataFrame would
        # be recomputed when Delta refreshes the caches of a table the job writes meanwhile
        # (the gold fold reads the tombstones it then updates), giving other rows.
        frame: DataFrame = self._dataframe(rows).localCheckpoint(eager=True)
        return frame

    def release(self, rows: Any) -> None:
        """Nothing to do: Spark drops a local checkpoint's blocks once nothing refers to
        it."""

    def to_arrow(self, rows: Any) -> pa.Table:
        if isinstance(rows, pa.Table):
            return rows
        return dataframe_to_arrow(rows)

    def count(self, rows: Any) -> int:
        if isinstance(rows, pa.Table):
            return int(rows.num_rows)
        return int(rows.count())

    # ---------------------------------------------------------------------------- SQL

    def tables(self) -> list[TableRef]:
        """Every table of this engine's lake (its directories, or its catalog schemas)."""
        if self.location is not None:
            return _tables_under(self.location, self.table_prefix)
        found = []
        for layer in LAYERS:
            try:
                rows = self._sql(f"SHOW TABLES IN {self.schema_name(layer)}").collect()
            except Exception:  # the schema does not exist (yet)
                continue
            for row in rows:
                name = str(row["tableName"])
                if name.startswith(self.table_prefix):
                    with contextlib.suppress(ValueError):
                        found.append(TableRef(layer, name.removeprefix(self.table_prefix)))
        return found

    def register_sql(self, tables: Iterable[TableRef] | None = None) -> list[str]:
        """Catalog tables are queryable already; tables under a location are registered in
        the session catalog as external tables named like them."""
        refs = [t for t in (self.tables() if tables is None else tables) if self.exists(t)]
        if self.location is not None:
            for table in refs:
                self._bind(table)
        return [self.qualified_name(t) for t in refs]

    def _bind(self, table: TableRef) -> None:
        """Point the session catalog's name of ``table`` at its directory."""
        qualified = self.qualified_name(table)
        dotted = ".".join(self._parts(table))
        path = self.path(table)
        with self._errors("register", table):
            self._sql(f"CREATE SCHEMA IF NOT EXISTS {self.schema_name(table.layer)}")
            if self._spark.catalog.tableExists(dotted):
                kind = str(self._spark.catalog.getTable(dotted).tableType).upper()
                if kind == "VIEW":
                    self._sql(f"DROP VIEW {qualified}")
                elif kind != "EXTERNAL":
                    raise LakeError(
                        f"the session catalog has a managed table {qualified}; the spark "
                        f"engine cannot name the table at {path} so"
                    )
                elif _same_location(
                    str(self._sql(f"DESCRIBE DETAIL {qualified}").collect()[0]["location"]), path
                ):
                    return
                else:
                    self._sql(f"DROP TABLE {qualified}")
            self._sql(f"CREATE TABLE {qualified} USING DELTA LOCATION {quote_string(path)}")

    def sql(self, text: str) -> DataFrame:
        return self._sql(text)

    def query_arrow(self, text: str, tables: Iterable[TableRef], *, limit: int) -> pa.Table:
        from pyspark.errors import PySparkException

        self.register_sql(tables)
        try:
            return self._sql(text).limit(limit).toArrow()
        except PySparkException as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise LakeError(first.split(" SQLSTATE:")[0].strip()) from None


def _absolute(location: str | Path | None) -> str:
    # A URI (s3://, abfss://, dbfs:/, file:/) is Spark's to resolve; /Volumes/... and other
    # paths are made absolute, which leaves an absolute one as it is.
    text = str(location)
    if has_scheme(text):
        return text.rstrip("/")
    return str(Path(text).expanduser().absolute())


def _same_location(listed: str, path: str) -> bool:
    def plain(text: str) -> str:
        for prefix in ("file://", "file:"):
            if text.startswith(prefix):
                text = text[len(prefix) :]
                break
        return text.rstrip("/")

    return plain(listed) == plain(path)


# Operations whose commits add no rows to a change data feed.
_NO_DATA = frozenset(
    {"OPTIMIZE", "VACUUM START", "VACUUM END", "CREATE TABLE", "SET TBLPROPERTIES"}
)


def _vacuum_retention_ms(parameters: Mapping[str, str]) -> float | None:
    """The retention a VACUUM's history entry ran with (``None``: not recorded)."""
    for key in ("specifiedRetentionMillis", "defaultRetentionMillis"):
        value = parameters.get(key)
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None


def _tables_under(location: str, prefix: str) -> list[TableRef]:
    from pipelines.spec.models import is_identifier

    found = []
    for layer in LAYERS:
        layer_dir = Path(location) / layer
        if not layer_dir.is_dir():
            continue
        for child in sorted(layer_dir.iterdir()):
            name = child.name.removeprefix(prefix)
            if (
                child.name.startswith(prefix)
                and is_identifier(name)
                and _has_commit(child / "_delta_log")
            ):
                found.append(TableRef(layer, name))
    return found


def _newest_commit(log: Path) -> int | None:
    """The version of the newest commit (or checkpoint) in a local ``_delta_log``; ``None``
    when it holds none (see :func:`_has_commit`)."""
    try:
        with os.scandir(log) as entries:
            versions = [
                int(e.name[:20])
                for e in entries
                if e.name[:20].isdigit() and e.name.endswith((".json", ".parquet"))
            ]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return max(versions, default=None)


def _has_commit(log: Path) -> bool:
    """Whether a local ``_delta_log`` holds a commit or checkpoint. Delta creates the folder
    before the first commit's data files, so a table being created by another process has an
    empty log for a moment; it exists once its version 0 (or a checkpoint) does."""
    return _newest_commit(log) is not None
