"""The text the ``spark`` engine hands to Delta Spark, and what it reads back: SQL statements,
DataFrameWriter options, session settings, and the parsing of DESCRIBE HISTORY rows and MERGE
metrics. Plain functions of their arguments, so they are tested without a session or a
Delta jar (``tests/unit/test_spark_engine.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pipelines.engines.base import (
    Condition,
    HistoryEntry,
    Kept,
    Txn,
    WriteLayout,
    check_conditions,
    decode_user_metadata,
    encode_user_metadata,
    merge_keys,
)
from pipelines.engines.sql import (
    column_list_ddl,
    quote_identifier,
    quote_string,
    table_properties_sql,
)

if TYPE_CHECKING:
    from pyspark.sql.types import StructField, StructType

__all__ = [
    "DELETION_VECTORS_PROPERTY",
    "PRESERVE_NULL_STRUCTS",
    "RETENTION_CHECK_CONF",
    "SCHEMA_EVOLUTION_CONF",
    "TXN_APP_ID_CONF",
    "TXN_VERSION_CONF",
    "USER_METADATA_CONF",
    "add_columns_sql",
    "create_table_sql",
    "history_entry",
    "is_append_only",
    "merge_condition",
    "merge_counts",
    "merge_sql",
    "metric_int",
    "select_sql",
    "set_properties_sql",
    "write_options",
]

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
SCHEMA_EVOLUTION_CONF = "spark.databricks.delta.schema.autoMerge.enabled"
# Delta expands a NULL struct of the source into a struct of NULL fields when a MERGE
# updates a subset of columns (UPDATE SET * with schema evolution) or casts a struct type; a
# compound field Salesforce left empty must stay NULL in gold.
PRESERVE_NULL_STRUCTS: Mapping[str, str] = {
    "spark.databricks.delta.merge.preserveNullSourceStructs": "true",
    "spark.databricks.delta.merge.preserveNullSourceStructs.updateStar": "true",
    "spark.databricks.delta.insert.preserveNullSourceStructs": "true",
}
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


# Delta's switch for deletion vectors on a table (its protocol moves to reader 3 / writer 7).
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"


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
    else:
        # Always given: the session's setting (a MERGE of another thread sets it) never decides.
        options["mergeSchema"] = "true" if merge_schema else "false"
    return options


def merge_sql(
    target: str,
    source_view: str,
    *,
    on: Sequence[str],
    update_condition: str | None = None,
    delete_condition: str | None = None,
    insert: bool = True,
    evolve_schema: bool = True,
    keep: Kept | None = None,
    columns: Sequence[str] = (),
) -> str:
    """``MERGE INTO`` of the temporary view ``source_view`` into ``target`` (aliases ``target``
    and ``source``): matched rows are deleted where ``delete_condition`` holds, else updated
    (``UPDATE SET *``) where ``update_condition`` does; unmatched rows inserted (``INSERT *``)
    when ``insert``. ``evolve_schema``: ``MERGE WITH SCHEMA EVOLUTION`` adds the source's new
    columns (nested fields too) to the table. With ``keep``, the source's ``columns`` (its
    flags column among them) are set and inserted by name instead, each kept column taking
    the target's value where its flag is "0" (:class:`~pipelines.engines.base.Kept`)."""
    evolution = " WITH SCHEMA EVOLUTION" if evolve_schema else ""
    clauses = []
    if delete_condition:
        clauses.append(f"WHEN MATCHED AND ({delete_condition}) THEN DELETE")
    update = f" AND ({update_condition})" if update_condition else ""
    if keep is None:
        clauses.append(f"WHEN MATCHED{update} THEN UPDATE SET *")
        if insert:
            clauses.append("WHEN NOT MATCHED THEN INSERT *")
    else:
        written = [c for c in columns if c != keep.flags]
        place = {c: n for n, c in enumerate(keep.columns, start=1)}
        flags = f"source.{quote_identifier(keep.flags)}"

        def value(column: str) -> str:
            name = quote_identifier(column)
            if column not in place:
                return f"source.{name}"
            return (
                f"CASE WHEN substring({flags}, {place[column]}, 1) = '0' THEN target.{name} "
                f"ELSE source.{name} END"
            )

        sets = ", ".join(f"target.{quote_identifier(c)} = {value(c)}" for c in written)
        clauses.append(f"WHEN MATCHED{update} THEN UPDATE SET {sets}")
        if insert:
            names = ", ".join(quote_identifier(c) for c in written)
            values = ", ".join(f"source.{quote_identifier(c)}" for c in written)
            clauses.append(f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})")
    return (
        f"MERGE{evolution} INTO {target} AS target USING {quote_identifier(source_view)} AS "
        f"source ON {merge_condition(on)} " + " ".join(clauses)
    )


def update_columns_sql(
    target: str, source_view: str, *, on: Sequence[str], columns: Sequence[str]
) -> str:
    """``MERGE INTO`` of the temporary view ``source_view`` into ``target`` that sets only
    ``columns`` of the matched rows (aliases ``target`` and ``source``) and inserts nothing."""
    assignments = ", ".join(
        f"target.{quote_identifier(c)} = source.{quote_identifier(c)}" for c in columns
    )
    return (
        f"MERGE INTO {target} AS target USING {quote_identifier(source_view)} AS source ON "
        f"{merge_condition(on)} WHEN MATCHED THEN UPDATE SET {assignments}"
    )


def merge_condition(keys: Sequence[str]) -> str:
    """The join condition of a merge on ``keys`` (aliases ``target`` and ``source``)."""
    return " AND ".join(
        f"target.{quote_identifier(k)} = source.{quote_identifier(k)}" for k in merge_keys(keys)
    )


def metric_int(metrics: Mapping[str, Any], key: str) -> int:
    """An integer of a commit's or command's metrics; 0 when absent or not a number."""
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
            metric_int(metrics, "numTargetRowsUpdated") == 0
            and metric_int(metrics, "numTargetRowsDeleted") == 0
            and metric_int(metrics, "numTargetFilesRemoved") == 0
        )
    return False


def merge_counts(metrics: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(inserted, updated, deleted, source rows) from a MERGE commit's operationMetrics."""
    return (
        metric_int(metrics, "numTargetRowsInserted"),
        metric_int(metrics, "numTargetRowsUpdated"),
        metric_int(metrics, "numTargetRowsDeleted"),
        metric_int(metrics, "numSourceRows"),
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
