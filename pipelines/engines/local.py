"""The ``local`` lake engine: delta-rs for the Delta log, commits and MERGE, pyarrow for
files, and the layer functions run in this process.

Tables live under ``<location>/<layer>/<prefix><name>`` and are never partitioned (the
pipeline's tables are small to medium and partitioning a CDC stream by date only produces
small files). They are ordinary Delta tables with the change data feed on: any Delta reader,
delta-spark included, opens them, and the spark engine pointed at the same location reads and
writes them too.

- The pipeline needs no JVM here: rows are Arrow tables, :meth:`LocalEngine.map_batches` and
  :meth:`LocalEngine.map_groups` call the layer functions directly, reads go through delta-rs
  (snapshots as Parquet files read with pyarrow, appended rows from the change data feed).
- Appends to a table of the plain protocol whose schema the rows already have are committed
  by :class:`~pipelines.engines.deltalog.DirectAppender` (a constant cost per commit, however
  long the log); a MERGE of the kind the pipeline runs (one key, simple clause conditions) by
  :class:`~pipelines.engines.direct_merge.DirectMerger` (copy-on-write in Arrow, about twice
  as fast); everything else is ``write_deltalake`` and delta-rs' MERGE.
- A Spark session is needed only to query tables with Spark SQL (:meth:`LocalEngine.sql`):
  ``register_sql`` creates views named like the tables over their current files
  (:mod:`pipelines.engines.local_views`) and refreshes them after every write of this engine.

The reads are :class:`~pipelines.engines.local_reads.LocalReads`, the writes
:class:`~pipelines.engines.local_writes.LocalWrites`; :class:`LocalEngine` holds the tables,
their metadata, the in-process execution, maintenance and the SQL views.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.exceptions import DeltaError
from pyspark.sql.types import StructType

from ingest.errors import LakeError
from pipelines.engines.arrow import (
    dataframe_to_arrow,
    fit_to_schema,
    normalize_arrow,
    same_type,
    spark_schema_from_delta_json,
    spark_schema_to_arrow,
)
from pipelines.engines.base import (
    DEFAULT_PROPERTIES,
    LAYERS,
    BatchFunction,
    HistoryEntry,
    MaintenanceResult,
    TableFunction,
    TableRef,
    decode_user_metadata,
)
from pipelines.engines.deltalog import DirectAppender, expire_log
from pipelines.engines.direct_merge import DirectMerger
from pipelines.engines.local_maintenance import compact_in_tiers, keep_tombstones
from pipelines.engines.local_reads import NATIVE_READER_FEATURES, LocalReads
from pipelines.engines.local_writes import LocalWrites
from pipelines.engines.parquet_read import data_file
from pipelines.engines.rewrite_lock import rewrite_lock
from pipelines.engines.sql import quote_identifier
from pipelines.engines.vacuum import vacuum
from pipelines.engines.writable import check_writable
from pipelines.spec import LakeSpec, SchemasSpec, is_identifier

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.engines.local_views import ViewRegistry

__all__ = ["NATIVE_READER_FEATURES", "LocalEngine"]

_log = logging.getLogger(__name__)

_MIN_SAFE_VACUUM_HOURS = 168.0
# Rows per batch handed to a layer function (what Spark's Arrow batches hold here too).
BATCH_ROWS = 20_000


class LocalEngine(LocalReads, LocalWrites):
    """Delta tables on a local (or mounted) file system, through delta-rs and pyarrow.

    ``spark`` (optional) is the session :meth:`sql` and :meth:`register_sql` use; nothing
    else needs one. ``clock`` times merges.
    """

    name: Literal["local"] = "local"

    def __init__(
        self,
        spark: SparkSession | None = None,
        *,
        location: str | Path,
        schemas: SchemasSpec | None = None,
        table_prefix: str = "",
        clock: Callable[[], float] = time.perf_counter,
        default_properties: Mapping[str, str] = DEFAULT_PROPERTIES,
    ) -> None:
        self._spark = spark
        self.location = Path(location).expanduser().absolute()
        self.schemas = schemas or SchemasSpec()
        self.table_prefix = table_prefix
        self.default_properties = dict(default_properties)
        self._clock = clock
        self._tables: dict[Path, DeltaTable] = {}
        self._registered: dict[TableRef, None] = {}
        self._views: ViewRegistry | None = None
        self._direct = DirectAppender(self.path)
        self._merger = DirectMerger()
        self._writable = False

    @classmethod
    def from_spec(
        cls,
        lake: LakeSpec,
        spark: SparkSession | None = None,
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
            moved = _log_moved(path, cached.version())
            if moved is None:
                return cached
            if moved:
                try:
                    cached.update_incremental()
                except (DeltaError, OSError):
                    del self._tables[path]
                else:
                    return cached
            else:
                # Its own commit is gone: the log was cleaned up past it, or the table was
                # removed or replaced behind our back. Start afresh.
                del self._tables[path]
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

    def _rewriting(self, table: TableRef, action: str) -> contextlib.AbstractContextManager[None]:
        """The table's rewrite lock (:mod:`pipelines.engines.rewrite_lock`): held by every
        commit that removes files, since delta-rs lets two such commits of one file through."""
        return rewrite_lock(
            self.location, f"{table.layer}.{self.physical_name(table)}", action=action
        )

    @contextlib.contextmanager
    def _errors(self, action: str, table: TableRef) -> Iterator[None]:
        try:
            yield
        except LakeError:
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise LakeError(f"{action} {table} ({self.path(table)}) failed: {exc}") from exc

    def ensure_writable(self) -> None:
        if not self._writable:
            check_writable(self.location)
            self._writable = True

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
        self,
        table: TableRef,
        schema: StructType,
        *,
        properties: Mapping[str, str] | None = None,
        deletion_vectors: bool = False,
    ) -> None:
        # delta-rs neither writes deletion vectors nor reads a table that has them: a MERGE
        # here rewrites the files it touches, whatever deletion_vectors asks.
        wanted = {**self.default_properties, **(properties or {})}
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

    # ---------------------------------------------------------------------- execution

    @staticmethod
    def _to_arrow(data: Any) -> pa.Table:
        if isinstance(data, pa.Table):
            return data
        if isinstance(data, pa.RecordBatch):
            return pa.Table.from_batches([data])
        if hasattr(data, "schema") and hasattr(data, "sparkSession"):
            return dataframe_to_arrow(data)
        raise LakeError(
            f"data must be a pyarrow.Table or a Spark DataFrame (got a {type(data).__name__})"
        )

    def rows(self, data: pa.Table, schema: StructType | None = None) -> pa.Table:
        if schema is None:
            return normalize_arrow(data)
        return fit_to_schema(data, spark_schema_to_arrow(schema))

    def map_batches(self, rows: Any, function: BatchFunction, schema: StructType) -> pa.Table:
        target = spark_schema_to_arrow(schema)
        batches = self._to_arrow(rows).to_batches(max_chunksize=BATCH_ROWS)
        out = [fit_to_schema(pa.Table.from_batches([b]), target) for b in function(iter(batches))]
        return pa.concat_tables(out) if out else target.empty_table()

    def map_groups(
        self,
        rows: Any,
        *,
        key: str,
        function: TableFunction,
        schema: StructType,
        partitions: int | None = None,
    ) -> pa.Table:
        # One call over every row: the rows are in this process already.
        return fit_to_schema(function(self._to_arrow(rows)), spark_schema_to_arrow(schema))

    def union(self, parts: Sequence[Any], schema: StructType) -> pa.Table:
        target = spark_schema_to_arrow(schema)
        tables = [fit_to_schema(self._to_arrow(p), target) for p in parts]
        return pa.concat_tables(tables) if tables else target.empty_table()

    def persist(self, rows: Any) -> pa.Table:
        return self._to_arrow(rows)

    def release(self, rows: Any) -> None:
        """Nothing to free: the rows are Arrow tables of this process."""

    def to_arrow(self, rows: Any) -> pa.Table:
        return self._to_arrow(rows)

    def count(self, rows: Any) -> int:
        return int(self._to_arrow(rows).num_rows)

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
        log_hours: float | None = None,
        log_from_version: int | None = None,
        tombstone_hours: float | None = None,
    ) -> MaintenanceResult:
        # A table of its own: maintenance may run on a thread beside this engine's appends.
        path = self.path(table)
        if not DeltaTable.is_deltatable(str(path)):
            raise LakeError(f"table {table} does not exist (no Delta table at {path})")
        if log_hours is not None and log_hours < 0:
            raise LakeError(f"log_hours must be >= 0 (got {log_hours})")
        removed = added = 0
        checkpoint_version = vacuumed = expired = None
        with self._errors("maintain", table):
            dt = DeltaTable(str(path))
            if compact:
                with self._rewriting(table, "compaction"):
                    dt.update_incremental()
                    removed, added = compact_in_tiers(dt)
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
                # Files a writer has yet to commit are newer than the table's last commit, and
                # stay (pipelines.engines.vacuum).
                vacuumed = vacuum(dt, path, vacuum_hours)
            if tombstone_hours is not None:
                keep_tombstones(table, dt, tombstone_hours)
            # The checkpoint last, so it covers vacuum's commits, and the log cleanup after it
            # (vacuum reads the log entries it would delete).
            if checkpoint:
                dt.create_checkpoint()
                checkpoint_version = dt.version()
                if log_hours is None:
                    # Removes log entries older than delta.logRetentionDuration (30 days).
                    dt.cleanup_metadata()
                else:
                    expired = expire_log(
                        path / "_delta_log",
                        older_than=time.time() - log_hours * 3600,
                        keep_version=log_from_version,
                    )
        _log.info(
            "%s: maintenance compacted %d files into %d, checkpoint %s, vacuumed %s files, "
            "removed %s log entries",
            table,
            removed,
            added,
            checkpoint_version,
            vacuumed,
            expired,
        )
        self._after_write(table)
        return MaintenanceResult(table, removed, added, checkpoint_version, vacuumed, expired)

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

    @property
    def spark(self) -> SparkSession:
        """The session queries run in (:meth:`sql`)."""
        if self._spark is None:
            raise LakeError(
                "this local engine was created without a Spark session; querying tables with "
                "Spark SQL needs one (pass spark=local_session())"
            )
        return self._spark

    def register_sql(self, tables: Iterable[TableRef] | None = None) -> list[str]:
        refs = self.tables() if tables is None else list(tables)
        names = []
        for table in refs:
            self._create_view(table)
            self._registered[table] = None
            names.append(self.qualified_name(table))
        return names

    def sql(self, text: str) -> DataFrame:
        return self.spark.sql(text)

    def query_arrow(self, text: str, tables: Iterable[TableRef], *, limit: int) -> pa.Table:
        from pipelines.engines.local_sql import DeltaSql

        named = {
            f"{self.schemas.for_layer(t.layer)}.{self.physical_name(t)}": self._require(t)
            for t in tables
        }
        return DeltaSql(named).query(text, limit=limit)

    def _after_write(self, table: TableRef) -> None:
        if table in self._registered:
            self._create_view(table)

    def _create_view(self, table: TableRef) -> None:
        from pipelines.engines.local_views import ViewRegistry

        dt = self._require(table)
        if not self._reads_natively(dt):
            raise LakeError(
                f"{table} uses Delta features (partitions, deletion vectors or column mapping) "
                "that a view over its Parquet files cannot honour; read it with engine.read()"
            )
        if self._views is None:
            self._views = ViewRegistry(self.spark)
        self._views.create(
            self.schemas.for_layer(table.layer),
            self.qualified_name(table),
            self._schema_of(dt),
            [data_file(u) for u in dt.file_uris()],
        )


def _log_moved(table_dir: Path, version: int) -> bool | None:
    """Whether the log of ``table_dir`` moved past ``version``: ``None`` when it did not,
    ``True`` for a later commit, ``False`` when that version's own commit is gone (a log
    cleanup, or the table removed or replaced). Two file checks, where delta-rs'
    ``update_incremental`` lists the whole log directory, which holds thousands of entries on
    a table that commits every second."""
    log = table_dir / "_delta_log"
    if not (log / f"{version:020d}.json").exists():
        return False
    return True if (log / f"{version + 1:020d}.json").exists() else None


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
