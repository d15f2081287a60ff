"""The ``local`` lake engine: delta-rs for the Delta log, commits and MERGE; Spark local mode
for reading; Arrow between them.

Tables live under ``<location>/<layer>/<prefix><name>`` and are never partitioned (the
pipeline's tables are small to medium and partitioning a CDC stream by date only produces
small files). They are ordinary Delta tables: any Delta reader, delta-spark included, opens
them.

- Writes go straight from Arrow to delta-rs (a DataFrame is collected with ``toArrow``
  first), so landing bronze needs no Spark at all: an engine built without a session can
  append, merge Arrow tables and maintain, and only refuses to read.
- Reads let delta-rs resolve the snapshot's live files and Spark read those Parquet files
  natively with the table's schema, so columns added later read as null from older files.
- ``register_sql`` creates permanent views in Spark's catalog over the same files, named
  like the tables (``gold.account``), and refreshes them after every write this engine makes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Schema,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import DeltaError
from pyspark.sql.types import StructType

from ingest.errors import LakeError
from pipelines.engines.arrow import (
    arrow_schema_to_spark,
    arrow_to_dataframe,
    conform_to_schema,
    dataframe_to_arrow,
    normalize_arrow,
    same_type,
    spark_schema_from_delta_json,
    spark_schema_to_arrow,
)
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
from pipelines.engines.sql import conform_expression, quote_identifier, spark_type_sql
from pipelines.spec import LakeSpec, SchemasSpec, is_identifier

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["NATIVE_READER_FEATURES", "LocalEngine"]

_log = logging.getLogger(__name__)

# Reader features that do not change how a snapshot's Parquet files are read. Anything else
# (deletion vectors, column mapping, ...) makes the engine read through delta-rs instead.
NATIVE_READER_FEATURES = frozenset(
    {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "checkpointProtection"}
)
# Hadoop glob metacharacters; Spark globs every path it is given.
_GLOB_SPECIAL = "\\*?[]{},"
_FILES_PER_GLOB = 500
_MIN_SAFE_VACUUM_HOURS = 168.0


def _escape_glob(text: str) -> str:
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in text)


def _dq(name: str) -> str:
    """A double-quoted identifier for delta-rs (DataFusion) SQL."""
    return '"' + name.replace('"', '""') + '"'


class LocalEngine:
    """Delta tables on a local (or mounted) file system, through delta-rs and Spark local mode.

    ``spark`` may be ``None`` for processes that only write (bronze landing); reading then
    raises :class:`~ingest.errors.LakeError`. ``clock`` times merges.
    """

    name: Literal["local"] = "local"

    def __init__(
        self,
        spark: SparkSession | None,
        *,
        location: str | Path,
        schemas: SchemasSpec | None = None,
        table_prefix: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._spark = spark
        self.location = Path(location).expanduser().absolute()
        self.schemas = schemas or SchemasSpec()
        self.table_prefix = table_prefix
        self._clock = clock
        self._tables: dict[Path, DeltaTable] = {}
        self._registered: dict[TableRef, None] = {}
        self._footers: dict[str, StructType] = {}

    @classmethod
    def from_spec(
        cls,
        lake: LakeSpec,
        spark: SparkSession | None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> LocalEngine:
        """The engine a ``lake:`` section describes (its ``location``, schemas and prefix)."""
        return cls(
            spark,
            location=lake.location,
            schemas=lake.schemas,
            table_prefix=lake.table_prefix,
            clock=clock,
        )

    def __repr__(self) -> str:
        return f"LocalEngine(location={str(self.location)!r})"

    # ------------------------------------------------------------------------- naming

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            raise LakeError(
                "this local engine was created without a Spark session; reading tables and "
                "registering views need one (pass spark=local_session())"
            )
        return self._spark

    def physical_name(self, table: TableRef) -> str:
        return f"{self.table_prefix}{table.name}"

    def path(self, table: TableRef) -> Path:
        """Directory of ``table``: ``<location>/<layer>/<prefix><name>``."""
        return self.location / table.layer / self.physical_name(table)

    def qualified_name(self, table: TableRef) -> str:
        schema = self.schemas.for_layer(table.layer)
        return f"{quote_identifier(schema)}.{quote_identifier(self.physical_name(table))}"

    # ----------------------------------------------------------------------- metadata

    def _load(self, table: TableRef) -> DeltaTable | None:
        path = self.path(table)
        cached = self._tables.get(path)
        if cached is not None:
            try:
                cached.update_incremental()
            except (DeltaError, OSError):
                # The directory was removed or replaced behind our back: start afresh.
                del self._tables[path]
            else:
                return cached
        if not DeltaTable.is_deltatable(str(path)):
            return None
        with self._errors("open", table):
            loaded = DeltaTable(str(path))
        self._tables[path] = loaded
        return loaded

    def _require(self, table: TableRef, version: int | None = None) -> DeltaTable:
        current = self._load(table)
        if current is None:
            raise LakeError(f"table {table} does not exist (no Delta table at {self.path(table)})")
        if version is None or version == current.version():
            return current
        if version < 0 or version > current.version():
            raise LakeError(
                f"table {table} has versions 0..{current.version()}; cannot read version {version}"
            )
        with self._errors(f"open version {version} of", table):
            return DeltaTable(str(self.path(table)), version=version)

    @contextlib.contextmanager
    def _errors(self, action: str, table: TableRef) -> Iterator[None]:
        try:
            yield
        except LakeError:
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise LakeError(f"{action} {table} ({self.path(table)}) failed: {exc}") from exc

    def exists(self, table: TableRef) -> bool:
        return self._load(table) is not None

    def version(self, table: TableRef) -> int | None:
        dt = self._load(table)
        return None if dt is None else dt.version()

    def schema(self, table: TableRef) -> StructType | None:
        dt = self._load(table)
        return None if dt is None else self._schema_of(dt)

    @staticmethod
    def _schema_of(dt: DeltaTable) -> StructType:
        return spark_schema_from_delta_json(dt.schema().to_json())

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        dt = self._load(table)
        if dt is None:
            return None
        recorded = dt.transaction_version(app_id)
        return None if recorded is None else int(recorded)

    def ensure_table(
        self, table: TableRef, schema: StructType, *, properties: Mapping[str, str] | None = None
    ) -> None:
        wanted = dict(properties or {})
        dt = self._load(table)
        if dt is None:
            path = self.path(table)
            path.mkdir(parents=True, exist_ok=True)
            with self._errors("create", table):
                DeltaTable.create(
                    str(path),
                    spark_schema_to_arrow(schema),
                    mode="ignore",
                    configuration=wanted or None,
                )
            _log.info("created %s at %s", table, path)
            self._after_write(table)
            return
        current = self._schema_of(dt)
        by_name = {f.name.lower(): f for f in current.fields}
        missing = []
        for f in schema.fields:
            existing = by_name.get(f.name.lower())
            if existing is None:
                missing.append(f)
            elif not same_type(existing.dataType, f.dataType):
                raise LakeError(
                    f"column {f.name!r} of {table} is {existing.dataType.simpleString()}, not "
                    f"{f.dataType.simpleString()}; changing a column type needs a rewrite"
                )
        with self._errors("alter", table):
            if missing:
                # Existing rows have no value for a new column, so it cannot be NOT NULL.
                fields = pa.schema(
                    [f.with_nullable(True) for f in spark_schema_to_arrow(StructType(missing))]
                )
                dt.alter.add_columns(Schema.from_arrow(fields).fields)
                _log.info("%s: added columns %s", table, ", ".join(f.name for f in missing))
            changed = {k: v for k, v in wanted.items() if dt.metadata().configuration.get(k) != v}
            if changed:
                dt.alter.set_table_properties(changed)
        if missing or changed:
            self._after_write(table)

    # ------------------------------------------------------------------------- writing

    @staticmethod
    def _commit_properties(txn: Txn | None, metadata: Mapping[str, str] | None) -> CommitProperties:
        text = encode_user_metadata(metadata, txn)
        return CommitProperties(
            custom_metadata={"userMetadata": text} if text else None,
            app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None,
        )

    def _already_applied(self, dt: DeltaTable | None, table: TableRef, txn: Txn | None) -> bool:
        if dt is None or txn is None:
            return False
        return txn_applied(table, txn, dt.transaction_version(txn.app_id), _log)

    @staticmethod
    def _to_arrow(data: DataFrame | pa.Table) -> pa.Table:
        if isinstance(data, pa.Table):
            return data
        if isinstance(data, pa.RecordBatch):
            return pa.Table.from_batches([data])
        if hasattr(data, "schema") and hasattr(data, "sparkSession"):
            return dataframe_to_arrow(data)
        raise LakeError(
            f"data must be a pyarrow.Table or a Spark DataFrame (got a {type(data).__name__})"
        )

    @staticmethod
    def _writer_properties(layout: WriteLayout | None) -> WriterProperties | None:
        if layout is None:
            return None
        columns: dict[str, ColumnProperties] = {}
        for name in dict.fromkeys([*layout.distinct, *layout.unindexed]):
            columns[name] = ColumnProperties(
                dictionary_enabled=False if name in layout.distinct else None,
                statistics_enabled="NONE" if name in layout.unindexed else None,
            )
        return WriterProperties(
            max_row_group_size=layout.row_group_rows, column_properties=columns or None
        )

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
        dt = self._load(table)
        if self._already_applied(dt, table, txn):
            assert dt is not None
            return CommitResult(table, dt.version(), skipped=True, rows=0)
        arrow = self._to_arrow(data)
        if arrow.num_rows == 0 and txn is None:
            return CommitResult(table, None, skipped=False, rows=0)
        props = self._commit_properties(txn, metadata)
        writer = self._writer_properties(layout)
        # delta-rs takes no explicit None for its writer defaults.
        tuning: dict[str, Any] = {"writer_properties": writer} if writer is not None else {}
        with self._errors("append to", table):
            if dt is None:
                self.path(table).mkdir(parents=True, exist_ok=True)
                write_deltalake(
                    str(self.path(table)),
                    normalize_arrow(arrow),
                    mode="append",
                    commit_properties=props,
                    **tuning,
                )
                dt = self._require(table)
            else:
                target = spark_schema_to_arrow(self._schema_of(dt))
                arrow, grows = conform_to_schema(
                    arrow, target, evolve=evolve_schema, table_name=str(table)
                )
                write_deltalake(
                    dt,
                    arrow,
                    mode="append",
                    schema_mode="merge" if grows else None,
                    commit_properties=props,
                    **tuning,
                )
        version = dt.version()
        _log.debug("%s: appended %d rows as version %d", table, arrow.num_rows, version)
        self._after_write(table)
        return CommitResult(table, version, skipped=False, rows=arrow.num_rows)

    def overwrite(
        self,
        table: TableRef,
        data: DataFrame | pa.Table,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        replace_schema: bool = False,
    ) -> CommitResult:
        dt = self._load(table)
        if self._already_applied(dt, table, txn):
            assert dt is not None
            return CommitResult(table, dt.version(), skipped=True, rows=0)
        arrow = self._to_arrow(data)
        props = self._commit_properties(txn, metadata)
        with self._errors("overwrite", table):
            if dt is None:
                self.path(table).mkdir(parents=True, exist_ok=True)
                write_deltalake(
                    str(self.path(table)),
                    normalize_arrow(arrow),
                    mode="overwrite",
                    commit_properties=props,
                )
                dt = self._require(table)
            elif replace_schema:
                write_deltalake(
                    dt,
                    normalize_arrow(arrow),
                    mode="overwrite",
                    schema_mode="overwrite",
                    commit_properties=props,
                )
            else:
                target = spark_schema_to_arrow(self._schema_of(dt))
                arrow, grows = conform_to_schema(arrow, target, evolve=True, table_name=str(table))
                write_deltalake(
                    dt,
                    arrow,
                    mode="overwrite",
                    schema_mode="merge" if grows else None,
                    commit_properties=props,
                )
        _log.info("%s: overwrote with %d rows as version %d", table, arrow.num_rows, dt.version())
        self._after_write(table)
        return CommitResult(table, dt.version(), skipped=False, rows=arrow.num_rows)

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
        keys = merge_keys(on)
        started = self._clock()
        dt = self._load(table)
        if self._already_applied(dt, table, txn):
            assert dt is not None
            return MergeMetrics(table, 0, 0, 0, 0, dt.version(), True, self._clock() - started)
        arrow = normalize_arrow(self._to_arrow(source))
        lower = {c.lower() for c in arrow.column_names}
        absent = [k for k in keys if k.lower() not in lower]
        if absent:
            raise LakeError(
                f"merge into {table}: key columns {absent} are not in the source (columns: "
                f"{', '.join(arrow.column_names)})"
            )
        if dt is None:
            self.ensure_table(table, arrow_schema_to_spark(arrow.schema))
            dt = self._require(table)
        target = spark_schema_to_arrow(self._schema_of(dt))
        arrow, _grows = conform_to_schema(
            arrow, target, evolve=evolve_schema, table_name=str(table), fill_missing=False
        )
        before = dt.version()
        predicate = " AND ".join(f"target.{_dq(k)} = source.{_dq(k)}" for k in keys)
        with self._errors("merge into", table):
            merger = dt.merge(
                arrow,
                predicate,
                source_alias="source",
                target_alias="target",
                merge_schema=evolve_schema,
                commit_properties=self._commit_properties(txn, metadata),
            )
            if delete_condition:
                merger = merger.when_matched_delete(predicate=delete_condition)
            merger = merger.when_matched_update_all(predicate=update_condition)
            if insert:
                merger = merger.when_not_matched_insert_all()
            reported = merger.execute()
            dt.update_incremental()
            if txn is not None and dt.version() == before:
                # delta-rs commits nothing when no row changes; the txn must still be recorded.
                write_deltalake(
                    dt,
                    target.empty_table(),
                    mode="append",
                    commit_properties=self._commit_properties(txn, metadata),
                )
        metrics = MergeMetrics(
            table,
            inserted=int(reported.get("num_target_rows_inserted", 0)),
            updated=int(reported.get("num_target_rows_updated", 0)),
            deleted=int(reported.get("num_target_rows_deleted", 0)),
            source_rows=int(reported.get("num_source_rows", arrow.num_rows)),
            version=dt.version(),
            skipped=False,
            duration_s=self._clock() - started,
        )
        _log.info(
            "%s: merged %d source rows (%d inserted, %d updated, %d deleted) as version %d",
            table,
            metrics.source_rows,
            metrics.inserted,
            metrics.updated,
            metrics.deleted,
            metrics.version,
        )
        self._after_write(table)
        return metrics

    # ------------------------------------------------------------------------- reading

    def _reads_natively(self, dt: DeltaTable) -> bool:
        protocol = dt.protocol()
        features = set(protocol.reader_features or ())
        mapping = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
        return (
            not dt.metadata().partition_columns
            and features <= NATIVE_READER_FEATURES
            and mapping in (None, "none")
        )

    def _dataframe(self, dt: DeltaTable, table: TableRef, files: Sequence[str]) -> DataFrame:
        schema = self._schema_of(dt)
        if not self._reads_natively(dt):
            _log.info(
                "%s uses Delta features (partitions, deletion vectors or column mapping) that "
                "a plain Parquet read cannot honour; reading it through delta-rs",
                table,
            )
            with self._errors("read", table):
                return arrow_to_dataframe(self.spark, dt.to_pyarrow_table(), schema)
        if not files:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*files)

    def read(self, table: TableRef, *, version: int | None = None) -> DataFrame:
        dt = self._require(table, version)
        return self._dataframe(dt, table, dt.file_uris())

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        conditions = check_conditions(where)
        dt = self._require(table)
        schema = spark_schema_to_arrow(self._schema_of(dt))
        names = list(schema.names if columns is None else columns)
        unknown = sorted({*names, *(c for c, _op, _v in conditions)} - set(schema.names))
        if unknown:
            raise LakeError(
                f"{table} has no column {', '.join(map(repr, unknown))} (columns: "
                f"{', '.join(schema.names)})"
            )
        with self._errors("read", table):
            if not self._reads_natively(dt):
                return dt.to_pyarrow_table(columns=names, filters=conditions or None)
            # The snapshot's files are read with pyarrow's Parquet reader itself: delta-rs'
            # dataset wrapper leaves threads behind that abort the interpreter at exit
            # ("terminate called without an active exception"), and pyarrow.dataset imports
            # pandas, half a second of start-up for a landing process that never uses it.
            return _read_parquet(dt.file_uris(), schema, names, conditions)

    def read_appends(
        self, table: TableRef, *, after_version: int | None, until_version: int | None = None
    ) -> TableChanges:
        dt = self._require(table)
        current = _until(table, dt.version(), after_version, until_version)
        if current != dt.version():
            dt = self._require(table, current)
        if after_version is None:
            return TableChanges(table, self._dataframe(dt, table, dt.file_uris()), 0, current)
        if after_version == current:
            return TableChanges(table, self._dataframe(dt, table, []), None, current)
        files, reason = self._added_files(table, after_version + 1, current)
        if files is None or not self._reads_natively(dt):
            _log.warning(
                "%s: cannot read the rows added after version %d incrementally (%s); "
                "reading the whole table at version %d instead",
                table,
                after_version,
                reason or "the table needs a delta-rs read",
                current,
            )
            return TableChanges(
                table,
                self._dataframe(dt, table, dt.file_uris()),
                after_version + 1,
                current,
                full_read=True,
            )
        return TableChanges(table, self._dataframe(dt, table, files), after_version + 1, current)

    def _added_files(
        self, table: TableRef, first: int, last: int
    ) -> tuple[list[str] | None, str | None]:
        """Data files added with dataChange=true by commits first..last, or why not."""
        root = self.path(table)
        files: list[str] = []
        for version in range(first, last + 1):
            commit = root / "_delta_log" / f"{version:020d}.json"
            try:
                lines = commit.read_text(encoding="utf-8").splitlines()
            except FileNotFoundError:
                return None, f"commit {version} was removed from the log by log cleanup"
            operation = "?"
            for line in lines:
                if not line.strip():
                    continue
                action = json.loads(line)
                if "commitInfo" in action:
                    operation = action["commitInfo"].get("operation", "?")
                add, remove = action.get("add"), action.get("remove")
                if add and add.get("dataChange", True):
                    if add.get("deletionVector"):
                        return None, f"commit {version} ({operation}) uses deletion vectors"
                    files.append(self._data_file(root, add["path"]))
                if remove and remove.get("dataChange", True):
                    return None, f"commit {version} ({operation}) rewrote or deleted rows"
        return files, None

    @staticmethod
    def _data_file(root: Path, path: str) -> str:
        # Paths in the log are URIs: percent-encoded and relative to the table root unless
        # absolute.
        decoded = urllib.parse.unquote(path)
        if "://" in path:
            parsed = urllib.parse.urlparse(path)
            return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else path
        return decoded if decoded.startswith("/") else str(root / decoded)

    # ---------------------------------------------------------------------- operations

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        dt = self._require(table)
        with self._errors("read the history of", table):
            commits = dt.history(limit)
        return [_history_entry(c) for c in commits]

    def maintain(
        self,
        table: TableRef,
        *,
        compact: bool = True,
        checkpoint: bool = True,
        vacuum_hours: float | None = None,
    ) -> MaintenanceResult:
        dt = self._require(table)
        removed = added = 0
        checkpoint_version = vacuumed = None
        with self._errors("maintain", table):
            if compact:
                report = dt.optimize.compact()
                removed = int(report.get("numFilesRemoved", 0))
                added = int(report.get("numFilesAdded", 0))
            if checkpoint:
                dt.create_checkpoint()
                checkpoint_version = dt.version()
                # Removes log entries older than delta.logRetentionDuration (30 days default).
                dt.cleanup_metadata()
            if vacuum_hours is not None:
                if vacuum_hours < 0:
                    raise LakeError(f"vacuum_hours must be >= 0 (got {vacuum_hours})")
                if vacuum_hours < _MIN_SAFE_VACUUM_HOURS:
                    _log.warning(
                        "%s: vacuuming files unreferenced for %.1f h (< 7 days): readers of "
                        "older versions, and running jobs, may fail",
                        table,
                        vacuum_hours,
                    )
                deleted = dt.vacuum(
                    retention_hours=math.ceil(vacuum_hours),
                    dry_run=False,
                    enforce_retention_duration=False,
                )
                vacuumed = len(deleted)
        _log.info(
            "%s: maintenance compacted %d files into %d, checkpoint %s, vacuumed %s files",
            table,
            removed,
            added,
            checkpoint_version,
            vacuumed,
        )
        self._after_write(table)
        return MaintenanceResult(table, removed, added, checkpoint_version, vacuumed)

    # --------------------------------------------------------------------------- views

    def tables(self) -> list[TableRef]:
        """Every Delta table under ``location`` that carries this engine's prefix."""
        found = []
        for layer in LAYERS:
            layer_dir = self.location / layer
            if not layer_dir.is_dir():
                continue
            for child in sorted(layer_dir.iterdir()):
                name = child.name.removeprefix(self.table_prefix)
                if (
                    child.name.startswith(self.table_prefix)
                    and is_identifier(name)
                    and (child / "_delta_log").is_dir()
                ):
                    found.append(TableRef(layer, name))
        return found

    def register_sql(self, tables: Iterable[TableRef] | None = None) -> list[str]:
        refs = self.tables() if tables is None else list(tables)
        names = []
        for table in refs:
            self._create_view(table)
            self._registered[table] = None
            names.append(self.qualified_name(table))
        return names

    def _after_write(self, table: TableRef) -> None:
        if table in self._registered:
            self._create_view(table)

    def _create_view(self, table: TableRef) -> None:
        dt = self._require(table)
        if not self._reads_natively(dt):
            raise LakeError(
                f"{table} uses Delta features (partitions, deletion vectors or column mapping) "
                "that a view over its Parquet files cannot honour; read it with engine.read()"
            )
        schema = self._schema_of(dt)
        database = quote_identifier(self.schemas.for_layer(table.layer))
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
        body = self._view_query(schema, dt.file_uris())
        self.spark.sql(f"CREATE OR REPLACE VIEW {self.qualified_name(table)} AS {body}")
        _log.debug(
            "%s: view %s refreshed at version %d", table, self.qualified_name(table), dt.version()
        )

    def _footer_schema(self, file: str) -> StructType:
        if file not in self._footers:
            self._footers[file] = arrow_schema_to_spark(pq.read_schema(file))
        return self._footers[file]

    def _view_query(self, schema: StructType, files: Sequence[str]) -> str:
        """SELECT over the files, typed as the table: files are grouped by their own
        schema (older files lack columns added later) and each group is projected onto the
        table schema."""
        if not files:
            columns = ", ".join(
                f"CAST(NULL AS {spark_type_sql(f.dataType)}) AS {quote_identifier(f.name)}"
                for f in schema.fields
            )
            return f"SELECT {columns} FROM (SELECT 1) AS empty WHERE false"
        groups: dict[tuple[str, str], list[str]] = {}
        for file in files:
            directory, name = file.rsplit("/", 1)
            groups.setdefault((self._footer_schema(file).json(), directory), []).append(name)
        selects = []
        for (file_schema_json, directory), names in groups.items():
            file_schema = spark_schema_from_delta_json(file_schema_json)
            have = {f.name.lower(): f for f in file_schema.fields}
            columns = ", ".join(
                conform_expression(
                    quote_identifier(have[f.name.lower()].name) if f.name.lower() in have else "",
                    have[f.name.lower()].dataType if f.name.lower() in have else None,
                    f.dataType,
                )
                + f" AS {quote_identifier(f.name)}"
                for f in schema.fields
            )
            for start in range(0, len(names), _FILES_PER_GLOB):
                chunk = names[start : start + _FILES_PER_GLOB]
                glob = _escape_glob(directory) + "/{" + ",".join(map(_escape_glob, chunk)) + "}"
                selects.append(f"SELECT {columns} FROM parquet.{quote_identifier(glob)}")
        return "\nUNION ALL\n".join(selects)


def _until(
    table: TableRef, current: int, after_version: int | None, until_version: int | None
) -> int:
    """The last version ``read_appends`` reads, checked against the table's versions."""
    if after_version is not None and after_version > current:
        raise LakeError(
            f"{table} is at version {current}, before the requested after_version "
            f"{after_version}; was the table dropped and re-created?"
        )
    if until_version is None:
        return current
    if until_version > current or until_version < 0:
        raise LakeError(
            f"{table} has versions 0..{current}; cannot read appends up to version {until_version}"
        )
    if after_version is not None and until_version < after_version:
        raise LakeError(
            f"{table}: until_version {until_version} is before after_version {after_version}"
        )
    return until_version


def _read_parquet(
    files: Sequence[str], schema: pa.Schema, names: Sequence[str], conditions: Sequence[Condition]
) -> pa.Table:
    """Rows of ``files`` (typed as ``schema``; columns a file lacks read as null) matching
    every condition, with the columns ``names``. Row groups whose statistics exclude a
    condition are not read."""
    needed = list(dict.fromkeys([*names, *(column for column, _op, _v in conditions)]))
    pieces = []
    for file in files:
        parquet = pq.ParquetFile(file)
        metadata = parquet.metadata
        groups = [
            i
            for i in range(metadata.num_row_groups)
            if _may_match(metadata.row_group(i), conditions)
        ]
        if not groups:
            continue
        have = set(parquet.schema_arrow.names)
        part = parquet.read_row_groups(groups, columns=[c for c in needed if c in have])
        columns = [
            part.column(name).cast(schema.field(name).type)
            if name in have
            else pa.nulls(part.num_rows, schema.field(name).type)
            for name in needed
        ]
        part = pa.Table.from_arrays(columns, names=needed)
        if conditions:
            part = part.filter(_mask(part, conditions))
        pieces.append(part.select(list(names)))
    if not pieces:
        return pa.schema([schema.field(n) for n in names]).empty_table()
    return pa.concat_tables(pieces).cast(pa.schema([schema.field(n) for n in names]))


def _mask(table: pa.Table, conditions: Sequence[Condition]) -> pa.ChunkedArray:
    compare = {
        "=": pc.equal,
        "!=": pc.not_equal,
        "<": pc.less,
        "<=": pc.less_equal,
        ">": pc.greater,
        ">=": pc.greater_equal,
    }
    mask = None
    for column, op, value in conditions:
        values = table.column(column)
        if op == "in":
            test = pc.is_in(values, value_set=pa.array(value, type=values.type))
        else:
            test = compare[op](values, pa.scalar(value, type=values.type))
        mask = test if mask is None else pc.and_(mask, test)
    return pc.fill_null(mask, False)


def _may_match(row_group: Any, conditions: Sequence[Condition]) -> bool:
    """False only when the row group's min/max statistics rule out a condition."""
    positions = {row_group.column(i).path_in_schema: i for i in range(row_group.num_columns)}
    for column, op, value in conditions:
        index = positions.get(column)
        if index is None:
            continue  # a column added later: its nulls never match, but be conservative
        stats = row_group.column(index).statistics
        if stats is None or not stats.has_min_max:
            continue
        low, high = stats.min, stats.max
        candidates = value if op == "in" else [value]
        try:
            if op in ("=", "in") and all(v < low or v > high for v in candidates):
                return False
            if (op == "<" and not low < value) or (op == "<=" and not low <= value):
                return False
            if (op == ">" and not high > value) or (op == ">=" and not high >= value):
                return False
        except TypeError:
            continue  # statistics of another type (timestamps, decimals): no pruning
    return True


def _history_entry(commit: Mapping[str, Any]) -> HistoryEntry:
    metadata, txn = decode_user_metadata(commit.get("userMetadata"))
    parameters = {
        str(k): v if isinstance(v, str) else json.dumps(v)
        for k, v in (commit.get("operationParameters") or {}).items()
    }
    timestamp = datetime.fromtimestamp(int(commit.get("timestamp", 0)) / 1000, tz=timezone.utc)
    return HistoryEntry(
        version=int(commit["version"]),
        timestamp=timestamp,
        operation=str(commit.get("operation", "")),
        parameters=parameters,
        metrics=dict(commit.get("operationMetrics") or {}),
        metadata=metadata,
        txn=txn,
    )
