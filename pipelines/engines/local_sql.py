"""One-shot SQL on the local engine with delta-rs's own query engine (DataFusion), no Spark.

``sfcdc sql "<query>"`` on a laptop used to start a Spark session for every query (20 s and
more); :class:`DeltaSql` answers it through ``deltalake.QueryBuilder`` in well under a second.
Each table a query names is opened with delta-rs and registered under the name Spark SQL knows
it by (``gold.account``: the layer's schema, then the table), so the same text runs on both.

DataFusion's dialect is not Spark's. Identifiers keep their case here (Salesforce's column
names are mixed case; DataFusion would lower-case unquoted names), but some functions differ:
``count_if``, ``size``, ``hex`` of binary and ``date_format`` are Spark's only, for example
(docs/querying.md lists them); a query that needs them runs in the interactive prompt or on the
spark engine.

:class:`LocalSql` is the SQL role of :class:`~pipelines.engines.local.LocalEngine`: Spark SQL
views over its tables (:mod:`pipelines.engines.local_views`), refreshed after each write, and
one-shot queries with :class:`DeltaSql`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from ingest.errors import LakeError
from pipelines.engines.base import TableRef
from pipelines.engines.local_reads import reads_natively
from pipelines.engines.local_tables import LocalTables
from pipelines.engines.parquet_read import data_file
from pipelines.engines.sql import quote_identifier
from pipelines.spec.models import SchemasSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.engines.local_views import ViewRegistry

__all__ = ["DeltaSql", "LocalSql"]

# Keep identifier case (DataFusion lower-cases unquoted names by default), as Spark does.
_SESSION = {"datafusion.sql_parser.enable_ident_normalization": "false"}


class DeltaSql:
    """A DataFusion session over Delta tables given as ``{"schema.table": DeltaTable}``."""

    def __init__(self, tables: Mapping[str, DeltaTable]) -> None:
        self._builder = QueryBuilder(_SESSION)
        schemas = sorted({name.split(".", 1)[0] for name in tables})
        for schema in schemas:
            self._builder.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"').read_all()
        for name, table in tables.items():
            self._builder.register(name, table)
        self.names = tuple(tables)

    def query(self, text: str, *, limit: int | None = None) -> pa.Table:
        """The rows of ``text`` (a read-only query), at most ``limit`` of them."""
        try:
            reader = self._builder.execute(text)
            if limit is None:
                return pa.table(reader.read_all())
            batches: list[pa.RecordBatch] = []
            rows = 0
            stream = pa.RecordBatchReader.from_stream(reader)
            for batch in stream:
                batches.append(batch)
                rows += batch.num_rows
                if rows >= limit:
                    break
            return pa.Table.from_batches(batches, schema=stream.schema).slice(0, limit)
        except Exception as exc:  # DataFusion raises its own error types for SQL and planning
            raise LakeError(_short(str(exc))) from None


class LocalSql:
    """Spark SQL views over the tables of ``lake`` (in ``spark``, named with ``schemas``) and
    one-shot DataFusion queries of them. A table's view, once registered, is refreshed after
    every write to it."""

    def __init__(self, lake: LocalTables, spark: SparkSession | None, schemas: SchemasSpec) -> None:
        self._lake = lake
        self._spark = spark
        self.schemas = schemas
        self._registered: dict[TableRef, None] = {}
        self._views: ViewRegistry | None = None
        lake.on_write(self._after_write)

    def qualified_name(self, table: TableRef) -> str:
        schema = self.schemas.for_layer(table.layer)
        return f"{quote_identifier(schema)}.{quote_identifier(self._lake.physical_name(table))}"

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
        refs = self._lake.tables() if tables is None else list(tables)
        names = []
        for table in refs:
            self._create_view(table)
            self._registered[table] = None
            names.append(self.qualified_name(table))
        return names

    def sql(self, text: str) -> DataFrame:
        return self.spark.sql(text)

    def query_arrow(self, text: str, tables: Iterable[TableRef], *, limit: int) -> pa.Table:
        named = {
            f"{self.schemas.for_layer(t.layer)}.{self._lake.physical_name(t)}": (
                self._lake.require(t)
            )
            for t in tables
        }
        return DeltaSql(named).query(text, limit=limit)

    def _after_write(self, table: TableRef) -> None:
        if table in self._registered:
            self._create_view(table)

    def _create_view(self, table: TableRef) -> None:
        from pipelines.engines.local_views import ViewRegistry

        lake = self._lake
        if lake.where.local is None:
            raise LakeError(
                f"{table} is on object storage ({lake.uri(table)}): Spark SQL views over its "
                "files need a local lake; read it with engine.read() or sfcdc sql"
            )
        dt = lake.require(table)
        if not reads_natively(dt):
            raise LakeError(
                f"{table} uses Delta features (partitions, deletion vectors or column mapping) "
                "that a view over its Parquet files cannot honour; read it with engine.read()"
            )
        if self._views is None:
            self._views = ViewRegistry(self.spark)
        self._views.create(
            self.schemas.for_layer(table.layer),
            self.qualified_name(table),
            dt.schema().to_json(),
            [data_file(u) for u in dt.file_uris()],
        )


def _short(text: str) -> str:
    # DataFusion messages are one paragraph, sometimes with a suggestion on the next line, and
    # name tables with its default catalog in front ('datafusion.gold.x').
    text = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text.replace("'datafusion.", "'")
