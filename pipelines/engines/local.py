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
- Schemas are Arrow schemas inside the engine, in the Arrow types Delta stores
  (:mod:`pipelines.engines.arrow`). A method that takes a schema takes a Spark ``StructType``
  or a ``pyarrow.Schema`` and turns it into that once (:func:`_arrow_schema`); :meth:`schema`
  answers a ``StructType``, read from the table's log. Nothing below this module sees a Spark
  type.

:class:`LocalEngine` is composed of roles that share one
:class:`~pipelines.engines.local_tables.LocalTables` (where each table lives, the cache of
opened tables, error translation, the rewrite lock, the direct-write policy, the write hook):
:class:`~pipelines.engines.local_reads.LocalReader` reads,
:class:`~pipelines.engines.local_writes.LocalWriter` creates tables and writes,
:class:`~pipelines.engines.local_maintenance.LocalMaintainer` maintains and
:class:`~pipelines.engines.local_sql.LocalSql` serves SQL. The engine itself answers for table
metadata and the in-process execution, and hands everything else to its roles.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from ingest.errors import LakeError
from pipelines.engines.arrow import (
    delta_schema,
    fit_to_schema,
    normalize_arrow,
    spark_schema_from_delta_json,
    spark_schema_to_arrow,
)
from pipelines.engines.base import (
    DEFAULT_PROPERTIES,
    BatchFunction,
    CommitResult,
    Condition,
    HistoryEntry,
    Kept,
    MaintenanceResult,
    MergeMetrics,
    TableChanges,
    TableFunction,
    TableRef,
    Txn,
    WriteLayout,
    merge_keys,
)
from pipelines.engines.deltalog import DirectAppender
from pipelines.engines.direct_merge import DirectMerger
from pipelines.engines.lake_location import LakeLocation
from pipelines.engines.local_maintenance import LocalMaintainer
from pipelines.engines.local_reads import NATIVE_READER_FEATURES, LocalReader
from pipelines.engines.local_sql import LocalSql
from pipelines.engines.local_tables import LocalTables, as_arrow, schema_of
from pipelines.engines.local_writes import LocalWriter
from pipelines.engines.writable import check_writable
from pipelines.spec.models import LakeSpec, SchemasSpec, StorageSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ingest.auth import SecretResolver

__all__ = ["NATIVE_READER_FEATURES", "LocalEngine"]

# Rows per batch handed to a layer function (what Spark's Arrow batches hold here too).
BATCH_ROWS = 20_000


def _arrow_schema(schema: StructType | pa.Schema) -> pa.Schema:
    """``schema`` (a Spark or an Arrow schema) in the Arrow types Delta stores: the schema
    the engine's roles work in."""
    if isinstance(schema, pa.Schema):
        return delta_schema(schema)
    return spark_schema_to_arrow(schema)


class LocalEngine:
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
        self._where = LakeLocation.parse(location, storage, secrets)
        self.location: Path | str = (
            self._where.local if self._where.local is not None else self._where.uri
        )
        self.schemas = schemas or SchemasSpec()
        self.table_prefix = table_prefix
        self.default_properties = dict(default_properties)
        self._lake = LocalTables(
            self._where, table_prefix=table_prefix, direct_writes=direct_writes, owner=repr(self)
        )
        self._direct = DirectAppender(self._lake.path)
        self._reads = LocalReader(self._lake)
        self._writes = LocalWriter(
            self._lake,
            appender=self._direct,
            merger=DirectMerger(),
            clock=clock,
            default_properties=self.default_properties,
        )
        self._maintenance = LocalMaintainer(self._lake)
        self._sql = LocalSql(self._lake, spark, self.schemas)
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
        return self._lake.physical_name(table)

    def path(self, table: TableRef) -> Path:
        """Directory of ``table`` on a local disk: ``<location>/<layer>/<prefix><name>``."""
        return self._lake.path(table)

    def uri(self, table: TableRef) -> str:
        """Where delta-rs finds ``table``: its directory, or its URI on object storage."""
        return self._lake.uri(table)

    @property
    def storage_options(self) -> dict[str, str] | None:
        """What delta-rs is given to reach the lake (credentials included)."""
        return self._lake.storage_options

    def qualified_name(self, table: TableRef) -> str:
        return self._sql.qualified_name(table)

    # ----------------------------------------------------------------------- metadata

    def ensure_writable(self) -> None:
        # A lake on object storage is judged by its store at the first commit.
        if not self._writable and self._where.local is not None:
            check_writable(self._where.local)
        self._writable = True

    def exists(self, table: TableRef) -> bool:
        return self._lake.load(table) is not None

    def version(self, table: TableRef) -> int | None:
        dt = self._lake.load(table)
        return None if dt is None else dt.version()

    def schema(self, table: TableRef) -> StructType | None:
        dt = self._lake.load(table)
        # The interface answers in Spark types: straight from the log's JSON schema.
        return None if dt is None else spark_schema_from_delta_json(dt.schema().to_json())

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        dt = self._lake.load(table)
        if dt is None:
            return None
        recorded = dt.transaction_version(app_id)
        return None if recorded is None else int(recorded)

    def ensure_table(
        self,
        table: TableRef,
        schema: StructType | pa.Schema,
        *,
        properties: Mapping[str, str] | None = None,
        deletion_vectors: bool = False,
    ) -> None:
        self._writes.ensure_table(
            table, _arrow_schema(schema), properties=properties, deletion_vectors=deletion_vectors
        )

    # ---------------------------------------------------------------------- execution

    def rows(self, data: pa.Table, schema: StructType | pa.Schema | None = None) -> pa.Table:
        if schema is None:
            return normalize_arrow(data)
        return fit_to_schema(data, _arrow_schema(schema))

    def map_batches(
        self, rows: Any, function: BatchFunction, schema: StructType | pa.Schema
    ) -> pa.Table:
        target = _arrow_schema(schema)
        batches = as_arrow(rows).to_batches(max_chunksize=BATCH_ROWS)
        out = [fit_to_schema(pa.Table.from_batches([b]), target) for b in function(iter(batches))]
        return pa.concat_tables(out) if out else target.empty_table()

    def map_groups(
        self,
        rows: Any,
        *,
        key: str,
        function: TableFunction,
        schema: StructType | pa.Schema,
        partitions: int | None = None,
    ) -> pa.Table:
        # One call over every row: the rows are in this process already.
        return fit_to_schema(function(as_arrow(rows)), _arrow_schema(schema))

    def union(self, parts: Sequence[Any], schema: StructType | pa.Schema) -> pa.Table:
        target = _arrow_schema(schema)
        tables = [fit_to_schema(as_arrow(p), target) for p in parts]
        return pa.concat_tables(tables) if tables else target.empty_table()

    def persist(self, rows: Any) -> pa.Table:
        return as_arrow(rows)

    def release(self, rows: Any) -> None:
        """Nothing to free: the rows are Arrow tables of this process."""

    def to_arrow(self, rows: Any) -> pa.Table:
        return as_arrow(rows)

    def count(self, rows: Any) -> int:
        return int(as_arrow(rows).num_rows)

    # -------------------------------------------------------------------------- reads

    def read(
        self, table: TableRef, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        return self._reads.read(table, version=version, columns=columns)

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        return self._reads.read_arrow(table, columns=columns, where=where)

    def read_keyed(
        self, table: TableRef, *, key: str, keys: Any, columns: Sequence[str] | None = None
    ) -> pa.Table:
        return self._reads.read_keyed(table, key=key, keys=keys, columns=columns)

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

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        return self._reads.history(table, limit=limit)

    # ------------------------------------------------------------------------- writes

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
        if keep is not None:
            source = self._kept(table, as_arrow(source), on, keep)
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
        )

    def _kept(self, table: TableRef, source: pa.Table, on: Sequence[str], keep: Kept) -> pa.Table:
        """``source`` without its flags, each kept column holding the table's value where the
        flags keep it (in the rows the table has): the MERGE then sets whole rows."""
        keys = merge_keys(on)
        absent = [c for c in (keep.flags, *keep.columns) if c not in source.column_names]
        if absent or len(keys) != 1:
            raise LakeError(
                f"merge into {table} keeping columns: "
                + (f"{absent} are not columns of the source" if absent else "one key only")
            )
        flags = source.column(keep.flags)
        source = source.drop_columns([keep.flags])
        if not self.exists(table):
            return source
        schema = schema_of(self._lake.require(table))
        lacking = [c for c in source.column_names if c not in schema.names]
        if lacking:
            raise LakeError(
                f"merge into {table} keeping columns: {lacking} are not columns of the table"
            )
        key = keys[0]
        target = self._reads.read_keyed(table, key=key, keys=source, columns=[key, *keep.columns])
        if not target.num_rows:
            return source
        found = pc.index_in(source.column(key), value_set=target.column(key))
        rows = pc.fill_null(found, 0)
        for number, column in enumerate(keep.columns):
            flag = pc.utf8_slice_codeunits(flags, number, number + 1)
            kept = pc.fill_null(pc.and_(pc.is_valid(found), pc.equal(flag, "0")), False)
            if not pc.any(kept).as_py():
                continue
            values = source.column(column)
            before = target.column(column).take(rows).cast(values.type)
            place = source.column_names.index(column)
            source = source.set_column(place, column, pc.if_else(kept, before, values))
        return source

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

    # -------------------------------------------------------------------- maintenance

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
        return self._maintenance.maintain(
            table,
            compact=compact,
            checkpoint=checkpoint,
            vacuum_hours=vacuum_hours,
            log_hours=log_hours,
            log_from_version=log_from_version,
            tombstone_hours=tombstone_hours,
        )

    # --------------------------------------------------------------------------- views

    def tables(self) -> list[TableRef]:
        """Every Delta table under ``location`` that carries this engine's prefix."""
        return self._lake.tables()

    @property
    def spark(self) -> SparkSession:
        """The session queries run in (:meth:`sql`)."""
        return self._sql.spark

    def register_sql(self, tables: Iterable[TableRef] | None = None) -> list[str]:
        return self._sql.register_sql(tables)

    def sql(self, text: str) -> DataFrame:
        return self._sql.sql(text)

    def query_arrow(self, text: str, tables: Iterable[TableRef], *, limit: int) -> pa.Table:
        return self._sql.query_arrow(text, tables, limit=limit)
