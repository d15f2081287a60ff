"""Spark SQL text built by the engines: quoting, type DDL, and the projections of the local
engine's views.

Table, schema and catalog names are validated as plain identifiers before they get here (see
:func:`pipelines.spec.is_identifier`); they are quoted anyway, and column names, which come
from Salesforce, always are.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import types as T

from pipelines.engines.arrow import same_type

__all__ = [
    "column_list_ddl",
    "conform_expression",
    "quote_identifier",
    "quote_string",
    "spark_type_sql",
    "table_properties_sql",
]


def quote_identifier(name: str) -> str:
    """```name``` with embedded backticks doubled, as Spark SQL expects."""
    return "`" + name.replace("`", "``") + "`"


def quote_string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default in Spark SQL)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def spark_type_sql(dt: T.DataType) -> str:
    """DDL of a Spark type with every struct field name quoted."""
    if isinstance(dt, T.StructType):
        inner = ", ".join(
            f"{quote_identifier(f.name)}: {spark_type_sql(f.dataType)}"
            + ("" if f.nullable else " NOT NULL")
            for f in dt.fields
        )
        return f"STRUCT<{inner}>"
    if isinstance(dt, T.ArrayType):
        return f"ARRAY<{spark_type_sql(dt.elementType)}>"
    if isinstance(dt, T.MapType):
        return f"MAP<{spark_type_sql(dt.keyType)}, {spark_type_sql(dt.valueType)}>"
    return dt.simpleString().upper()


def column_list_ddl(schema: T.StructType) -> str:
    """``(`a` STRING NOT NULL, `b` BIGINT COMMENT '...')`` for CREATE TABLE / ADD COLUMNS."""
    columns = []
    for f in schema.fields:
        text = f"{quote_identifier(f.name)} {spark_type_sql(f.dataType)}"
        if not f.nullable:
            text += " NOT NULL"
        comment = (f.metadata or {}).get("comment")
        if isinstance(comment, str) and comment:
            text += f" COMMENT {quote_string(comment)}"
        columns.append(text)
    return "(" + ", ".join(columns) + ")"


def table_properties_sql(properties: Mapping[str, str]) -> str:
    """``('k' = 'v', ...)`` for TBLPROPERTIES."""
    pairs = ", ".join(
        f"{quote_string(key)} = {quote_string(value)}" for key, value in sorted(properties.items())
    )
    return f"({pairs})"


def conform_expression(expr: str, have: T.DataType | None, want: T.DataType) -> str:
    """SQL that turns ``expr`` (of type ``have``; ``None`` when the column is absent) into type
    ``want``: a plain reference when the types agree, a CAST for scalars, and a rebuilt value
    for structs, arrays and maps whose (nested) fields differ, because Spark cannot CAST a
    struct to one with more fields. Files written before a schema evolution need this."""
    if have is None:
        return f"CAST(NULL AS {spark_type_sql(want)})"
    if same_type(have, want):
        return expr
    if isinstance(want, T.StructType) and isinstance(have, T.StructType):
        present = {f.name.lower(): f for f in have.fields}
        parts = []
        for f in want.fields:
            source = present.get(f.name.lower())
            inner = (
                conform_expression(
                    f"{expr}.{quote_identifier(source.name)}", source.dataType, f.dataType
                )
                if source is not None
                else conform_expression("", None, f.dataType)
            )
            parts.append(f"{quote_string(f.name)}, {inner}")
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE named_struct({', '.join(parts)}) END"
    if isinstance(want, T.ArrayType) and isinstance(have, T.ArrayType):
        inner = conform_expression("x", have.elementType, want.elementType)
        return f"transform({expr}, x -> {inner})"
    if isinstance(want, T.MapType) and isinstance(have, T.MapType):
        key = conform_expression("k", have.keyType, want.keyType)
        value = conform_expression("v", have.valueType, want.valueType)
        keyed = f"transform_keys({expr}, (k, v) -> {key})" if key != "k" else expr
        return f"transform_values({keyed}, (k, v) -> {value})" if value != "v" else keyed
    return f"CAST({expr} AS {spark_type_sql(want)})"
