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
  long the log); everything else is ``write_deltalake`` and delta-rs' MERGE.
- A Spark session is needed only to query tables with Spark SQL (:meth:`LocalEngine.sql`):
  ``register_sql`` creates views named like the tables over their current files
  (:mod:`pipelines.engines.local_views`) and refreshes them after every write of this engine.
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
import pyarrow.compute as pc
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
    conform_to_schema,
    dataframe_to_arrow,
    fit_to_schema,
    normalize_arrow,
    same_type,
    spark_schema_from_delta_json,
    spark_schema_to_arrow,
)
from pipelines.engines.base import (
    CDF_PROPERTY,
    DEFAULT_PROPERTIES,
    LAYERS,
    BatchFunction,
    CommitResult,
    Condition,
    HistoryEntry,
    MaintenanceResult,
    MergeMetrics,
    TableChanges,
    TableFunction,
    TableRef,
    Txn,
    WriteLayout,
    check_conditions,
    check_until,
    decode_user_metadata,
    encode_user_metadata,
    merge_keys,
    txn_applied,
)
from pipelines.engines.deltalog import (
    DirectAppender,
    StaleTable,
    expire_log,
)
from pipelines.engines.local_maintenance import compact_in_tiers, keep_tombstones
from pipelines.engines.parquet_read import data_file, read_parquet
from pipelines.engines.rewrite_lock import rewrite_lock
from pipelines.engines.sql import quote_identifier
from pipelines.engines.vacuum import vacuum
from pipelines.spec import LakeSpec, SchemasSpec, is_identifier

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.engines.local_views import ViewRegistry

__all__ = ["NATIVE_READER_FEATURES", "LocalEngine"]

_log = logging.getLogger(__name__)

# Reader features that do not change how a snapshot's Parquet files are read. Anything else
# (deletion vectors, column mapping, ...) makes the engine read through delta-rs instead.
NATIVE_READER_FEATURES = frozenset(
    {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "checkpointProtection"}
)
_MIN_SAFE_VACUUM_HOURS = 168.0
# Rows per batch handed to a layer function (what Spark's Arrow batches hold here too).
BATCH_ROWS = 20_000
_CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def _dq(name: str) -> str:
    """A double-quoted identifier for delta-rs (DataFusion) SQL."""
    return '"' + name.replace('"', '""') + '"'


class LocalEngine:
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
        data: Any,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        evolve_schema: bool = True,
        layout: WriteLayout | None = None,
    ) -> CommitResult:
        arrow = normalize_arrow(self._to_arrow(data))
        direct = self._direct_append(table, [(arrow, txn)], metadata=metadata, layout=layout)
        if direct is not None:
            return direct[0]
        dt = self._load(table)
        if dt is None:
            if arrow.num_rows == 0 and txn is None:
                return CommitResult(table, None, skipped=False, rows=0)
            self.ensure_table(table, arrow_schema_to_spark(arrow.schema))
            dt = self._require(table)
        target = spark_schema_to_arrow(self._schema_of(dt))
        arrow, grows = conform_to_schema(arrow, target, evolve=evolve_schema, table_name=str(table))
        if not grows:
            direct = self._direct_append(table, [(arrow, txn)], metadata=metadata, layout=layout)
            if direct is not None:
                return direct[0]
        if self._already_applied(dt, table, txn):
            return CommitResult(table, dt.version(), skipped=True, rows=0)
        if arrow.num_rows == 0 and txn is None:
            return CommitResult(table, None, skipped=False, rows=0)
        writer = self._writer_properties(layout)
        # delta-rs takes no explicit None for its writer defaults.
        tuning: dict[str, Any] = {"writer_properties": writer} if writer is not None else {}
        with self._errors("append to", table):
            write_deltalake(
                dt,
                arrow,
                mode="append",
                schema_mode="merge" if grows else None,
                commit_properties=self._commit_properties(txn, metadata),
                **tuning,
            )
            dt.update_incremental()
        self._direct.forget(table)
        _log.debug("%s: appended %d rows as version %d", table, arrow.num_rows, dt.version())
        self._after_write(table)
        return CommitResult(table, dt.version(), skipped=False, rows=arrow.num_rows)

    def append_parts(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> list[CommitResult]:
        if not parts:
            return []
        fitted = [(normalize_arrow(data), txn) for data, txn in parts]
        direct = self._direct_append(table, fitted, metadata=metadata)
        if direct is not None:
            return direct
        dt = self._load(table)
        if dt is not None:
            target = spark_schema_to_arrow(self._schema_of(dt))
            fitted = [
                (conform_to_schema(data, target, evolve=False, table_name=str(table))[0], txn)
                for data, txn in parts
            ]
            direct = self._direct_append(table, fitted, metadata=metadata)
            if direct is not None:
                return direct
        return [self.append(table, data, txn=txn, metadata=metadata) for data, txn in parts]

    def _direct_append(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn | None]],
        *,
        metadata: Mapping[str, str] | None,
        layout: WriteLayout | None = None,
    ) -> list[CommitResult] | None:
        """The parts committed by :class:`~pipelines.engines.deltalog.DirectAppender` when it
        takes them (they have the table's exact schema and the table a plain protocol);
        ``None`` when they must go through delta-rs."""
        if not all(self._direct.accepts(table, data.schema) for data, _ in parts):
            return None
        try:
            results = self._direct.append_parts(table, parts, metadata=metadata, layout=layout)
        except StaleTable:
            return None
        if any(r.version is not None and not r.skipped for r in results):
            self._after_write(table)
        return results

    def overwrite(
        self,
        table: TableRef,
        data: Any,
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
        if dt is None:
            self.ensure_table(table, arrow_schema_to_spark(normalize_arrow(arrow).schema))
            dt = self._require(table)
        with self._rewriting(table, "overwrite"), self._errors("overwrite", table):
            dt.update_incremental()  # every file of the latest version goes (see merge)
            if replace_schema:
                arrow = normalize_arrow(arrow)
                write_deltalake(
                    dt, arrow, mode="overwrite", schema_mode="overwrite", commit_properties=props
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
            dt.update_incremental()
        self._direct.forget(table)
        _log.info("%s: overwrote with %d rows as version %d", table, arrow.num_rows, dt.version())
        self._after_write(table)
        return CommitResult(table, dt.version(), skipped=False, rows=arrow.num_rows)

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
        predicate = " AND ".join(f"target.{_dq(k)} = source.{_dq(k)}" for k in keys)
        with self._rewriting(table, "merge"), self._errors("merge into", table):
            # The latest version, read under the lock: merged into an older one, delta-rs
            # would let this commit remove files a compaction has already replaced.
            dt.update_incremental()
            before = dt.version()
            merger = dt.merge(
                arrow,
                predicate,
                source_alias="source",
                target_alias="target",
                merge_schema=evolve_schema,
                # The source is an Arrow table in memory already: merged as a table, delta-rs
                # knows its key range and joins it without streaming it through a spill-able
                # plan (a third less time for 100k changes into 1M rows).
                streamed_exec=False,
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
                dt.update_incremental()
        self._direct.forget(table)
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

    def _snapshot(
        self,
        table: TableRef,
        dt: DeltaTable,
        columns: Sequence[str] | None,
        conditions: Sequence[Condition] = (),
    ) -> pa.Table:
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
                rows = dt.to_pyarrow_table(columns=names, filters=list(conditions) or None)
                return fit_to_schema(rows, pa.schema([schema.field(n) for n in names]))
            # The snapshot's files are read with pyarrow's Parquet reader itself: delta-rs'
            # dataset wrapper leaves threads behind that abort the interpreter at exit
            # ("terminate called without an active exception"), and pyarrow.dataset imports
            # pandas, half a second of start-up for a landing process that never uses it.
            return read_parquet(dt.file_uris(), schema, names, conditions)

    def read(
        self, table: TableRef, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        return self._snapshot(table, self._require(table, version), columns)

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        return self._snapshot(table, self._require(table), columns, check_conditions(where))

    def read_keyed(
        self, table: TableRef, *, key: str, keys: Any, columns: Sequence[str] | None = None
    ) -> pa.Table:
        values = pc.unique(pc.drop_null(self._to_arrow(keys).column(key))).to_pylist()
        if not values:
            schema = spark_schema_to_arrow(self._schema_of(self._require(table)))
            names = list(schema.names if columns is None else columns)
            return pa.schema([schema.field(n) for n in names]).empty_table()
        return self.read_arrow(table, columns=columns, where=[(key, "in", values)])

    def read_appends(
        self,
        table: TableRef,
        *,
        after_version: int | None,
        until_version: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> TableChanges:
        dt = self._require(table)
        current = check_until(table, dt.version(), after_version, until_version)
        if current != dt.version():
            dt = self._require(table, current)
        if after_version is None:
            return TableChanges(table, self._snapshot(table, dt, columns), 0, current)
        schema = spark_schema_to_arrow(self._schema_of(dt))
        names = list(schema.names if columns is None else columns)
        if after_version == current:
            empty = pa.schema([schema.field(n) for n in names]).empty_table()
            return TableChanges(table, empty, None, current)
        if dt.metadata().configuration.get(CDF_PROPERTY, "false").lower() != "true":
            _log.warning(
                "%s: its change data feed is off (%s); reading the whole table at version %d "
                "instead of the rows added after version %d",
                table,
                CDF_PROPERTY,
                current,
                after_version,
            )
            return TableChanges(
                table, self._snapshot(table, dt, columns), after_version + 1, current, True
            )
        try:
            with self._errors("read the change data feed of", table):
                # Every column: delta-rs' column list is parsed as SQL, which folds the case of
                # names such as "Id".
                reader = dt.load_cdf(starting_version=after_version + 1, ending_version=current)
                changes = pa.table(reader)
        except LakeError as exc:
            _log.warning(
                "%s: cannot read the rows added after version %d from the change data feed "
                "(%s); reading the whole table at version %d instead",
                table,
                after_version,
                exc,
                current,
            )
            return TableChanges(
                table, self._snapshot(table, dt, columns), after_version + 1, current, True
            )
        wanted = pa.schema(
            [*(schema.field(n) for n in names), pa.field("_change_type", pa.string())]
        )
        # Cast first: delta-rs answers with view types, which Arrow's filter does not take.
        changes = fit_to_schema(changes, wanted)
        inserted = changes.filter(pc.equal(changes.column("_change_type"), "insert"))
        rows = inserted.drop_columns(["_change_type"])
        return TableChanges(table, rows, after_version + 1, current)

    # ---------------------------------------------------------------------- execution

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
