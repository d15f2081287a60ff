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
  as fast); everything else is ``write_deltalake`` and delta-rs' MERGE. Those two commit
  themselves only on a local disk where a probe shows that hard links work
  (``lake.direct_writes`` turns them off); elsewhere, and after any link error, delta-rs
  commits everything.
- The lake may be on object storage (``s3://``, ``az://``, ``abfss://``, ``gs://``;
  :mod:`pipelines.engines.lake_location`): then every read and write goes through delta-rs.
- Maintenance is delta-rs' compaction, VACUUM and checkpoints; log cleanup is
  :func:`~pipelines.engines.deltalog.expire_log` (on a local disk; delta-rs'
  ``cleanup_metadata`` on object storage).
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
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
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
from pipelines.engines.deltalog import DirectAppender, expire_log, links_work
from pipelines.engines.direct_merge import DirectMerger
from pipelines.engines.lake_location import LakeLocation
from pipelines.engines.local_maintenance import (
    compact_in_tiers,
    keep_tombstones,
    log_retention_hours,
    vacuum,
)
from pipelines.engines.local_reads import NATIVE_READER_FEATURES, LocalReads
from pipelines.engines.local_writes import LocalWrites
from pipelines.engines.parquet_read import data_file
from pipelines.engines.rewrite_lock import rewrite_lock
from pipelines.engines.sql import quote_identifier
from pipelines.engines.writable import check_writable
from pipelines.spec.models import LakeSpec, SchemasSpec, StorageSpec, is_identifier

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ingest.auth import SecretResolver
    from pipelines.engines.local_views import ViewRegistry

__all__ = ["NATIVE_READER_FEATURES", "LocalEngine"]

_log = logging.getLogger(__name__)

_MIN_SAFE_VACUUM_HOURS = 168.0
# Rows per batch handed to a layer function (what Spark's Arrow batches hold here too).
BATCH_ROWS = 20_000


class LocalEngine(LocalReads, LocalWrites):
    """Delta tables on a local (or mounted) file system or on object storage, through
    delta-rs and pyarrow.

    ``spark`` (optional) is the session :meth:`sql` and :meth:`register_sql` use; nothing
    else needs one. ``clock`` times merges. ``storage`` and ``secrets`` reach a ``location``
    on object storage; ``direct_writes`` lets the engine commit appends and MERGEs itself
    where hard links work.
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
        storage: StorageSpec | None = None,
        secrets: SecretResolver | None = None,
        direct_writes: bool = True,
    ) -> None:
        self._spark = spark
        self._where = LakeLocation.parse(location, storage, secrets)
        self.location: Path | str = (
            self._where.local if self._where.local is not None else self._where.uri
        )
        # None: not probed yet (on the first direct write).
        self._direct_ok: bool | None = (
            None if direct_writes and self._where.local is not None else False
        )
        self.schemas = schemas or SchemasSpec()
        self.table_prefix = table_prefix
        self.default_properties = dict(default_properties)
        self._clock = clock
        self._tables: dict[str, DeltaTable] = {}
        self._files: pafs.FileSystem | None = None
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
        secrets: SecretResolver | None = None,
    ) -> LocalEngine:
        """The engine a ``lake:`` section describes (its ``location``, storage, schemas and
        prefix); ``secrets`` resolves the storage's credentials (default: environment
        variables)."""
        from ingest.auth import EnvSecrets

        return cls(
            spark,
            location=lake.location,
            schemas=lake.schemas,
            table_prefix=lake.table_prefix,
            clock=clock,
            storage=lake.storage,
            secrets=secrets or EnvSecrets(),
            direct_writes=lake.direct_writes,
        )

    def __repr__(self) -> str:
        return f"LocalEngine(location={self._where.uri!r})"

    # ------------------------------------------------------------------------- naming

    def physical_name(self, table: TableRef) -> str:
        return f"{self.table_prefix}{table.name}"

    def path(self, table: TableRef) -> Path:
        """Directory of ``table`` on a local disk: ``<location>/<layer>/<prefix><name>``."""
        if self._where.local is None:
            raise LakeError(f"{table} is on object storage ({self.uri(table)}): no local path")
        return self._where.local / table.layer / self.physical_name(table)

    def uri(self, table: TableRef) -> str:
        """Where delta-rs finds ``table``: its directory, or its URI on object storage."""
        return self._where.join(table.layer, self.physical_name(table))

    @property
    def storage_options(self) -> dict[str, str] | None:
        """What delta-rs is given to reach the lake (credentials included)."""
        return dict(self._where.options) or None

    def _open(self, table: TableRef, version: int | None = None) -> DeltaTable:
        return DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)

    def _object_files(self) -> tuple[str, pafs.FileSystem] | None:
        """For a lake on object storage: the root its file URIs start with, and a file
        system over it (opened once)."""
        if self._where.local is not None:
            return None
        if self._files is None:
            self._files = self._where.filesystem()
        return f"{self._where.uri}/", self._files

    def _direct_allowed(self) -> bool:
        """Whether this engine may commit appends and MERGEs itself: a local lake where hard
        links and put-if-absent work (probed once), and no link has failed since."""
        if self._direct_ok is None:
            assert self._where.local is not None
            self._where.local.mkdir(parents=True, exist_ok=True)
            self._direct_ok = links_work(self._where.local)
        return self._direct_ok

    def _direct_failed(self, exc: Exception) -> None:
        if self._direct_ok:
            _log.warning("%s: committing through delta-rs from now on: %s", self, exc)
        self._direct_ok = False

    def qualified_name(self, table: TableRef) -> str:
        schema = self.schemas.for_layer(table.layer)
        return f"{quote_identifier(schema)}.{quote_identifier(self.physical_name(table))}"

    # ----------------------------------------------------------------------- metadata

    def _load(self, table: TableRef) -> DeltaTable | None:
        uri = self.uri(table)
        cached = self._tables.get(uri)
        if cached is not None:
            held = cached.version()
            try:
                # delta-rs lists the log from the version it holds and applies what is new.
                cached.update_incremental()
            except (DeltaError, OSError):
                pass
            else:
                if self._commit_exists(uri, held):
                    return cached
            # The log was cleaned up past the cached version, or the table was removed or
            # replaced behind our back: start afresh.
            del self._tables[uri]
        if not DeltaTable.is_deltatable(uri, self.storage_options):
            return None
        with self._errors("open", table):
            loaded = self._open(table)
        self._tables[uri] = loaded
        return loaded

    def _commit_exists(self, uri: str, version: int) -> bool:
        """Whether the commit file of ``version`` is still in the table's log at ``uri``."""
        name = f"_delta_log/{version:020d}.json"
        files = self._object_files()
        if files is None:
            return (Path(uri) / name).exists()
        root, fs = files
        info = fs.get_file_info(f"{uri.removeprefix(root)}/{name}")
        return bool(info.type != pafs.FileType.NotFound)

    def _require(self, table: TableRef, version: int | None = None) -> DeltaTable:
        current = self._load(table)
        if current is None:
            raise LakeError(f"table {table} does not exist (no Delta table at {self.uri(table)})")
        if version is None or version == current.version():
            return current
        if version < 0 or version > current.version():
            raise LakeError(
                f"table {table} has versions 0..{current.version()}; cannot read version {version}"
            )
        with self._errors(f"open version {version} of", table):
            return self._open(table, version)

    def _rewriting(self, table: TableRef, action: str) -> contextlib.AbstractContextManager[None]:
        """The table's rewrite lock (:mod:`pipelines.engines.rewrite_lock`): held by every
        commit that removes files, since delta-rs lets two such commits of one file through."""
        return rewrite_lock(
            self._where.lock_dir(), f"{table.layer}.{self.physical_name(table)}", action=action
        )

    @contextlib.contextmanager
    def _errors(self, action: str, table: TableRef) -> Iterator[None]:
        try:
            yield
        except LakeError:
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise LakeError(f"{action} {table} ({self.uri(table)}) failed: {exc}") from exc

    def ensure_writable(self) -> None:
        # A lake on object storage is judged by its store at the first commit.
        if not self._writable and self._where.local is not None:
            check_writable(self._where.local)
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
            if self._where.local is not None:
                self.path(table).mkdir(parents=True, exist_ok=True)
            with self._errors("create", table):
                DeltaTable.create(
                    self.uri(table),
                    spark_schema_to_arrow(schema),
                    mode="ignore",
                    configuration=wanted or None,
                    storage_options=self.storage_options,
                )
            _log.info("created %s at %s", table, self.uri(table))
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
        uri = self.uri(table)
        if not DeltaTable.is_deltatable(uri, self.storage_options):
            raise LakeError(f"table {table} does not exist (no Delta table at {uri})")
        if log_hours is not None and log_hours < 0:
            raise LakeError(f"log_hours must be >= 0 (got {log_hours})")
        if vacuum_hours is not None and vacuum_hours < 0:
            raise LakeError(f"vacuum_hours must be >= 0 (got {vacuum_hours})")
        removed = added = 0
        checkpoint_version = vacuumed = expired = None
        with self._errors("maintain", table):
            dt = self._open(table)
            if compact:
                with self._rewriting(table, "compaction"):
                    dt.update_incremental()
                    removed, added = compact_in_tiers(dt)
            if vacuum_hours is not None:
                if vacuum_hours < _MIN_SAFE_VACUUM_HOURS:
                    _log.warning(
                        "%s: vacuuming files unreferenced for %.1f h (< 7 days): readers of "
                        "older versions, and running jobs, may fail",
                        table,
                        vacuum_hours,
                    )
                dt.update_incremental()
                before = _data_files(self.path(table)) if self._where.local else None
                vacuumed = vacuum(dt, vacuum_hours)
                if before is not None:
                    vacuumed = max(0, before - _data_files(self.path(table)))
            if tombstone_hours is not None:
                keep_tombstones(table, dt, tombstone_hours)
            # The checkpoint last, so it covers vacuum's commits, and the log cleanup after it.
            if checkpoint:
                dt.update_incremental()
                dt.create_checkpoint()
                checkpoint_version = dt.version()
                expired = self._clean_log(table, dt, log_hours, log_from_version)
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

    def _clean_log(
        self, table: TableRef, dt: DeltaTable, log_hours: float | None, keep: int | None
    ) -> int | None:
        """Delete the log entries older than ``log_hours`` (None: the table's
        ``delta.logRetentionDuration``, 30 days unless set) that no kept version needs."""
        hours = log_retention_hours(dt) if log_hours is None else log_hours
        if self._where.local is None:
            if log_hours is not None and log_hours < log_retention_hours(dt):
                _log.warning(
                    "%s: on object storage delta-rs cleans the log after the table's "
                    "delta.logRetentionDuration (%g h), not after %g h",
                    table,
                    log_retention_hours(dt),
                    log_hours,
                )
            dt.cleanup_metadata()
            return None
        if math.isinf(hours):
            return 0
        return expire_log(
            self.path(table) / "_delta_log",
            older_than=time.time() - hours * 3600,
            keep_version=keep,
        )

    # --------------------------------------------------------------------------- views

    def tables(self) -> list[TableRef]:
        """Every Delta table under ``location`` that carries this engine's prefix."""
        from pyarrow.fs import FileSelector, FileType

        found = []
        filesystem = self._where.filesystem()
        for layer in LAYERS:
            try:
                children = filesystem.get_file_info(FileSelector(layer, allow_not_found=True))
            except (OSError, DeltaError):
                continue
            for child in sorted(children, key=lambda c: c.base_name):
                name = child.base_name.removeprefix(self.table_prefix)
                if (
                    child.type == FileType.Directory
                    and child.base_name.startswith(self.table_prefix)
                    and is_identifier(name)
                    and DeltaTable.is_deltatable(
                        self._where.join(layer, child.base_name), self.storage_options
                    )
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

        if self._where.local is None:
            raise LakeError(
                f"{table} is on object storage ({self.uri(table)}): Spark SQL views over its "
                "files need a local lake; read it with engine.read() or sfcdc sql"
            )
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


def _data_files(directory: Path) -> int:
    """Data and change data files under a table directory (its log aside)."""
    count = 0
    for _root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        count += sum(1 for f in files if f.endswith(".parquet") and not f.startswith("."))
    return count


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
