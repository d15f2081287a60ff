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
  would take another thread's, holds the session's lock while it runs
  (:func:`~pipelines.engines.spark_access.session_lock`); appends and overwrites with a
  transaction carry all of them as writer options and run beside it;
- ``read_appends`` reads the change data feed (inserts) of the version range, which is why
  every table has ``delta.enableChangeDataFeed`` on;
- history, table properties, OPTIMIZE and VACUUM are SQL. Delta Spark writes log checkpoints
  by itself (every ``delta.checkpointInterval`` commits) and cleans the log up after them.

SQL and the DataFrame API only, so the same engine runs on a classic session and over Spark
Connect (Databricks serverless and standard access mode, where Python has no JVM gateway).
The one exception is optional: ``one_commit_appends`` commits several parts with their
transactions at once through Delta's classes over the py4j gateway of a classic session
(:mod:`pipelines.engines.spark_write`).

The engine is made of parts it holds, one per role, all reaching the session and the tables
through one :class:`~pipelines.engines.spark_access.SparkTableAccess`: the application
transactions (:mod:`pipelines.engines.spark_txns`), table creation, history and maintenance
(:mod:`pipelines.engines.spark_tables`), the writes (:mod:`pipelines.engines.spark_write`) and
the reads (:mod:`pipelines.engines.spark_reads`); running the layer functions and SQL are its
own. The SQL text, writer options and history parsing are plain functions in
:mod:`pipelines.engines.spark_sql`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from ingest.errors import LakeError
from pipelines.engines.arrow import arrow_schema_to_spark, dataframe_to_arrow, same_type
from pipelines.engines.base import (
    DEFAULT_PROPERTIES,
    LAYERS,
    BatchFunction,
    CommitResult,
    Condition,
    CountsOf,
    Fits,
    HistoryEntry,
    Kept,
    MaintenanceResult,
    MergeMetrics,
    RowsFlagged,
    RowsWhere,
    TableChanges,
    TableFunction,
    TableRef,
    Txn,
    WriteLayout,
)
from pipelines.engines.spark_access import SparkTableAccess, has_commit
from pipelines.engines.spark_reads import SparkReads
from pipelines.engines.spark_sql import PRESERVE_NULL_STRUCTS
from pipelines.engines.spark_tables import SparkTables
from pipelines.engines.spark_txns import SparkTransactions
from pipelines.engines.spark_write import SparkWrites
from pipelines.engines.sql import quote_identifier, quote_string, spark_type_sql
from pipelines.spec.models import LakeSpec, SchemasSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["SparkEngine"]

_log = logging.getLogger(__name__)


def _spark_schema(schema: StructType | pa.Schema) -> StructType:
    """``schema`` as a Spark schema (an Arrow schema in the Spark types of its Delta types)."""
    return arrow_schema_to_spark(schema) if isinstance(schema, pa.Schema) else schema


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


class SparkEngine:
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
        self._access = SparkTableAccess(
            spark,
            catalog=catalog,
            location=location,
            schemas=schemas,
            table_prefix=table_prefix,
            default_properties=default_properties,
        )
        self._transactions = SparkTransactions(self._access)
        self._tables = SparkTables(self._access, self._transactions)
        self._writes = SparkWrites(
            self._access,
            self._tables,
            self._transactions,
            one_commit_appends=one_commit_appends,
            clock=clock,
        )
        self._reads = SparkReads(self._access, self._tables)
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
        return self._access.spark

    @property
    def catalog(self) -> str | None:
        return self._access.catalog

    @property
    def location(self) -> str | None:
        return self._access.location

    @property
    def schemas(self) -> SchemasSpec:
        return self._access.schemas

    @property
    def table_prefix(self) -> str:
        return self._access.table_prefix

    @property
    def default_properties(self) -> dict[str, str]:
        return self._access.default_properties

    @property
    def one_commit_appends(self) -> bool:
        return self._writes.one_commit_appends

    # ------------------------------------------------------------------ naming, metadata

    def qualified_name(self, table: TableRef) -> str:
        return self._access.qualified_name(table)

    def schema_name(self, layer: str) -> str:
        return self._access.schema_name(layer)

    def path(self, table: TableRef) -> str:
        """Directory of ``table`` (location mode): ``<location>/<layer>/<prefix><name>``."""
        return self._access.path(table)

    def ensure_writable(self) -> None:
        self._access.ensure_writable()

    def exists(self, table: TableRef) -> bool:
        return self._access.exists(table)

    def version(self, table: TableRef) -> int | None:
        return self._access.version(table)

    def schema(self, table: TableRef) -> StructType | None:
        return self._access.schema(table)

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        return self._transactions.txn_version(table, app_id)

    # ------------------------------------------------------------------ tables and upkeep

    def properties(self, table: TableRef) -> dict[str, str]:
        return self._tables.properties(table)

    def ensure_table(
        self,
        table: TableRef,
        schema: StructType | pa.Schema,
        *,
        properties: Mapping[str, str] | None = None,
        deletion_vectors: bool = False,
    ) -> None:
        self._tables.ensure_table(
            table, _spark_schema(schema), properties=properties, deletion_vectors=deletion_vectors
        )

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        return self._tables.history(table, limit=limit)

    def maintain(
        self,
        table: TableRef,
        *,
        compact: bool = True,
        checkpoint: bool = True,
        vacuum_hours: float | None = None,
        log_hours: float | None = None,
        log_from_version: int | None = None,
        tombstone_hours: float | None = None,
    ) -> MaintenanceResult:
        return self._tables.maintain(
            table,
            compact=compact,
            checkpoint=checkpoint,
            vacuum_hours=vacuum_hours,
            log_hours=log_hours,
            log_from_version=log_from_version,
            tombstone_hours=tombstone_hours,
        )

    # ------------------------------------------------------------------------- reading

    def read(
        self, table: TableRef, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        return self._reads.read(table, version=version, columns=columns)

    def read_keyed(
        self, table: TableRef, *, key: str, keys: Any, columns: Sequence[str] | None = None
    ) -> DataFrame:
        return self._reads.read_keyed(table, key=key, keys=keys, columns=columns)

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        return self._reads.read_arrow(table, columns=columns, where=where)

    def read_appends(
        self,
        table: TableRef,
        *,
        after_version: int | None,
        until_version: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> TableChanges:
        return self._reads.read_appends(
            table, after_version=after_version, until_version=until_version, columns=columns
        )

    # ------------------------------------------------------------------------- writing

    def append(
        self,
        table: TableRef,
        data: Any,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        evolve_schema: bool = True,
        layout: WriteLayout | None = None,
    ) -> CommitResult:
        return self._writes.append(
            table, data, txn=txn, metadata=metadata, evolve_schema=evolve_schema, layout=layout
        )

    def append_parts(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> list[CommitResult]:
        return self._writes.append_parts(table, parts, metadata=metadata)

    def overwrite(
        self,
        table: TableRef,
        data: Any,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        replace_schema: bool = False,
    ) -> CommitResult:
        return self._writes.overwrite(
            table, data, txn=txn, metadata=metadata, replace_schema=replace_schema
        )

    def merge(
        self,
        table: TableRef,
        source: Any,
        *,
        on: Sequence[str],
        update_condition: str | None = None,
        delete_condition: str | None = None,
        insert: bool = True,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        evolve_schema: bool = True,
        keep: Kept | None = None,
    ) -> MergeMetrics:
        return self._writes.merge(
            table,
            source,
            on=on,
            update_condition=update_condition,
            delete_condition=delete_condition,
            insert=insert,
            txn=txn,
            metadata=metadata,
            evolve_schema=evolve_schema,
            keep=keep,
        )

    def update_columns(
        self,
        table: TableRef,
        source: Any,
        *,
        on: Sequence[str],
        columns: Sequence[str],
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> MergeMetrics:
        return self._writes.update_columns(
            table, source, on=on, columns=columns, txn=txn, metadata=metadata
        )

    # ---------------------------------------------------------------------- execution

    def rows(self, data: pa.Table, schema: StructType | pa.Schema | None = None) -> DataFrame:
        return self._access.rows(data, None if schema is None else _spark_schema(schema))

    def map_batches(
        self, rows: Any, function: BatchFunction, schema: StructType | pa.Schema
    ) -> DataFrame:
        schema = _spark_schema(schema)
        # What a function says of itself (BatchFunction) is done here as a filter and a
        # projection, so that fewer rows and columns go to a Python worker, or none.
        frame = self._access.dataframe(rows)
        counts: CountsOf | None = getattr(function, "counts", None)
        if counts is not None:
            return _counts_of(frame, counts, schema)
        keeps: RowsWhere | RowsFlagged | None = getattr(function, "keeps", None)
        if isinstance(keeps, RowsFlagged):
            test = "IS TRUE" if keeps.flagged else "IS NOT TRUE"
            frame = frame.where(f"{quote_identifier(keeps.column)} {test}")
        elif keeps is not None:
            column = frame[quote_identifier(keeps.column)]
            frame = frame.where(column.isNull() if keeps.null else column.isNotNull())
        selects: Sequence[str] | None = getattr(function, "selects", None)
        if selects is not None:
            return frame.select(*[quote_identifier(name) for name in selects])
        fits: Fits | None = getattr(function, "fits", None)
        if fits is not None:
            fitted = _fitted(frame, fits, schema)
            if fitted is not None:
                return fitted
        reads: Sequence[str] | None = getattr(function, "reads", None)
        if reads is not None:
            frame = frame.select(*[quote_identifier(name) for name in reads])
        return frame.mapInArrow(function, schema)  # type: ignore[arg-type]

    def map_groups(
        self,
        rows: Any,
        *,
        key: str,
        function: TableFunction,
        schema: StructType | pa.Schema,
        partitions: int | None = None,
    ) -> DataFrame:
        schema = _spark_schema(schema)
        frame = self._access.dataframe(rows)
        column = frame[quote_identifier(key)]
        grouped = frame.repartition(partitions, column) if partitions else frame.repartition(column)
        return grouped.mapInArrow(_PerPartition(function), schema)  # type: ignore[arg-type]

    def union(self, parts: Sequence[Any], schema: StructType | pa.Schema) -> DataFrame:
        schema = _spark_schema(schema)
        frames = [self.rows(p, schema) if isinstance(p, pa.Table) else p for p in parts] or [
            self._access.spark.createDataFrame([], schema)
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
        frame: DataFrame = self._access.dataframe(rows).localCheckpoint(eager=True)
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
        if self._access.location is not None:
            return _tables_under(self._access.location, self._access.table_prefix)
        found = []
        for layer in LAYERS:
            try:
                rows = self._access.sql(f"SHOW TABLES IN {self.schema_name(layer)}").collect()
            except Exception:  # the schema does not exist (yet)
                continue
            for row in rows:
                name = str(row["tableName"])
                if name.startswith(self._access.table_prefix):
                    with contextlib.suppress(ValueError):
                        found.append(TableRef(layer, name.removeprefix(self._access.table_prefix)))
        return found

    def register_sql(self, tables: Iterable[TableRef] | None = None) -> list[str]:
        """Catalog tables are queryable already; tables under a location are registered in
        the session catalog as external tables named like them."""
        refs = [t for t in (self.tables() if tables is None else tables) if self.exists(t)]
        if self._access.location is not None:
            for table in refs:
                self._bind(table)
        return [self.qualified_name(t) for t in refs]

    def _bind(self, table: TableRef) -> None:
        """Point the session catalog's name of ``table`` at its directory."""
        qualified = self.qualified_name(table)
        dotted = ".".join(self._access.parts(table))
        path = self.path(table)
        with self._access.errors("register", table):
            self._access.sql(f"CREATE SCHEMA IF NOT EXISTS {self.schema_name(table.layer)}")
            if self._access.spark.catalog.tableExists(dotted):
                kind = str(self._access.spark.catalog.getTable(dotted).tableType).upper()
                if kind == "VIEW":
                    self._access.sql(f"DROP VIEW {qualified}")
                elif kind != "EXTERNAL":
                    raise LakeError(
                        f"the session catalog has a managed table {qualified}; the spark "
                        f"engine cannot name the table at {path} so"
                    )
                elif _same_location(
                    str(self._access.sql(f"DESCRIBE DETAIL {qualified}").collect()[0]["location"]),
                    path,
                ):
                    return
                else:
                    self._access.sql(f"DROP TABLE {qualified}")
            self._access.sql(f"CREATE TABLE {qualified} USING DELTA LOCATION {quote_string(path)}")

    def sql(self, text: str) -> DataFrame:
        return self._access.sql(text)

    def query_arrow(self, text: str, tables: Iterable[TableRef], *, limit: int) -> pa.Table:
        from pyspark.errors import PySparkException

        self.register_sql(tables)
        try:
            return self._access.sql(text).limit(limit).toArrow()
        except PySparkException as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise LakeError(first.split(" SQLSTATE:")[0].strip()) from None


def _same_location(listed: str, path: str) -> bool:
    def plain(text: str) -> str:
        for prefix in ("file://", "file:"):
            if text.startswith(prefix):
                text = text[len(prefix) :]
                break
        return text.rstrip("/")

    return plain(listed) == plain(path)


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
                and has_commit(child / "_delta_log")
            ):
                found.append(TableRef(layer, name))
    return found


def _fitted(frame: DataFrame, fits: Fits, schema: StructType) -> DataFrame | None:
    """``frame`` as ``schema``'s rows by :class:`~pipelines.engines.base.Fits` (a projection
    of SQL expressions), or ``None`` when a column would need a cast: the function does that
    itself, as Arrow casts it."""
    constants = dict(fits.constants)
    have: dict[str, Any] = {}
    for field in frame.schema.fields:
        if field.name.lower() in have:
            return None
        have[field.name.lower()] = field
    columns = []
    for field in schema.fields:
        name, kind = quote_identifier(field.name), spark_type_sql(field.dataType)
        found = have.get(field.name.lower())
        if field.name in constants:
            columns.append(f"CAST({quote_string(constants[field.name])} AS {kind}) AS {name}")
        elif found is None:
            columns.append(f"CAST(NULL AS {kind}) AS {name}")
        elif same_type(found.dataType, field.dataType):
            columns.append(f"{quote_identifier(found.name)} AS {name}")
        else:
            return None
    return frame.selectExpr(*columns)


def _counts_of(frame: DataFrame, counts: CountsOf, schema: StructType) -> DataFrame:
    """``counts`` of ``frame`` as ``schema``'s three columns, grouped by Spark (the aggregate
    is named as a dictionary ``agg`` names it: no pyspark.sql.functions, which build columns of
    one kind of session only)."""
    key, rows, highest = schema.fields
    grouped = frame.selectExpr(
        f"{quote_identifier(counts.key)} AS k", f"{quote_identifier(counts.highest)} AS h"
    ).groupBy("k")
    return grouped.agg({"*": "count", "h": "max"}).selectExpr(
        f"CAST(k AS {spark_type_sql(key.dataType)}) AS {quote_identifier(key.name)}",
        f"CAST(`count(1)` AS {spark_type_sql(rows.dataType)}) AS {quote_identifier(rows.name)}",
        f"CAST(`max(h)` AS {spark_type_sql(highest.dataType)}) AS {quote_identifier(highest.name)}",
    )
