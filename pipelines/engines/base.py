"""The lake engine seam: what bronze, silver and gold jobs ask of Delta tables.

Two implementations read and write real Delta tables with the same layout:
:class:`~pipelines.engines.local.LocalEngine` (delta-rs + Spark local mode) and
:class:`~pipelines.engines.spark.SparkEngine` (delta-spark, Databricks). Everything else is
shared: the value types here, the type mapping in :mod:`pipelines.engines.arrow` and the SQL
text in :mod:`pipelines.engines.sql`.

Idempotency. A write may carry a :class:`Txn` (a Delta *application transaction*): the
engine skips it when the table has already recorded ``txn.version`` (or a later one) for
``txn.app_id`` and otherwise records the txn in the same commit as the data, so a job that
crashes between writing and remembering what it wrote can simply run again.

Commit metadata. The ``metadata`` of a write, and its txn, are stored as one JSON object in
the commit's ``userMetadata`` (the field ``DESCRIBE HISTORY`` shows), in both engines, so
history reads the same whichever engine wrote the commit.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ingest.errors import LakeError
from pipelines.spec.models import Layer, is_identifier

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = [
    "CDF_PROPERTY",
    "DEFAULT_LOG_HOURS",
    "DEFAULT_PROPERTIES",
    "DEFAULT_TOMBSTONE_HOURS",
    "LAYERS",
    "LOG_RETENTION_PROPERTY",
    "TOMBSTONE_PROPERTY",
    "TXN_APP_ID_KEY",
    "TXN_VERSION_KEY",
    "BatchFunction",
    "CommitResult",
    "Condition",
    "CountsOf",
    "Fits",
    "HistoryEntry",
    "Kept",
    "LakeEngine",
    "MaintenanceResult",
    "MergeMetrics",
    "Rows",
    "RowsFlagged",
    "RowsWhere",
    "TableChanges",
    "TableFunction",
    "TableRef",
    "Txn",
    "WriteLayout",
    "check_conditions",
    "check_until",
    "concurrent_write",
    "decode_user_metadata",
    "encode_user_metadata",
    "interval_hours",
    "merge_keys",
    "txn_applied",
    "updated_columns",
]

LAYERS: tuple[Layer, ...] = ("bronze", "silver", "gold")
ConditionOp = Literal["=", "!=", "<", "<=", ">", ">=", "in"]
# (column, operator, value): a conjunction of these selects the rows of LakeEngine.read_arrow.
Condition = tuple[str, ConditionOp, Any]
_CONDITION_OPS = ("=", "!=", "<", "<=", ">", ">=", "in")
_CONDITION_VALUES = (str, bytes, int, float, bool)
TXN_APP_ID_KEY = "sfcdc.txn.app_id"
TXN_VERSION_KEY = "sfcdc.txn.version"
# Every table the engines create has the change data feed on: read_appends reads it.
CDF_PROPERTY = "delta.enableChangeDataFeed"
DEFAULT_PROPERTIES: Mapping[str, str] = {CDF_PROPERTY: "true"}
# How long checkpoints keep the tombstones of removed files (Delta's default: a week).
TOMBSTONE_PROPERTY = "delta.deletedFileRetentionDuration"
# How long the log keeps its entries (Delta's default: 30 days); never less than the above.
LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"
DEFAULT_TOMBSTONE_HOURS = 168.0
DEFAULT_LOG_HOURS = 720.0
_INTERVAL = re.compile(
    r"^\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*"
    r"(nanoseconds?|microseconds?|milliseconds?|seconds?|minutes?|hours?|days?|weeks?)\s*$",
    re.IGNORECASE,
)
_UNIT_HOURS = {
    "nanosecond": 1 / 3.6e12,
    "microsecond": 1 / 3.6e9,
    "millisecond": 1 / 3.6e6,
    "second": 1 / 3600,
    "minute": 1 / 60,
    "hour": 1.0,
    "day": 24.0,
    "week": 168.0,
}


def interval_hours(text: str | None, default: float) -> float:
    """Hours of a Delta interval property (``interval 7 days``, ``1 hours``); ``default``
    when it is not set or not understood."""
    match = _INTERVAL.match(text or "")
    if match is None:
        return default
    return float(match.group(1)) * _UNIT_HOURS[match.group(2).lower().removesuffix("s")]


Rows = Any
"""Rows an engine holds: a ``pyarrow.Table`` in the local engine, a DataFrame in the spark
engine. Jobs never look inside; they hand them back to the engine that made them."""

BatchFunction = Callable[[Iterator["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]
"""A pure layer function over Arrow record batches (what Spark's ``mapInArrow`` runs):
module-level or an instance of a module-level class, so that it pickles to executors.

A function may say more of itself, for an engine that can do part of its work without it:
``reads``, the only columns it reads (a tuple of names); ``keeps``, a :class:`RowsWhere` or
:class:`RowsFlagged` outside of which it yields nothing for a row; ``selects``, the names of
the columns it yields when that is all it does with the rows it keeps; ``fits``, a
:class:`Fits` when all it does with them is put them into its schema; ``counts``, a
:class:`CountsOf` when that is all it does. The function itself stays the definition: the
local engine calls it, and the spark engine's tests compare the two."""


@dataclass(frozen=True)
class CountsOf:
    """Rows -> for each value of ``key``, how many rows have it and the highest ``highest``
    among them: the three columns of the function's schema, in that order. A function yields
    them per batch and its caller adds them up, so one row per key over all batches is the
    same answer."""

    key: str
    highest: str


@dataclass(frozen=True)
class Fits:
    """Rows -> the same rows in the function's schema: its columns found by name
    (case-insensitively) in its types, the columns the rows lack null, and each of
    ``constants`` (column name, string) the same on every row."""

    constants: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RowsWhere:
    """The rows whose ``column`` is null (``null=True``) or set (``null=False``)."""

    column: str
    null: bool


@dataclass(frozen=True)
class RowsFlagged:
    """The rows whose boolean ``column`` is true (``flagged=True``), or false or null
    (``flagged=False``)."""

    column: str
    flagged: bool


TableFunction = Callable[["pa.Table"], "pa.Table"]
"""A pure layer function over an Arrow table holding every row of each key it sees."""


@dataclass(frozen=True)
class TableRef:
    """A table by layer and logical name (``TableRef("gold", "account")``).

    The engine turns it into a physical name (schema per layer, table prefix, catalog) and,
    for the local engine, a directory. Names must be plain SQL identifiers.
    """

    layer: Layer
    name: str

    def __post_init__(self) -> None:
        if self.layer not in LAYERS:
            raise ValueError(f"table layer must be one of {', '.join(LAYERS)} (got {self.layer!r})")
        if not is_identifier(self.name):
            raise ValueError(
                "table name must be a SQL identifier of letters, digits and '_' not starting "
                f"with a digit, at most 255 characters (got {self.name!r})"
            )

    def __str__(self) -> str:
        return f"{self.layer}.{self.name}"


@dataclass(frozen=True)
class Txn:
    """A Delta application transaction: ``version`` is monotonic per ``app_id``."""

    app_id: str
    version: int

    def __post_init__(self) -> None:
        if not isinstance(self.app_id, str) or not self.app_id:
            raise ValueError(f"txn app_id must be a non-empty string (got {self.app_id!r})")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"txn version must be an integer >= 0 (got {self.version!r})")


@dataclass(frozen=True)
class WriteLayout:
    """How an append lays out its Parquet files; the rows written are the same either way.

    ``distinct`` names columns whose values are (nearly) all different, such as ids and raw
    payloads: dictionary encoding them costs time and memory and saves nothing. ``unindexed``
    names columns no reader filters on (payloads): no min/max statistics are computed for them.
    ``row_group_rows`` bounds the rows of a Parquet row group, and so what the writer buffers
    while it encodes a large batch. ``uncompressed`` names columns written as they are
    (payloads that compress poorly). Engines apply what their writer supports.
    """

    distinct: tuple[str, ...] = ()
    unindexed: tuple[str, ...] = ()
    row_group_rows: int | None = None
    uncompressed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.row_group_rows is not None and self.row_group_rows < 1:
            raise ValueError(f"row_group_rows must be >= 1 (got {self.row_group_rows})")


@dataclass(frozen=True)
class CommitResult:
    """Outcome of an append or overwrite.

    ``version`` is the commit that holds the write (``None`` when nothing was committed: an
    empty append without a txn); ``skipped`` is true when the txn had already been applied.
    """

    table: TableRef
    version: int | None
    skipped: bool
    rows: int


@dataclass(frozen=True)
class Kept:
    """Columns a MERGE's updated rows may keep: the source's string column ``flags`` holds
    one character per column of ``columns``, in order; "0" keeps the target row's value of
    that column, any other (or a null ``flags``) takes the source's. The ``flags`` column is
    not written, and an inserted row takes the source's values."""

    flags: str
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.flags in self.columns:
            raise ValueError(f"the flags column {self.flags!r} is one of the kept columns")


@dataclass(frozen=True)
class MergeMetrics:
    """Outcome of a merge, as the Delta implementation reports it."""

    table: TableRef
    inserted: int
    updated: int
    deleted: int
    source_rows: int
    version: int | None
    skipped: bool
    duration_s: float


@dataclass(frozen=True)
class TableChanges:
    """Rows appended to a table over a range of commits.

    ``start_version``..``end_version`` (inclusive) is the range read; ``start_version`` is
    ``None`` when nothing was committed after the requested version. ``full_read`` is true
    when the engine could not read the range incrementally (its log or change data feed no
    longer covers it) and returned the whole table at ``end_version`` instead; consumers
    must then treat ``rows`` as a snapshot, not as new rows.
    """

    table: TableRef
    rows: Rows
    start_version: int | None
    end_version: int | None
    full_read: bool = False


@dataclass(frozen=True)
class HistoryEntry:
    """One commit of a table's history, newest first in :meth:`LakeEngine.history`."""

    version: int
    timestamp: datetime
    operation: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    txn: Txn | None = None


@dataclass(frozen=True)
class MaintenanceResult:
    """What :meth:`LakeEngine.maintain` did (``None`` where the engine cannot tell)."""

    table: TableRef
    files_removed: int
    files_added: int
    checkpoint_version: int | None
    vacuumed_files: int | None
    # Commit and checkpoint files log cleanup deleted (None: the engine cannot tell, or it
    # left the cleanup to the table's delta.logRetentionDuration).
    log_entries_removed: int | None = None


@runtime_checkable
class LakeEngine(Protocol):
    """Table I/O of the pipeline, and where its layer functions run.

    Both implementations read and write real Delta tables. The layer logic is defined once,
    as pure functions over Arrow batches (:data:`BatchFunction`, :data:`TableFunction`);
    :meth:`map_batches` and :meth:`map_groups` run them -- in this process (local engine) or
    on Spark executors (spark engine). Jobs never ask which engine they have.

    A method that takes a schema (:meth:`ensure_table`, :meth:`rows`, :meth:`map_batches`,
    :meth:`map_groups`, :meth:`union`) takes a Spark ``StructType`` or a ``pyarrow.Schema``;
    an Arrow schema means the Delta types its columns are stored as
    (:mod:`pipelines.engines.arrow`). :meth:`schema` answers a ``StructType``.
    """

    @property
    def name(self) -> Literal["local", "spark"]:
        """Which implementation this is (for messages and logs only)."""
        ...

    def qualified_name(self, table: TableRef) -> str:
        """The name SQL users type for ``table`` (quoted, e.g. ```gold`.`account```)."""
        ...

    def ensure_writable(self) -> None:
        """Raise :class:`~ingest.errors.LakeError` naming the lake's folder and the cause when
        it cannot be written (a read-only file system, no permission), before a command
        writes anything; a lake this engine cannot check (a catalog, object storage) passes.
        Checked once per engine."""
        ...

    def exists(self, table: TableRef) -> bool:
        """Whether ``table`` exists as a Delta table."""
        ...

    def version(self, table: TableRef) -> int | None:
        """The table's current version, ``None`` when it does not exist."""
        ...

    def schema(self, table: TableRef) -> StructType | None:
        """The table's schema, ``None`` when it does not exist."""
        ...

    def ensure_table(
        self,
        table: TableRef,
        schema: StructType | pa.Schema,
        *,
        properties: Mapping[str, str] | None = None,
        deletion_vectors: bool = False,
    ) -> None:
        """Create ``table`` when missing; otherwise add the columns of ``schema`` it lacks
        and set ``properties`` that differ. A column whose type differs is an error. Every
        table has the change data feed on (``delta.enableChangeDataFeed``):
        :meth:`read_appends` reads it. ``deletion_vectors``: turn on Delta deletion vectors
        (a MERGE then marks the rows it replaces instead of rewriting their files) where the
        engine's writer supports them; an engine whose writer does not ignores it."""
        ...

    # -------------------------------------------------------------------------- reading

    def read(
        self, table: TableRef, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> Rows:
        """The table's rows (at ``version``, default latest)."""
        ...

    def read_appends(
        self,
        table: TableRef,
        *,
        after_version: int | None,
        until_version: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> TableChanges:
        """Rows inserted by the commits after ``after_version`` (``None``: all rows) up to
        ``until_version`` (``None``: the current version), inclusive. Compactions add
        nothing."""
        ...

    def read_keyed(
        self, table: TableRef, *, key: str, keys: Rows, columns: Sequence[str] | None = None
    ) -> Rows:
        """The rows of ``table`` whose ``key`` column holds a value of ``keys``' ``key``
        column (nulls match nothing): the few rows a batch touches, found without a scan
        where the engine can skip files."""
        ...

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        """The rows of ``table`` that satisfy every ``(column, op, value)`` condition of
        ``where``, with ``columns`` (default: all), as Arrow in this process.

        For the small reads a job makes of its own bookkeeping (checkpoints, a schema
        registry, one landing batch): files whose statistics exclude the conditions are
        skipped, and the local engine needs no Spark session for it.
        """
        ...

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        """The latest txn version the table recorded for ``app_id``."""
        ...

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        """The latest ``limit`` commits, newest first."""
        ...

    # ------------------------------------------------------------------------ execution

    def rows(self, data: pa.Table, schema: StructType | pa.Schema | None = None) -> Rows:
        """Rows of this engine holding ``data`` (typed as ``schema`` when given)."""
        ...

    def map_batches(
        self, rows: Rows, function: BatchFunction, schema: StructType | pa.Schema
    ) -> Rows:
        """``function`` applied to ``rows`` batch by batch; it yields batches of ``schema``."""
        ...

    def map_groups(
        self,
        rows: Rows,
        *,
        key: str,
        function: TableFunction,
        schema: StructType | pa.Schema,
        partitions: int | None = None,
    ) -> Rows:
        """``function`` applied to tables of ``rows`` that each hold every row of the ``key``
        values they hold (all nulls in one table); it returns rows of ``schema``.
        ``partitions``: how many tables to split the rows into, where the engine splits
        them (default: the engine's choice)."""
        ...

    def union(self, parts: Sequence[Rows], schema: StructType | pa.Schema) -> Rows:
        """The rows of ``parts`` (each of ``schema``'s columns) as one."""
        ...

    def persist(self, rows: Rows) -> Rows:
        """``rows`` computed once for the several reads that follow (see :meth:`release`)."""
        ...

    def release(self, rows: Rows) -> None:
        """Free what :meth:`persist` kept."""
        ...

    def to_arrow(self, rows: Rows) -> pa.Table:
        """``rows`` collected into this process (keep it to small results)."""
        ...

    def count(self, rows: Rows) -> int:
        """How many rows ``rows`` holds."""
        ...

    # -------------------------------------------------------------------------- writing

    def append(
        self,
        table: TableRef,
        data: Rows | pa.Table,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        evolve_schema: bool = True,
        layout: WriteLayout | None = None,
    ) -> CommitResult:
        """Append rows (creating the table if needed), idempotently when ``txn`` is given;
        ``layout`` tunes the files written (see :class:`WriteLayout`)."""
        ...

    def append_parts(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> list[CommitResult]:
        """Append each ``(rows, txn)`` part idempotently under its own txn (distinct app
        ids), in as few commits as the engine can (the local engine: one); a part whose txn
        is applied already is skipped. One result per part."""
        ...

    def merge(
        self,
        table: TableRef,
        source: Rows | pa.Table,
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
        """Upsert whole rows of ``source`` keyed by the ``on`` columns.

        Matched rows satisfying ``delete_condition`` are deleted; other matched rows
        (satisfying ``update_condition`` when given) take every source column; unmatched
        source rows are inserted when ``insert``. Conditions are SQL predicates over the
        aliases ``source`` and ``target``, e.g. ``source.ts >= target.ts``; keep them to
        plain comparisons and boolean logic so both engines' SQL dialects accept them.
        A target row matching several source rows is an error. A column of the table that
        the source does not have keeps its value in an updated row (and is null in an inserted
        one): writers of whole rows leave columns they do not know alone
        (:meth:`update_columns` writes those). With ``keep``, an updated row keeps its value
        of each column the source's flags say to keep (:class:`Kept`); the table must then
        have every column of the source but the flags.
        """
        ...

    def update_columns(
        self,
        table: TableRef,
        source: Rows | pa.Table,
        *,
        on: Sequence[str],
        columns: Sequence[str],
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> MergeMetrics:
        """A MERGE that sets only ``columns`` of the rows of ``table`` that ``source`` matches
        on the ``on`` columns: every other column keeps its value, and nothing is inserted or
        deleted (source rows that match no row are ignored). The columns must be columns of
        the table (:meth:`ensure_table` adds them). A target row matching several source rows
        is an error. For values that are refreshed apart from the rest of a row, such as
        formula fields."""
        ...

    def overwrite(
        self,
        table: TableRef,
        data: Rows | pa.Table,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, str] | None = None,
        replace_schema: bool = False,
    ) -> CommitResult:
        """Replace all rows; the schema grows (or is replaced with ``replace_schema``)."""
        ...

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
        """Compact small files, write a log checkpoint and clean up expired log entries, and
        (with ``vacuum_hours``) delete unreferenced files older than that. Log entries expire
        after the table's ``delta.logRetentionDuration``, or (with ``log_hours``) when older
        than that and than the newest checkpoint, and (with ``log_from_version``) when that
        version and later stay readable. With ``tombstone_hours``, an engine whose reads do
        not depend on it keeps the tombstones of removed files in checkpoints only that long
        (:data:`TOMBSTONE_PROPERTY`). None of them knows what a consumer still needs:
        :mod:`pipelines.maintenance` chooses."""
        ...

    # ---------------------------------------------------------------------------- SQL

    def tables(self) -> list[TableRef]:
        """Every table of this engine's lake."""
        ...

    def register_sql(self, tables: Iterable[TableRef] | None = None) -> list[str]:
        """Make ``tables`` (default: every existing one) queryable by name in :meth:`sql`;
        returns the qualified names."""
        ...

    def sql(self, text: str) -> DataFrame:
        """A Spark SQL query over the registered tables."""
        ...

    def query_arrow(self, text: str, tables: Iterable[TableRef], *, limit: int) -> pa.Table:
        """Answer one read-only query over ``tables`` (named as :meth:`qualified_name` says,
        quotes optional), at most ``limit`` rows, as Arrow. The local engine answers with
        delta-rs's DataFusion (no Spark session; its SQL dialect differs from Spark's in a few
        functions), the spark engine with Spark SQL. Raises :class:`~ingest.errors.LakeError`
        with the engine's reason when the query fails."""
        ...


def txn_applied(table: TableRef, txn: Txn, recorded: int | None, logger: logging.Logger) -> bool:
    """Whether ``txn`` is applied already, given the version the table ``recorded`` for its
    app id; if so, the skipped write is logged (one INFO line)."""
    if recorded is None or txn.version > recorded:
        return False
    logger.info(
        "%s: skipping write of txn %s version %d (already applied up to %d)",
        table,
        txn.app_id,
        txn.version,
        recorded,
    )
    return True


def encode_user_metadata(metadata: Mapping[str, str] | None, txn: Txn | None) -> str | None:
    """The ``userMetadata`` JSON of a commit carrying ``metadata`` and ``txn``."""
    payload: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise LakeError(
                f"commit metadata must map str to str (got {key!r}: {value!r}, "
                f"a {type(value).__name__})"
            )
        if key.startswith("sfcdc.txn."):
            raise LakeError(f"commit metadata key {key!r} is reserved for the txn")
        payload[key] = value
    if txn is not None:
        payload[TXN_APP_ID_KEY] = txn.app_id
        payload[TXN_VERSION_KEY] = str(txn.version)
    return json.dumps(payload, sort_keys=True, separators=(",", ":")) if payload else None


def decode_user_metadata(text: object) -> tuple[dict[str, str], Txn | None]:
    """Inverse of :func:`encode_user_metadata`; other writers' text is kept under
    ``userMetadata``."""
    if not isinstance(text, str) or not text:
        return {}, None
    try:
        payload = json.loads(text)
    except ValueError:
        return {"userMetadata": text}, None
    if not isinstance(payload, dict):
        return {"userMetadata": text}, None
    metadata = {str(k): str(v) for k, v in payload.items() if not str(k).startswith("sfcdc.txn.")}
    txn = None
    app_id, version = payload.get(TXN_APP_ID_KEY), payload.get(TXN_VERSION_KEY)
    if isinstance(app_id, str) and isinstance(version, str) and version.isdigit():
        txn = Txn(app_id, int(version))
    return metadata, txn


def check_until(
    table: TableRef, current: int, after_version: int | None, until_version: int | None
) -> int:
    """The last version :meth:`LakeEngine.read_appends` reads, checked against the table's
    versions (``current`` is the latest)."""
    if after_version is not None and after_version > current:
        raise LakeError(
            f"{table} is at version {current}, before the requested after_version "
            f"{after_version}; was the table dropped and re-created?"
        )
    if until_version is None:
        return current
    if until_version > current or until_version < 0:
        raise LakeError(
            f"{table} has versions 0..{current}; cannot read appends up to version {until_version}"
        )
    if after_version is not None and until_version < after_version:
        raise LakeError(
            f"{table}: until_version {until_version} is before after_version {after_version}"
        )
    return until_version


def merge_keys(on: Sequence[str] | str) -> list[str]:
    """Validated merge key columns (a bare string would silently iterate characters)."""
    if isinstance(on, str) or not on or not all(isinstance(c, str) and c for c in on):
        raise LakeError(
            f"merge keys must be a non-empty list of column names (got {on!r}, "
            f"a {type(on).__name__})"
        )
    return list(on)


def updated_columns(table: TableRef, columns: Sequence[str], keys: Sequence[str]) -> list[str]:
    """The validated ``columns`` of :meth:`LakeEngine.update_columns`: a non-empty list of
    names, none of them a merge key (repeats dropped)."""
    if (
        isinstance(columns, str)
        or not columns
        or not all(isinstance(c, str) and c for c in columns)
    ):
        raise LakeError(
            f"update of columns in {table}: columns must be a non-empty list of column names "
            f"(got {columns!r})"
        )
    lower = {k.lower() for k in keys}
    clash = [c for c in columns if c.lower() in lower]
    if clash:
        raise LakeError(f"update of columns in {table}: {clash} are the merge keys")
    return list(dict.fromkeys(columns))


def check_conditions(where: Sequence[Condition]) -> list[Condition]:
    """Validated :meth:`LakeEngine.read_arrow` conditions: a column name, one of
    ``= != < <= > >= in`` and a str, bytes, int, float or bool value (a non-empty list of them
    for ``in``)."""
    checked: list[Condition] = []
    for condition in where:
        if not (isinstance(condition, tuple) and len(condition) == 3):
            raise LakeError(f"a read condition is a (column, op, value) tuple (got {condition!r})")
        column, op, value = condition
        if not isinstance(column, str) or not column:
            raise LakeError(f"a read condition names a column (got {column!r})")
        if op not in _CONDITION_OPS:
            raise LakeError(
                f"read condition on {column!r}: op must be one of {', '.join(_CONDITION_OPS)} "
                f"(got {op!r})"
            )
        values = value if op == "in" else [value]
        if op == "in" and (isinstance(value, str | bytes) or not value):
            raise LakeError(
                f"read condition on {column!r}: 'in' takes a non-empty list of values "
                f"(got {value!r})"
            )
        for item in values:
            if not isinstance(item, _CONDITION_VALUES):
                raise LakeError(
                    f"read condition on {column!r}: values must be str, bytes, int, float or "
                    f"bool (got {item!r}, a {type(item).__name__})"
                )
        checked.append((column, op, list(value) if op == "in" else value))
    return checked


# How each Delta implementation names a commit that lost to another writer: delta-rs raises
# CommitFailedError; delta-spark's exceptions reach Python through py4j, named in their text.
_CONFLICT_TYPES = frozenset({"CommitFailedError"})
_CONFLICT_NAMES = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_",
)


def concurrent_write(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a Delta commit conflict: another writer
    committed to the table while this commit was prepared."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in _CONFLICT_TYPES:
            return True
        text = str(current)
        if any(name in text for name in _CONFLICT_NAMES):
            return True
        current = current.__cause__ or current.__context__
    return False
