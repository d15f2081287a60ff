"""Silver's pure DataFrame steps: decoded bronze rows -> silver rows and quarantine rows.

Each function is a ``DataFrame -> DataFrame`` transform (or a factory returning one) that
reads no table, writes nothing and triggers no Spark action; each ends with a ``select`` that
fixes its output columns; they compose with ``DataFrame.transform``::

    silver = decoded.transform(to_silver(layout))
    # = decoded.transform(decoded_events).transform(fan_out_record_ids)
    #          .transform(convert_epoch_columns(layout)).transform(shape_compounds(layout))
    #          .transform(silver_columns(layout))

The job computes an object's silver rows and its undecodable rows in one pass:
:func:`to_silver_and_quarantine` keeps every row, with the error columns (``_cdc_error``,
``_cdc_error_kind``, ``_cdc_payload``; null on the rows that decoded) after the silver
columns; :func:`silver_rows` and :func:`quarantined_rows` take the two parts apart, the
latter into :data:`QUARANTINE_SCHEMA` rows. Bronze rows that no object can decode (unknown or
unusable schema id, another object's schema on a single-object topic) become quarantine rows
through :func:`undecodable_rows` without being decoded.

The decoded steps read what :func:`pipelines.silver.decode.decode_function` yields
(:func:`~pipelines.silver.decode.decoded_schema`); :func:`undecodable_rows` reads bronze rows.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.engines.arrow import same_type
from pipelines.silver.columns import ID_COLUMN, LeafKind, SilverLayout

__all__ = [
    "ERROR_COLUMNS",
    "QUARANTINE_SCHEMA",
    "Transform",
    "convert_epoch_columns",
    "decoded_events",
    "epoch_to_date",
    "epoch_to_timestamp",
    "fan_out_record_ids",
    "millis_to_time",
    "quarantined_rows",
    "shape_compounds",
    "silver_columns",
    "silver_rows",
    "to_silver",
    "to_silver_and_quarantine",
    "undecodable_rows",
]

Transform = Callable[[DataFrame], DataFrame]

QUARANTINE_SCHEMA = T.StructType(
    [
        T.StructField("bronze_table", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("bronze_batch_id", T.LongType()),
        T.StructField("bronze_batch_seq", T.IntegerType()),
        T.StructField("replay_id", T.BinaryType()),
        T.StructField("event_id", T.StringType()),
        T.StructField("schema_id", T.StringType()),
        T.StructField("entity", T.StringType()),
        T.StructField("reason_kind", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("payload", T.BinaryType()),
        T.StructField("quarantined_at", T.TimestampType()),
    ]
)

_MS_PER_DAY = 86_400_000
_RECORD_IDS = "_cdc_record_ids"
ERROR_COLUMNS = ("_cdc_error", "_cdc_error_kind", "_cdc_payload")


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _col(*parts: str) -> Column:
    return F.col(".".join(_q(p) for p in parts))


def _others(df: DataFrame, *skip: str) -> list[str]:
    # Names, not Column objects: building a plan costs a JVM round trip per Column, and
    # silver rows are a hundred columns wide.
    return [_q(c) for c in df.columns if c not in skip]


# ---------------------------------------------------------------------------- conversions


def epoch_to_timestamp(column: Column) -> Column:
    """Epoch milliseconds (UTC) -> TIMESTAMP; independent of the session time zone."""
    return F.timestamp_millis(column)


def epoch_to_date(column: Column) -> Column:
    """Epoch milliseconds at midnight UTC (a Salesforce Date) -> DATE, flooring so that
    dates before 1970 stay on their day."""
    return F.date_from_unix_date(F.floor(column / F.lit(_MS_PER_DAY)).cast("int"))


def millis_to_time(column: Column) -> Column:
    """Milliseconds since midnight (a Salesforce Time) -> ``HH:mm:ss.SSS`` text.

    Computed from the number, not through a timestamp, so the session time zone cannot
    shift it.
    """
    return F.when(column.isNull(), F.lit(None).cast("string")).otherwise(
        F.format_string(
            "%02d:%02d:%02d.%03d",
            F.floor(column / F.lit(3_600_000)),
            F.floor(column / F.lit(60_000)) % 60,
            F.floor(column / F.lit(1_000)) % 60,
            column % 1000,
        )
    )


_CONVERT: dict[str, Callable[[Column], Column]] = {
    "date": epoch_to_date,
    "timestamp": epoch_to_timestamp,
    "time": millis_to_time,
}


def _convert(column: Column, kind: LeafKind) -> Column:
    return _CONVERT[kind](column)


# ------------------------------------------------------------------------- quarantine


def silver_rows(df: DataFrame) -> DataFrame:
    """The rows of :func:`to_silver_and_quarantine`'s output that decoded, without the error
    columns: the silver rows."""
    return df.where(F.col("_cdc_error").isNull()).select(*_others(df, *ERROR_COLUMNS))


def quarantined_rows(
    *, bronze_table: str, topic: str, at: datetime, entity: str | None = None
) -> Transform:
    """The rows of :func:`to_silver_and_quarantine`'s output (or of decoded rows) that could
    not be decoded, as :data:`QUARANTINE_SCHEMA` rows.

    ``bronze_table`` and ``topic`` say where the rows came from; ``at`` is the time the run
    started (one value per run, so the transform stays deterministic); ``entity`` the object
    whose decoder refused them (default: the ``_cdc_entity`` column).
    """

    def transform(df: DataFrame) -> DataFrame:
        owner = F.lit(entity) if entity is not None else F.col("_cdc_entity")
        return df.where(F.col("_cdc_error").isNotNull()).select(
            F.lit(bronze_table).alias("bronze_table"),
            F.lit(topic).alias("topic"),
            F.col("_cdc_bronze_batch_id").cast("bigint").alias("bronze_batch_id"),
            F.col("_cdc_bronze_batch_seq").cast("int").alias("bronze_batch_seq"),
            F.col("_cdc_replay_id").alias("replay_id"),
            F.col("_cdc_event_id").alias("event_id"),
            F.col("_cdc_schema_id").alias("schema_id"),
            owner.cast("string").alias("entity"),
            F.col("_cdc_error_kind").alias("reason_kind"),
            F.col("_cdc_error").alias("reason"),
            F.col("_cdc_payload").alias("payload"),
            F.lit(at).cast("timestamp").alias("quarantined_at"),
        )

    return transform


def undecodable_rows(
    *,
    decodable: Collection[str],
    reasons: Mapping[str, tuple[str, str]],
    registry: str,
    bronze_table: str,
    topic: str,
    at: datetime,
) -> Transform:
    """Bronze rows (``batch_id, batch_seq, event_id, replay_id, schema_id, payload``) that no
    object decodes, as :data:`QUARANTINE_SCHEMA` rows.

    ``decodable``: the schema ids some object decodes or that are rightly skipped (other
    objects' events on a channel). ``reasons``: ``(reason_kind, reason)`` of schema ids known
    to be unusable (a registry entry that does not parse, another object's schema on a
    single-object topic). Any other schema id is missing from the registry (``registry``
    names it in the reason).
    """
    known = sorted(set(decodable) - set(reasons))
    listed = sorted(reasons)

    def lookup(part: int) -> Column:
        # An empty map literal has no key type; without reasons nothing is looked up.
        if not listed:
            return F.lit(None).cast("string")
        pairs = [F.lit(x) for sid in listed for x in (sid, reasons[sid][part])]
        return F.create_map(*pairs)[F.col("schema_id")]

    def transform(df: DataFrame) -> DataFrame:
        sid = F.col("schema_id")
        bad = sid.isNull() | ~sid.isin(known) if known else F.lit(True)
        missing = F.when(
            sid.isNull() | (sid == F.lit("")), F.lit("the bronze row has no schema id")
        ).otherwise(
            F.concat(
                F.lit("unknown schema id '"),
                sid,
                F.lit(
                    f"': not in {registry} (landing registers every schema before the events "
                    "that use it)"
                ),
            )
        )
        is_listed = sid.isin(listed) if listed else F.lit(False)
        return df.where(bad).select(
            F.lit(bronze_table).alias("bronze_table"),
            F.lit(topic).alias("topic"),
            F.col("batch_id").cast("bigint").alias("bronze_batch_id"),
            F.col("batch_seq").cast("int").alias("bronze_batch_seq"),
            F.col("replay_id").alias("replay_id"),
            F.col("event_id").alias("event_id"),
            sid.alias("schema_id"),
            F.lit(None).cast("string").alias("entity"),
            F.when(is_listed, lookup(0)).otherwise(F.lit("unknown_schema")).alias("reason_kind"),
            F.when(is_listed, lookup(1)).otherwise(missing).alias("reason"),
            F.col("payload").alias("payload"),
            F.lit(at).cast("timestamp").alias("quarantined_at"),
        )

    return transform


# ---------------------------------------------------------------------------- silver


def decoded_events(df: DataFrame) -> DataFrame:
    """The rows that decoded, without the error columns."""
    return df.where(F.col("_cdc_error").isNull()).select(*_others(df, *ERROR_COLUMNS))


def fan_out_record_ids(df: DataFrame) -> DataFrame:
    """One row per record id of each event: ``Id``, ``_cdc_record_count`` (ids in the event)
    and ``_cdc_is_wildcard`` (a key-prefix id such as ``001*``: every record of the object).

    A GAP_OVERFLOW event names no record: it is kept as one row with a null ``Id`` (and a
    count of 0), because gold must see it to mark the object for a re-sync.
    """
    ids = F.col(_RECORD_IDS)
    exploded = df.select(
        F.explode_outer(ids).alias(ID_COLUMN),
        F.when(ids.isNull(), F.lit(0))
        .otherwise(F.size(ids))
        .cast("int")
        .alias("_cdc_record_count"),
        *_others(df, _RECORD_IDS),
    )
    return exploded.select(
        ID_COLUMN,
        F.coalesce(F.col(ID_COLUMN).endswith("*"), F.lit(False)).alias("_cdc_is_wildcard"),
        *_others(exploded, ID_COLUMN),
    )


def convert_epoch_columns(layout: SilverLayout) -> Transform:
    """Epoch-millisecond fields to DATE / TIMESTAMP / time text, and the header's commit
    timestamp to TIMESTAMP (see :mod:`pipelines.silver.columns`)."""
    top = layout.epoch_columns()
    nested: dict[str, dict[str, LeafKind]] = {}
    for (struct, child), kind in layout.nested_epoch_columns().items():
        nested.setdefault(struct, {})[child] = kind

    def transform(df: DataFrame) -> DataFrame:
        columns: list[Column | str] = []
        for name in df.columns:
            if name == "_cdc_commit_timestamp":
                columns.append(epoch_to_timestamp(F.col(_q(name))).alias(name))
            elif name in top:
                columns.append(_convert(F.col(_q(name)), top[name]).alias(name))
            elif name in nested:
                column = F.col(_q(name))
                for child, kind in nested[name].items():
                    column = column.withField(child, _convert(_col(name, child), kind))
                columns.append(column.alias(name))
            else:
                columns.append(_q(name))
        return df.select(*columns)

    return transform


def shape_compounds(layout: SilverLayout) -> Transform:
    """Compound fields as the object asks: STRUCT columns as decoded, or flattened into one
    ``<Field>_<Child>`` column per child (Account's person name: ``Name_<Child>``)."""
    flat = layout.compounds == "flattened"
    structs: dict[str, tuple[str, tuple[str, ...]]] = {}
    for f in layout.fields:
        if f.shape == "struct":
            structs[f.name] = (f.name, f.child_names())
        elif f.shape == "switchable":
            structs[f.person_column] = (f.name, f.child_names())

    def transform(df: DataFrame) -> DataFrame:
        columns: list[Column | str] = []
        for name in df.columns:
            if flat and name in structs:
                prefix, children = structs[name]
                columns.extend(_col(name, c).alias(f"{prefix}_{c}") for c in children)
            else:
                columns.append(_q(name))
        return df.select(*columns)

    return transform


def silver_columns(layout: SilverLayout) -> Transform:
    """The silver table's columns in table order and types
    (:meth:`~pipelines.silver.columns.SilverLayout.silver_schema`), then the error columns
    when the input has them."""
    schema = layout.silver_schema()

    def transform(df: DataFrame) -> DataFrame:
        have = {f.name: f.dataType for f in df.schema.fields}
        missing = [f.name for f in schema.fields if f.name not in have]
        if missing:
            raise ValueError(
                f"{layout.entity}: silver columns {missing} are missing from the input "
                f"(got {list(have)})"
            )
        columns: list[Column | str] = [
            _q(f.name)
            if same_type(have[f.name], f.dataType)
            else F.col(_q(f.name)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        ]
        return df.select(*columns, *[c for c in ERROR_COLUMNS if c in have])

    return transform


def _shape(layout: SilverLayout, rows: DataFrame) -> DataFrame:
    if layout.change_events:
        rows = rows.transform(fan_out_record_ids)
    return (
        rows.transform(convert_epoch_columns(layout))
        .transform(shape_compounds(layout))
        .transform(silver_columns(layout))
    )


def to_silver(layout: SilverLayout) -> Transform:
    """Decoded rows -> the object's silver rows: the rows that decoded, fanned out per record
    id (change events), dates converted, compounds shaped, columns fixed."""

    def transform(df: DataFrame) -> DataFrame:
        return _shape(layout, df.transform(decoded_events))

    return transform


def to_silver_and_quarantine(layout: SilverLayout) -> Transform:
    """Decoded rows -> silver rows and undecodable rows in one DataFrame: the silver columns
    then the error columns (a row that could not be decoded has a null ``Id`` and null fields;
    one that decoded null error columns). :func:`silver_rows` and :func:`quarantined_rows`
    take it apart."""

    def transform(df: DataFrame) -> DataFrame:
        return _shape(layout, df)

    return transform
