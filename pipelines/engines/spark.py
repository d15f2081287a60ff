"""The ``spark`` lake engine: delta-spark on Databricks or any Spark cluster with the Delta jar.

Tables are catalog tables named ```catalog`.`schema`.`table``` (Unity Catalog) or
```schema`.`table``` when no catalog is configured. Everything is plain Delta Spark:

- appends and overwrites are ``DataFrameWriter.saveAsTable`` with ``format("delta")``;
  idempotency uses Delta's own ``txnAppId`` / ``txnVersion`` writer options (and, for MERGE,
  the ``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` session settings), so Delta
  itself skips a write it has already committed;
- merges are ``DeltaTable.forName(...).merge`` with schema evolution;
- ``read_appends`` reads the Change Data Feed (inserts only) of the version range, which is
  why :meth:`SparkEngine.ensure_table` turns ``delta.enableChangeDataFeed`` on;
- history, OPTIMIZE and VACUUM are SQL. Delta Spark writes log checkpoints by itself (every
  ``delta.checkpointInterval`` commits) and cleans the log up after them.

The SQL text and writer options are built by module-level functions so that they are tested
without a Delta jar.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from ingest.errors import LakeError
from pipelines.engines.arrow import arrow_to_dataframe, dataframe_to_arrow, same_type
from pipelines.engines.base import (
    LAYERS,
    CommitResult,
    Condition,
    HistoryEntry,
    MaintenanceResult,
    MergeMetrics,
    TableChanges,
    TableRef,
    Txn,
    WriteLayout,
    check_conditions,
    decode_user_metadata,
    encode_user_metadata,
    merge_keys,
    txn_applied,
)
from pipelines.engines.sql import (
    column_list_ddl,
    quote_identifier,
    quote_string,
    table_properties_sql,
)
from pipelines.spec import LakeSpec, SchemasSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

__all__ = [
    "CDF_PROPERTY",
    "DEFAULT_PROPERTIES",
    "TXN_APP_ID_CONF",
    "TXN_VERSION_CONF",
    "USER_METADATA_CONF",
    "SparkEngine",
    "add_columns_sql",
    "create_table_sql",
    "history_entry",
    "is_append_only",
    "merge_condition",
    "merge_counts",
    "select_sql",
    "set_properties_sql",
    "write_options",
]

_log = logging.getLogger(__name__)

CDF_PROPERTY = "delta.enableChangeDataFeed"
DEFAULT_PROPERTIES: Mapping[str, str] = {CDF_PROPERTY: "true"}
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
AUTO_MERGE_CONF = "spark.databricks.delta.schema.autoMerge.enabled"
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"

# Operations that only add rows (or change no rows at all), as DESCRIBE HISTORY names them.
_METADATA_ONLY = frozenset(
    {
        "CREATE TABLE",
        "CREATE TABLE AS SELECT",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD COLUMNS",
        "CHANGE COLUMN",
        "RENAME COLUMN",
        "ADD CONSTRAINT",
        "DROP CONSTRAINT",
        "UPGRADE PROTOCOL",
        "OPTIMIZE",
        "REORG",
        "VACUUM START",
        "VACUUM END",
        "COMPUTE STATS",
        "SET TAGS",
        "UNSET TAGS",
    }
)


# ---------------------------------------------------------------------------- SQL builders


def create_table_sql(
    qualified: str, schema: StructType, properties: Mapping[str, str] | None = None
) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a Delta table with ``schema`` and ``properties``."""
    text = f"CREATE TABLE IF NOT EXISTS {qualified} {column_list_ddl(schema)} USING DELTA"
    if properties:
        text += f" TBLPROPERTIES {table_properties_sql(properties)}"
    return text


def add_columns_sql(qualified: str, fields: Sequence[StructField]) -> str:
    """``ALTER TABLE ... ADD COLUMNS`` (as nullable: existing rows have no value for them)."""
    from pyspark.sql.types import StructField, StructType

    nullable = StructType([StructField(f.name, f.dataType, True, f.metadata) for f in fields])
    return f"ALTER TABLE {qualified} ADD COLUMNS {column_list_ddl(nullable)}"


def set_properties_sql(qualified: str, properties: Mapping[str, str]) -> str:
    return f"ALTER TABLE {qualified} SET TBLPROPERTIES {table_properties_sql(properties)}"


def write_options(
    txn: Txn | None,
    metadata: Mapping[str, str] | None,
    *,
    merge_schema: bool = False,
    overwrite_schema: bool = False,
    layout: WriteLayout | None = None,
) -> dict[str, str]:
    """DataFrameWriter options of a Delta write. Of a ``layout``, the Parquet writer takes
    per-column dictionary switches; statistics and row groups are left to Delta's own settings
    (``delta.dataSkippingStatsColumns``, ``parquet.block.size``)."""
    options: dict[str, str] = {}
    for column in layout.distinct if layout is not None else ():
        options[f"parquet.enable.dictionary#{column}"] = "false"
    if txn is not None:
        options["txnAppId"] = txn.app_id
        options["txnVersion"] = str(txn.version)
    user_metadata = encode_user_metadata(metadata, txn)
    if user_metadata:
        options["userMetadata"] = user_metadata
    if overwrite_schema:
        options["overwriteSchema"] = "true"
    elif merge_schema:
        options["mergeSchema"] = "true"
    return options


def merge_condition(keys: Sequence[str]) -> str:
    """The join condition of a merge on ``keys`` (aliases ``target`` and ``source``)."""
    return " AND ".join(
        f"target.{quote_identifier(k)} = source.{quote_identifier(k)}" for k in merge_keys(keys)
    )


def _int(metrics: Mapping[str, Any], key: str) -> int:
    value = metrics.get(key)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def is_append_only(
    operation: str, parameters: Mapping[str, Any], metrics: Mapping[str, Any]
) -> bool:
    """Whether a commit, as DESCRIBE HISTORY shows it, only added rows (or none)."""
    if operation in _METADATA_ONLY:
        return True
    if operation == "WRITE":
        return str(parameters.get("mode", "")).strip('"') == "Append"
    if operation == "STREAMING UPDATE":
        return str(parameters.get("outputMode", "")).strip('"') == "Append"
    if operation == "MERGE":
        return (
            _int(metrics, "numTargetRowsUpdated") == 0
            and _int(metrics, "numTargetRowsDeleted") == 0
            and _int(metrics, "numTargetFilesRemoved") == 0
        )
    return False


def merge_counts(metrics: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(inserted, updated, deleted, source rows) from a MERGE commit's operationMetrics."""
    return (
        _int(metrics, "numTargetRowsInserted"),
        _int(metrics, "numTargetRowsUpdated"),
        _int(metrics, "numTargetRowsDeleted"),
        _int(metrics, "numSourceRows"),
    )


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, int | float):
        return repr(value)
    return quote_string(str(value))


def select_sql(
    qualified: str, columns: Sequence[str] | None, where: Sequence[Condition] = ()
) -> str:
    """``SELECT`` of ``columns`` (all when ``None``) from ``qualified`` where every condition
    holds; column names are quoted and values become SQL literals (bytes as ``X'..'``)."""
    projection = "*" if columns is None else ", ".join(quote_identifier(c) for c in columns)
    text = f"SELECT {projection} FROM {qualified}"
    clauses = []
    for column, op, value in check_conditions(where):
        if op == "in":
            listed = ", ".join(_sql_literal(v) for v in value)
            clauses.append(f"{quote_identifier(column)} IN ({listed})")
        else:
            clauses.append(f"{quote_identifier(column)} {op} {_sql_literal(value)}")
    if clauses:
        text += " WHERE " + " AND ".join(clauses)
    return text


def history_entry(row: Mapping[str, Any]) -> HistoryEntry:
    """A HistoryEntry from one DESCRIBE HISTORY row (as a dict)."""
    metadata, txn = decode_user_metadata(row.get("userMetadata"))
    timestamp = row.get("timestamp")
    if isinstance(timestamp, datetime):
        timestamp = (
            timestamp.replace(tzinfo=timezone.utc) if timestamp.tzinfo is None else timestamp
        )
    else:
        timestamp = datetime.fromtimestamp(0, tz=timezone.utc)
    return HistoryEntry(
        version=int(row["version"]),
        timestamp=timestamp,
        operation=str(row.get("operation") or ""),
        parameters={str(k): str(v) for k, v in (row.get("operationParameters") or {}).items()},
        metrics={str(k): v for k, v in (row.get("operationMetrics") or {}).items()},
        metadata=metadata,
        txn=txn,
    )


# ----------------------------------------------------------------------------- the engine


class SparkEngine:
    """Delta tables in the Spark catalog (Unity Catalog on Databricks), through delta-spark."""

    name: Literal["spark"] = "spark"

    def __init__(
        self,
        spark: SparkSession,
        *,
        catalog: str | None = None,
        schemas: SchemasSpec | None = None,
        table_prefix: str = "",
        default_properties: Mapping[str, str] = DEFAULT_PROPERTIES,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._spark = spark
        self.catalog = catalog
        self.schemas = schemas or SchemasSpec()
        self.table_prefix = table_prefix
        self.default_properties = dict(default_properties)
        self._clock = clock
        self._txns: dict[tuple[TableRef, str], int] = {}

    @classmethod
    def from_spec(
        cls, lake: LakeSpec, spark: SparkSession, *, clock: Callable[[], float] = time.perf_counter
    ) -> SparkEngine:
        return cls(
            spark,
            catalog=lake.catalog,
            schemas=lake.schemas,
            table_prefix=lake.table_prefix,
            clock=clock,
        )

    def __repr__(self) -> str:
        return f"SparkEngine(catalog={self.catalog!r})"

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

    # ------------------------------------------------------------------------ helpers

    def _sql(self, text: str) -> DataFrame:
        _log.debug("spark sql: %s", text)
        return self._spark.sql(text)

    @contextlib.contextmanager
    def _session_conf(self, values: Mapping[str, str]) -> Iterator[None]:
        conf = self._spark.conf
        previous: dict[str, str | None] = {key: conf.get(key, None) for key in values}
        for key, value in values.items():
            conf.set(key, value)
        try:
            yield
        finally:
            for key, old in previous.items():
                if old is None:
                    conf.unset(key)
                else:
                    conf.set(key, old)

    def _history_rows(self, table: TableRef, limit: int | None) -> list[dict[str, Any]]:
        text = f"DESCRIBE HISTORY {self.qualified_name(table)}"
        if limit is not None:
            text += f" LIMIT {int(limit)}"
        return [row.asDict(recursive=True) for row in self._sql(text).collect()]

    def _require(self, table: TableRef) -> int:
        version = self.version(table)
        if version is None:
            raise LakeError(f"table {self.qualified_name(table)} ({table}) does not exist")
        return version

    def _dataframe(self, data: DataFrame | pa.Table) -> DataFrame:
        if isinstance(data, pa.Table):
            return arrow_to_dataframe(self._spark, data)
        return data

    # ----------------------------------------------------------------------- metadata

    def exists(self, table: TableRef) -> bool:
        # Identifiers are validated plain names, so the dotted form needs no quoting here.
        return bool(self._spark.catalog.tableExists(".".join(self._parts(table))))

    def version(self, table: TableRef) -> int | None:
        if not self.exists(table):
            return None
        rows = self._history_rows(table, 1)
        return int(rows[0]["version"]) if rows else None

    def schema(self, table: TableRef) -> StructType | None:
        if not self.exists(table):
            return None
        return self._spark.table(self.qualified_name(table)).schema

    def properties(self, table: TableRef) -> dict[str, str]:
        rows = self._sql(f"SHOW TBLPROPERTIES {self.qualified_name(table)}").collect()
        return {str(r["key"]): str(r["value"]) for r in rows}

    def ensure_table(
        self, table: TableRef, schema: StructType, *, properties: Mapping[str, str] | None = None
    ) -> None:
        wanted = {**self.default_properties, **(properties or {})}
        qualified = self.qualified_name(table)
        if not self.exists(table):
            self._sql(f"CREATE SCHEMA IF NOT EXISTS {self.schema_name(table.layer)}")
            self._sql(create_table_sql(qualified, schema, wanted))
            _log.info("created %s", qualified)
            return
        current = self.schema(table)
        assert current is not None
        by_name = {f.name.lower(): f for f in current.fields}
        missing = []
        for f in schema.fields:
            existing = by_name.get(f.name.lower())
            if existing is None:
                missing.append(f)
            elif not same_type(existing.dataType, f.dataType):
                raise LakeError(
                    f"column {f.name!r} of {qualified} is {existing.dataType.simpleString()}, "
                    f"not {f.dataType.simpleString()}; changing a column type needs a rewrite"
                )
        if missing:
            self._sql(add_columns_sql(qualified, missing))
        have = self.properties(table)
        changed = {k: v for k, v in wanted.items() if have.get(k) != v}
        if changed:
            self._sql(set_properties_sql(qualified, changed))

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        """Latest txn version for ``app_id``, from this process's writes or else from the
        ``userMetadata`` of the table's history (Delta exposes no SQL for its txn actions;
        Delta itself still refuses a duplicate even when history no longer shows it)."""
        known = self._txns.get((table, app_id))
        if known is not None or not self.exists(table):
            return known
        for row in self._history_rows(table, None):
            _metadata, txn = decode_user_metadata(row.get("userMetadata"))
            if txn is not None and txn.app_id == app_id:
                self._txns[(table, app_id)] = txn.version
                return txn.version
        return None

    def _already_applied(self, table: TableRef, txn: Txn | None) -> bool:
        if txn is None:
            return False
        return txn_applied(table, txn, self.txn_version(table, txn.app_id), _log)

    def _remember(self, table: TableRef, txn: Txn | None) -> None:
        if txn is not None:
            self._txns[(table, txn.app_id)] = txn.version

    # ------------------------------------------------------------------------- writing

    def _write(
        self,
        table: TableRef,
        data: DataFrame | pa.Table,
        *,
        mode: Literal["append", "overwrite"],
        txn: Txn | None,
        options: dict[str, str],
    ) -> CommitResult:
        if self._already_applied(table, txn):
            return CommitResult(table, self.version(table), skipped=True, rows=0)
        df = self._dataframe(data)
        if not self.exists(table):
            self.ensure_table(table, df.schema)
        before = self._require(table)
        writer = df.write.format("delta").mode(mode)
        for key, value in options.items():
            writer = writer.option(key, value)
        try:
            writer.saveAsTable(self.qualified_name(table))
        except Exception as exc:  # py4j and pyspark raise many types; keep the cause
            raise LakeError(f"{mode} to {self.qualified_name(table)} failed: {exc}") from exc
        (latest,) = self._history_rows(table, 1)
        after = int(latest["version"])
        self._remember(table, txn)
        if after == before:
            # Delta skipped the write itself: the txn had been committed by another process.
            return CommitResult(table, after, skipped=True, rows=0)
        rows = _int(latest.get("operationMetrics") or {}, "numOutputRows")
        _log.debug("%s: %s of %d rows as version %d", table, mode, rows, after)
        return CommitResult(table, after, skipped=False, rows=rows)

    def append(
        self,
        table: TableRef,
        data: DataFrame | pa.Table,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        evolve_schema: bool = True,
        layout: WriteLayout | None = None,
    ) -> CommitResult:
        options = write_options(txn, metadata, merge_schema=evolve_schema, layout=layout)
        return self._write(table, data, mode="append", txn=txn, options=options)

    def overwrite(
        self,
        table: TableRef,
        data: DataFrame | pa.Table,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        replace_schema: bool = False,
    ) -> CommitResult:
        options = write_options(
            txn, metadata, merge_schema=not replace_schema, overwrite_schema=replace_schema
        )
        return self._write(table, data, mode="overwrite", txn=txn, options=options)

    def merge(
        self,
        table: TableRef,
        source: DataFrame | pa.Table,
        *,
        on: Sequence[str],
        update_condition: str | None = None,
        delete_condition: str | None = None,
        insert: bool = True,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        evolve_schema: bool = True,
    ) -> MergeMetrics:
        try:
            from delta.tables import DeltaTable
        except ImportError as exc:
            raise LakeError(
                "the spark lake engine merges with delta-spark, which is not installed here; "
                "install sfcdc[spark] (Databricks runtimes include it) or use engine: local"
            ) from exc

        condition = merge_condition(on)
        started = self._clock()
        if self._already_applied(table, txn):
            return MergeMetrics(table, 0, 0, 0, 0, self.version(table), True, 0.0)
        df = self._dataframe(source)
        if not self.exists(table):
            self.ensure_table(table, df.schema)
        before = self._require(table)
        target = DeltaTable.forName(self._spark, self.qualified_name(table)).alias("target")
        builder = target.merge(df.alias("source"), condition)
        if delete_condition:
            builder = builder.whenMatchedDelete(condition=delete_condition)
        builder = builder.whenMatchedUpdateAll(condition=update_condition)
        if insert:
            builder = builder.whenNotMatchedInsertAll()
        conf: dict[str, str] = {}
        if evolve_schema:
            if hasattr(builder, "withSchemaEvolution"):  # Delta 3.2+
                builder = builder.withSchemaEvolution()
            else:
                conf[AUTO_MERGE_CONF] = "true"
        if txn is not None:
            conf[TXN_APP_ID_CONF] = txn.app_id
            conf[TXN_VERSION_CONF] = str(txn.version)
        user_metadata = encode_user_metadata(metadata, txn)
        if user_metadata:
            conf[USER_METADATA_CONF] = user_metadata
        try:
            with self._session_conf(conf):
                builder.execute()
        except Exception as exc:
            raise LakeError(f"merge into {self.qualified_name(table)} failed: {exc}") from exc
        self._remember(table, txn)
        (latest,) = self._history_rows(table, 1)
        after = int(latest["version"])
        inserted, updated, deleted, source_rows = (
            merge_counts(latest.get("operationMetrics") or {}) if after != before else (0, 0, 0, 0)
        )
        metrics = MergeMetrics(
            table, inserted, updated, deleted, source_rows, after, False, self._clock() - started
        )
        _log.info(
            "%s: merged %d source rows (%d inserted, %d updated, %d deleted) as version %d",
            table,
            source_rows,
            inserted,
            updated,
            deleted,
            after,
        )
        return metrics

    # ------------------------------------------------------------------------- reading

    def read(self, table: TableRef, *, version: int | None = None) -> DataFrame:
        self._require(table)
        if version is None:
            return self._spark.table(self.qualified_name(table))
        return self._sql(f"SELECT * FROM {self.qualified_name(table)} VERSION AS OF {int(version)}")

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        self._require(table)
        text = select_sql(self.qualified_name(table), columns, where)
        try:
            return dataframe_to_arrow(self._sql(text))
        except LakeError:
            raise
        except Exception as exc:  # py4j and pyspark raise many types; keep the cause
            raise LakeError(f"reading {self.qualified_name(table)} failed: {exc}") from exc

    def read_appends(
        self, table: TableRef, *, after_version: int | None, until_version: int | None = None
    ) -> TableChanges:
        latest = self._require(table)
        qualified = self.qualified_name(table)
        if after_version is not None and after_version > latest:
            raise LakeError(
                f"{qualified} is at version {latest}, before the requested after_version "
                f"{after_version}; was the table dropped and re-created?"
            )
        current = latest if until_version is None else until_version
        if current > latest or current < 0:
            raise LakeError(
                f"{qualified} has versions 0..{latest}; cannot read appends up to version {current}"
            )
        if after_version is not None and current < after_version:
            raise LakeError(
                f"{qualified}: until_version {current} is before after_version {after_version}"
            )
        if after_version is None:
            return TableChanges(table, self.read(table, version=current), 0, current)
        if after_version == current:
            return TableChanges(table, self.read(table, version=current).limit(0), None, current)
        reason = self._incremental_obstacle(table, after_version + 1, current, latest)
        if reason is not None:
            _log.warning(
                "%s: cannot read the rows added after version %d incrementally (%s); reading "
                "the whole table at version %d instead",
                table,
                after_version,
                reason,
                current,
            )
            return TableChanges(
                table, self.read(table, version=current), after_version + 1, current, True
            )
        df = (
            self._spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", str(after_version + 1))
            .option("endingVersion", str(current))
            .table(qualified)
            .where("_change_type = 'insert'")
            .drop("_change_type", "_commit_version", "_commit_timestamp")
        )
        return TableChanges(table, df, after_version + 1, current)

    def _incremental_obstacle(
        self, table: TableRef, first: int, last: int, latest: int
    ) -> str | None:
        if self.properties(table).get(CDF_PROPERTY, "false").lower() != "true":
            return f"{CDF_PROPERTY} is off; ensure_table turns it on"
        rows = [
            r
            for r in self._history_rows(table, latest - first + 1)
            if first <= int(r["version"]) <= last
        ]
        versions = {int(r["version"]) for r in rows}
        if not set(range(first, last + 1)) <= versions:
            return "part of the range is no longer in the table history"
        for row in rows:
            entry = history_entry(row)
            if entry.operation in ("SET TBLPROPERTIES", "UNSET TBLPROPERTIES") and (
                CDF_PROPERTY in str(entry.parameters)
            ):
                return f"{CDF_PROPERTY} changed in version {entry.version}"
            if not is_append_only(entry.operation, entry.parameters, entry.metrics):
                return f"version {entry.version} ({entry.operation}) rewrote or deleted rows"
        return None

    # ---------------------------------------------------------------------- operations

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        self._require(table)
        return [history_entry(row) for row in self._history_rows(table, limit)]

    def maintain(
        self,
        table: TableRef,
        *,
        compact: bool = True,
        checkpoint: bool = True,
        vacuum_hours: float | None = None,
    ) -> MaintenanceResult:
        self._require(table)
        qualified = self.qualified_name(table)
        removed = added = 0
        if compact:
            rows = self._sql(f"OPTIMIZE {qualified}").collect()
            report = rows[0].asDict(recursive=True).get("metrics") if rows else None
            if isinstance(report, Mapping):
                removed = _int(report, "numFilesRemoved")
                added = _int(report, "numFilesAdded")
        if checkpoint:
            _log.debug("%s: Delta Spark writes log checkpoints itself", qualified)
        if vacuum_hours is not None:
            if vacuum_hours < 0:
                raise LakeError(f"vacuum_hours must be >= 0 (got {vacuum_hours})")
            hours = math.ceil(vacuum_hours)
            conf = {RETENTION_CHECK_CONF: "false"} if hours < 168 else {}
            with self._session_conf(conf):
                self._sql(f"VACUUM {qualified} RETAIN {hours} HOURS")
        return MaintenanceResult(table, removed, added, None, None)

    def register_sql(self, tables: Iterable[TableRef] | None = None) -> list[str]:
        """Catalog tables are queryable already: this only lists the existing ones."""
        refs = list(tables) if tables is not None else self._catalog_tables()
        return [self.qualified_name(t) for t in refs if self.exists(t)]

    def _catalog_tables(self) -> list[TableRef]:
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
