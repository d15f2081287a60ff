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
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from ingest.errors import LakeError

__all__ = ["DeltaSql"]

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


def _short(text: str) -> str:
    # DataFusion messages are one paragraph, sometimes with a suggestion on the next line, and
    # name tables with its default catalog in front ('datafusion.gold.x').
    text = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text.replace("'datafusion.", "'")
