"""Spark SQL views over the local engine's tables, for people querying a local lake.

The local engine runs the pipeline without Spark; ``sfcdc sql`` and notebooks query its
tables through Spark SQL. A table becomes a permanent view named like the table
(``gold.account``) over the Parquet files of its current snapshot: files are grouped by their
own schema (older files lack columns added later) and each group is projected onto the table
schema, so every column reads with the table's type. The engine refreshes a view after each
of its writes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from pipelines.engines.arrow import arrow_schema_to_spark, spark_schema_from_delta_json
from pipelines.engines.sql import conform_expression, quote_identifier, spark_type_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["ViewRegistry"]

_log = logging.getLogger(__name__)

# Hadoop glob metacharacters; Spark globs every path it is given.
_GLOB_SPECIAL = "\\*?[]{},"
_FILES_PER_GLOB = 500


def _escape_glob(text: str) -> str:
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in text)


class ViewRegistry:
    """Permanent views of ``spark``'s catalog over local Delta tables' snapshots."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._footers: dict[str, StructType] = {}

    def create(self, database: str, qualified: str, schema_json: str, files: Sequence[str]) -> None:
        """(Re)create the view ``qualified`` (in ``database``) over ``files`` typed as the
        table's schema ``schema_json`` (Delta's JSON schema, as its log holds it: the view is
        Spark's, so the schema goes straight to Spark types)."""
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database)}")
        body = self._query(spark_schema_from_delta_json(schema_json), files)
        self._make_room(qualified)
        self.spark.sql(f"CREATE OR REPLACE VIEW {qualified} AS {body}")
        _log.debug("view %s refreshed over %d files", qualified, len(files))

    def _make_room(self, qualified: str) -> None:
        """Drop an external table of that name (the spark engine's name for a table at a
        location, which may be this very table): the view takes its place."""
        dotted = qualified.replace("`", "")
        if not self.spark.catalog.tableExists(dotted):
            return
        kind = str(self.spark.catalog.getTable(dotted).tableType).upper()
        if kind == "EXTERNAL":
            self.spark.sql(f"DROP TABLE {qualified}")

    def _footer_schema(self, file: str) -> StructType:
        if file not in self._footers:
            self._footers[file] = arrow_schema_to_spark(pq.read_schema(file))
        return self._footers[file]

    def _query(self, schema: StructType, files: Sequence[str]) -> str:
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
