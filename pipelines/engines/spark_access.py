"""What every part of the ``spark`` engine reaches its tables through: the session, where each
table lives and how SQL names it, the session's settings lock, errors as
:class:`~ingest.errors.LakeError`, and a table's existence, version, schema and history.

:class:`SparkTableAccess` is held by :class:`~pipelines.engines.spark.SparkEngine` and handed to
each of its parts (:mod:`pipelines.engines.spark_txns`, :mod:`pipelines.engines.spark_tables`,
:mod:`pipelines.engines.spark_write`, :mod:`pipelines.engines.spark_reads`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest.errors import LakeError
from pipelines.engines.arrow import arrow_to_dataframe
from pipelines.engines.base import DEFAULT_PROPERTIES, TableRef
from pipelines.engines.spark_sql import TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF
from pipelines.engines.sql import quote_identifier
from pipelines.engines.writable import check_writable
from pipelines.spec.fields import has_scheme
from pipelines.spec.models import SchemasSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["SparkTableAccess", "has_commit", "jvm_class", "session_lock"]

# The settings Delta takes a commit's txn and userMetadata from when the write gives none.
_COMMIT_SETTINGS = (TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF)

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")

# Delta's log class in open-source Delta and in Databricks runtimes (the one-commit append and
# maintenance's checkpoint, over the py4j gateway of a classic session).
_DELTA_LOG_CLASSES = (
    "org.apache.spark.sql.delta.DeltaLog",
    "com.databricks.sql.transaction.tahoe.DeltaLog",
)

_SESSION_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_SESSION_LOCKS_GUARD = threading.Lock()


def session_lock(spark: SparkSession) -> threading.RLock:
    """The lock of this process's writes that depend on ``spark``'s settings: one per
    session, whichever engines share it."""
    with _SESSION_LOCKS_GUARD:
        lock = _SESSION_LOCKS.get(spark)
        if lock is None:
            lock = _SESSION_LOCKS[spark] = threading.RLock()
        return lock


class SparkTableAccess:
    """The session and the tables of one :class:`~pipelines.engines.spark.SparkEngine`:
    catalog tables (Unity Catalog on Databricks) when ``catalog`` is given, else Delta
    directories under ``location``."""

    def __init__(
        self,
        spark: SparkSession,
        *,
        catalog: str | None = None,
        location: str | Path | None = None,
        schemas: SchemasSpec | None = None,
        table_prefix: str = "",
        default_properties: Mapping[str, str] = DEFAULT_PROPERTIES,
    ) -> None:
        if catalog is None and location is None:
            raise LakeError("the spark engine needs a catalog or a location for its tables")
        self.spark = spark
        self.catalog = catalog
        self.location = None if catalog else _absolute(location)
        self.schemas = schemas or SchemasSpec()
        self.table_prefix = table_prefix
        self.default_properties = dict(default_properties)
        self._writable = False
        self._settings_lock = session_lock(spark)

    # ------------------------------------------------------------------------- naming

    def parts(self, table: TableRef) -> list[str]:
        schema = self.schemas.for_layer(table.layer)
        parts = [schema, f"{self.table_prefix}{table.name}"]
        return [self.catalog, *parts] if self.catalog else parts

    def qualified_name(self, table: TableRef) -> str:
        return ".".join(quote_identifier(p) for p in self.parts(table))

    def schema_name(self, layer: str) -> str:
        schema = self.schemas.for_layer(layer)  # type: ignore[arg-type]
        parts = [self.catalog, schema] if self.catalog else [schema]
        return ".".join(quote_identifier(p) for p in parts)

    def path(self, table: TableRef) -> str:
        """Directory of ``table`` (location mode): ``<location>/<layer>/<prefix><name>``."""
        if self.location is None:
            raise LakeError(f"{table} is a catalog table ({self.qualified_name(table)}): no path")
        return f"{self.location}/{table.layer}/{self.table_prefix}{table.name}"

    def ident(self, table: TableRef) -> str:
        """How SQL names the table itself: its catalog name, or ``delta.`<path>```."""
        if self.location is None:
            return self.qualified_name(table)
        return f"delta.{quote_identifier(self.path(table))}"

    # ------------------------------------------------------------------------ helpers

    def sql(self, text: str) -> DataFrame:
        _log.debug("spark sql: %s", text)
        return self.spark.sql(text)

    @contextlib.contextmanager
    def session_conf(self, values: Mapping[str, str] | None = None) -> Iterator[None]:
        """Run the block with the session's lock held and ``values`` set in its settings, and
        Delta's per-commit settings (a txn, ``userMetadata``) cleared unless ``values`` sets
        them; every setting is restored after. No other write of this process runs with them
        or changes them meanwhile, and none that someone else left in the session (a notebook,
        a ``foreachBatch`` function stopped halfway on a Spark Connect session it shares) is
        taken by a commit of this engine: Delta would record that txn and skip the next write
        that takes it again."""
        wanted: dict[str, str | None] = {**dict.fromkeys(_COMMIT_SETTINGS), **(values or {})}
        with self._settings_lock:
            conf = self.spark.conf
            previous = {key: conf.get(key, None) for key in wanted}
            changed = [key for key, value in wanted.items() if previous[key] != value]
            for key in changed:
                _set(conf, key, wanted[key])
            try:
                yield
            finally:
                for key in changed:
                    _set(conf, key, previous[key])

    @contextlib.contextmanager
    def errors(self, action: str, table: TableRef) -> Iterator[None]:
        try:
            yield
        except LakeError:
            raise
        except Exception as exc:  # py4j and pyspark raise many types; keep the cause
            raise LakeError(f"{action} {self.ident(table)} ({table}) failed: {exc}") from exc

    def history_rows(self, table: TableRef, limit: int | None) -> list[dict[str, Any]]:
        text = f"DESCRIBE HISTORY {self.ident(table)}"
        if limit is not None:
            text += f" LIMIT {int(limit)}"
        with self.errors("read the history of", table):
            return [row.asDict(recursive=True) for row in self.sql(text).collect()]

    def newest_commit(self, table: TableRef) -> dict[str, Any]:
        """The table's newest commit, as its ``DESCRIBE HISTORY`` row says what a write did:
        ``version``, ``operation``, ``operationMetrics`` and ``userMetadata``. A table on this
        machine's disk: from the commit information of the newest commit file in its log, the
        record ``DESCRIBE HISTORY`` reads (in a Spark job, after every write); elsewhere, or
        when that file holds none, ``DESCRIBE HISTORY ... LIMIT 1``."""
        directory = self.local_dir(table)
        found = None if directory is None else _newest_commit_info(directory / "_delta_log")
        if found is not None:
            return found
        (latest,) = self.history_rows(table, 1)
        return latest

    def require(self, table: TableRef) -> int:
        """The table's version; a :class:`LakeError` when it does not exist."""
        version = self.version(table)
        if version is None:
            raise self.missing(table)
        return version

    def require_exists(self, table: TableRef) -> None:
        """A :class:`LakeError` when the table does not exist (its version, which reading
        takes a Spark job, is not read)."""
        if not self.exists(table):
            raise self.missing(table)

    def missing(self, table: TableRef) -> LakeError:
        return LakeError(f"table {self.qualified_name(table)} ({table}) does not exist")

    def dataframe(self, data: Any) -> DataFrame:
        if isinstance(data, pa.Table):
            return self.rows(data)
        frame: DataFrame = data
        return frame

    def reader(self, table: TableRef) -> Any:
        return self.spark.read.format("delta")

    def load(self, reader: Any, table: TableRef) -> DataFrame:
        frame: DataFrame = (
            reader.table(self.qualified_name(table))
            if self.location is None
            else reader.load(self.path(table))
        )
        return frame

    # ----------------------------------------------------------------------- metadata

    def ensure_writable(self) -> None:
        location = self.location
        if self._writable or location is None or "://" in location:
            return  # catalog tables and object storage: their permissions are theirs to say
        check_writable(Path(location.removeprefix("file:")))
        self._writable = True

    def exists(self, table: TableRef) -> bool:
        if self.location is None:
            # Identifiers are validated plain names, so the dotted form needs no quoting.
            return bool(self.spark.catalog.tableExists(".".join(self.parts(table))))
        path = self.path(table)
        if "://" not in path:
            return has_commit(Path(path, "_delta_log"))
        try:
            self.sql(f"DESCRIBE HISTORY {self.ident(table)} LIMIT 1").collect()
        except Exception:  # not a Delta table (yet): Spark raises its analysis errors
            return False
        return True

    def version(self, table: TableRef) -> int | None:
        if self.location is not None and "://" not in (path := self.path(table)):
            # A table on this machine's disk: its newest commit file, as Delta finds it (a
            # listing of the log). DESCRIBE HISTORY reads the same number in a Spark job.
            return _newest_commit(Path(path, "_delta_log"))
        if not self.exists(table):
            return None
        rows = self.history_rows(table, 1)
        return int(rows[0]["version"]) if rows else None

    def schema(self, table: TableRef) -> StructType | None:
        if not self.exists(table):
            return None
        with self.errors("read the schema of", table):
            return self.load(self.reader(table), table).schema

    # -------------------------------------------------------------------------- rows

    def rows(self, data: pa.Table, schema: StructType | None = None) -> DataFrame:
        # Rows of this process: one partition, so that writing them makes one file.
        return arrow_to_dataframe(self.spark, data, schema).coalesce(1)

    def delta_log(self, table: TableRef) -> tuple[Any, Any] | None:
        """``(DeltaLog, its latest snapshot)`` through the py4j gateway, or ``None`` where
        Delta's classes cannot be reached that way (Spark Connect, another runtime)."""
        jvm: Any = getattr(self.spark, "_jvm", None)
        if jvm is None:
            return None
        if self.location is not None:
            path = self.path(table)
        else:
            with self.errors("describe", table):
                detail = self.sql(f"DESCRIBE DETAIL {self.ident(table)}").collect()[0]
            path = str(detail["location"])
        for name in _DELTA_LOG_CLASSES:
            try:
                delta_log = jvm_class(jvm, name).forTable(self.spark._jsparkSession, path)
                empty = jvm.scala.Option.empty()
                return delta_log, delta_log.update(False, empty, empty)
            except Exception as exc:  # a class or signature this runtime does not have
                _log.debug("opening the Delta log of %s with %s failed: %s", table, name, exc)
        return None

    def local_dir(self, table: TableRef) -> Path | None:
        """The table's directory when it is on this machine's disk (location mode)."""
        if self.location is None:
            return None
        path = self.path(table)
        if path.startswith("file:"):
            path = path.removeprefix("file:")
        return None if has_scheme(path) else Path(path)


def _set(conf: Any, key: str, value: str | None) -> None:
    if value is None:
        conf.unset(key)
    else:
        conf.set(key, value)


def jvm_class(jvm: Any, name: str) -> Any:
    target = jvm
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _absolute(location: str | Path | None) -> str:
    # A URI (s3://, abfss://, dbfs:/, file:/) is Spark's to resolve; /Volumes/... and other
    # paths are made absolute, which leaves an absolute one as it is.
    text = str(location)
    if has_scheme(text):
        return text.rstrip("/")
    return str(Path(text).expanduser().absolute())


def _newest_commit(log: Path) -> int | None:
    """The version of the newest commit (or checkpoint) in a local ``_delta_log``; ``None``
    when it holds none (see :func:`has_commit`)."""
    try:
        with os.scandir(log) as entries:
            versions = [
                int(e.name[:20])
                for e in entries
                if e.name[:20].isdigit() and e.name.endswith((".json", ".parquet"))
            ]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return max(versions, default=None)


def _newest_commit_info(log: Path) -> dict[str, Any] | None:
    """What :meth:`SparkTableAccess.newest_commit` reads from a local ``_delta_log``: the
    ``commitInfo`` action of its newest commit file (``None``: no commit file, or none in it)."""
    try:
        with os.scandir(log) as entries:
            versions = [
                int(e.name[:20])
                for e in entries
                if len(e.name) == 25 and e.name[:20].isdigit() and e.name.endswith(".json")
            ]
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not versions:
        return None
    version = max(versions)
    try:
        with Path(log, f"{version:020d}.json").open(encoding="utf-8") as commit:
            for line in commit:
                info = json.loads(line).get("commitInfo") if line.strip() else None
                if info is not None:
                    return {
                        "version": version,
                        "operation": info.get("operation"),
                        "operationMetrics": info.get("operationMetrics"),
                        "userMetadata": info.get("userMetadata"),
                    }
    except FileNotFoundError:
        return None
    return None


def has_commit(log: Path) -> bool:
    """Whether a local ``_delta_log`` holds a commit or checkpoint. Delta creates the folder
    before the first commit's data files, so a table being created by another process has an
    empty log for a moment; it exists once its version 0 (or a checkpoint) does."""
    return _newest_commit(log) is not None
