"""How the ``spark`` engine writes: appends and overwrites through ``DataFrameWriter``, merges
as ``MERGE INTO`` a temporary view, each reporting the version it committed and its row counts.
Only SQL and the DataFrame API, so the writes run on a classic session and on Spark Connect
(Databricks serverless, standard access mode) alike.

A write that carries a :class:`~pipelines.engines.base.Txn` is made idempotent by Delta itself:
the ``txnAppId`` / ``txnVersion`` writer options (and, for MERGE, the
``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` session settings) make Delta skip a
transaction it has committed already, which the version left unchanged after the write shows.
What a table under a location has recorded is read from its Delta log with the DataFrame API
(the newest checkpoint's transactions and those of the commits after it); a catalog table's,
from the ``userMetadata`` in which every commit sfcdc writes records its transaction
(``DESCRIBE HISTORY``).

Delta takes a MERGE's transaction, ``userMetadata`` and schema evolution from the session's
settings (a commit without writer options of its own takes them from there too), so the
writes that set them or would take them hold the session's lock
(:func:`~pipelines.engines.spark.session_lock`) while they run.

``one_commit_appends`` (off by default) turns on a fast path for a classic session on a lake of
paths: several parts, each with its own transaction, go into one Delta commit through Delta's
``OptimisticTransaction`` over the py4j gateway, instead of a commit per part.

:class:`SparkWriteMixin` is part of :class:`~pipelines.engines.spark.SparkEngine`.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from ingest.errors import LakeError
from pipelines.engines.base import (
    CommitResult,
    MergeMetrics,
    TableRef,
    Txn,
    WriteLayout,
    decode_user_metadata,
    encode_user_metadata,
    merge_keys,
    txn_applied,
    updated_columns,
)
from pipelines.engines.spark_sql import (
    SCHEMA_EVOLUTION_CONF,
    TXN_APP_ID_CONF,
    TXN_VERSION_CONF,
    USER_METADATA_CONF,
    merge_counts,
    merge_sql,
    metric_int,
    update_columns_sql,
    write_options,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["SparkWriteMixin"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")

# Delta's log class in open-source Delta and in Databricks runtimes (the one-commit append).
_DELTA_LOG_CLASSES = (
    "org.apache.spark.sql.delta.DeltaLog",
    "com.databricks.sql.transaction.tahoe.DeltaLog",
)
# A catalog table's newest commits are read first when looking an app id up in its history:
# most lookups find it there.
_RECENT_COMMITS = 32
# What a Delta log file (a commit, a checkpoint) holds of an application transaction.
_TXN_ACTION = "txn STRUCT<appId: STRING, version: BIGINT>"


def _jvm_class(jvm: Any, name: str) -> Any:
    target = jvm
    for part in name.split("."):
        target = getattr(target, part)
    return target


@dataclass
class _TxnIndex:
    """The application transactions of a table (app id -> version) as of its commit
    ``version``; ``complete``: every transaction the table records is in it (else only those
    of its newest commits)."""

    version: int
    txns: dict[str, int] = field(default_factory=dict)
    complete: bool = True


def _history_txns(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The transactions the ``userMetadata`` of history rows records (any order of rows: a
    newer commit's version of an app id wins)."""
    found: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: int(r["version"])):
        _metadata, txn = decode_user_metadata(row.get("userMetadata"))
        if txn is not None:
            found[txn.app_id] = txn.version
    return found


def _missing_path(exc: Exception) -> bool:
    """Whether Spark refused a read because a path (or every file of a pattern) is missing."""
    return "PATH_NOT_FOUND" in str(exc)


def _txn_rows(frame: DataFrame) -> dict[str, int]:
    """The transactions of Delta log files read into ``frame`` (columns ``file``, the file's
    name, and ``txn``): a newer file's version of an app id wins."""
    rows = frame.where("txn IS NOT NULL").selectExpr("file", "txn.appId", "txn.version")
    found: dict[str, int] = {}
    for row in sorted(rows.collect(), key=lambda r: str(r["file"])):
        found[str(row["appId"])] = int(row["version"])
    return found


class SparkWriteMixin:
    """Appends, overwrites and merges of :class:`~pipelines.engines.spark.SparkEngine`, and
    the application transactions that make them idempotent."""

    if TYPE_CHECKING:
        # What the writes use of the rest of the engine.
        _spark: SparkSession
        location: str | None
        one_commit_appends: bool
        _clock: Callable[[], float]
        _txn_indexes: dict[TableRef, _TxnIndex]

        def exists(self, table: TableRef) -> bool: ...
        def version(self, table: TableRef) -> int | None: ...
        def qualified_name(self, table: TableRef) -> str: ...
        def path(self, table: TableRef) -> str: ...
        def schema(self, table: TableRef) -> StructType | None: ...
        def ensure_table(
            self,
            table: TableRef,
            schema: StructType,
            *,
            properties: Mapping[str, str] | None = None,
            deletion_vectors: bool = False,
        ) -> None: ...
        def _ident(self, table: TableRef) -> str: ...
        def _sql(self, text: str) -> DataFrame: ...
        def _require(self, table: TableRef) -> int: ...
        def _dataframe(self, data: Any) -> DataFrame: ...
        def _history_rows(self, table: TableRef, limit: int | None) -> list[dict[str, Any]]: ...
        def _errors(self, action: str, table: TableRef) -> AbstractContextManager[None]: ...
        def _session_conf(
            self, values: Mapping[str, str] | None = None
        ) -> AbstractContextManager[None]: ...

    # ------------------------------------------------------------ application transactions

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        """Latest txn version for ``app_id``. A table under ``location``: from its Delta log,
        read with the DataFrame API (the newest checkpoint's transactions, then those of the
        commits after it), as Delta reads them. A catalog table, whose files SQL does not
        reach (Unity Catalog): from the ``userMetadata`` that records the transaction of each
        commit sfcdc writes (``DESCRIBE HISTORY``, newest commits first), as far back as the
        table keeps its log. What was read is kept per table and brought up to date with the
        commits since."""
        if not self.exists(table):
            return None
        index = self._txn_index(table, complete=False)
        if app_id not in index.txns and not index.complete:
            index = self._txn_index(table, complete=True)
        return index.txns.get(app_id)

    def _txn_index(self, table: TableRef, *, complete: bool) -> _TxnIndex:
        latest = self._require(table)
        index = self._txn_indexes.get(table)
        if index is None or index.version > latest or (complete and not index.complete):
            index = self._read_txns(table, latest, complete=complete)
        elif latest > index.version:
            newer = self._txns_after(table, index.version, latest)
            if newer is None:  # the log no longer has those commits: read it again
                index = self._read_txns(table, latest, complete=complete)
            else:
                index.txns.update(newer)
                index.version = latest
        self._txn_indexes[table] = index
        return index

    def _read_txns(self, table: TableRef, latest: int, *, complete: bool) -> _TxnIndex:
        if self.location is None:
            rows = self._history_rows(table, None if complete else _RECENT_COMMITS)
            reached_all = complete or len(rows) < _RECENT_COMMITS
            return _TxnIndex(latest, _history_txns(rows), reached_all)
        checkpoint, txns = self._checkpoint_txns(table)
        newer = self._txns_after(table, checkpoint, latest) if latest > checkpoint else {}
        if newer is None:
            raise LakeError(
                f"{table}: the Delta log at {self.path(table)} lacks commits after its newest "
                f"checkpoint (version {checkpoint})"
            )
        return _TxnIndex(latest, {**txns, **newer})

    def _txns_after(self, table: TableRef, version: int, latest: int) -> dict[str, int] | None:
        """The transactions of the commits after ``version`` up to ``latest`` (``None``: some
        of those commits are gone from the log)."""
        if self.location is None:
            rows = self._history_rows(table, latest - version)
            return _history_txns([r for r in rows if int(r["version"]) > version])
        log = f"{self.path(table)}/_delta_log"
        commits = [f"{log}/{v:020d}.json" for v in range(version + 1, latest + 1)]
        with self._errors("read the Delta log of", table):
            try:
                frame = self._spark.read.schema(_TXN_ACTION).json(commits)
                return _txn_rows(frame.selectExpr("_metadata.file_name AS file", "txn"))
            except Exception as exc:
                if _missing_path(exc):
                    return None  # Delta's log cleanup removed some of them
                raise

    def _checkpoint_txns(self, table: TableRef) -> tuple[int, dict[str, int]]:
        """``(version, transactions)`` of the table's newest log checkpoint; ``(-1, {})``
        when it has none (then its log holds every commit from version 0)."""
        log = f"{self.path(table)}/_delta_log"
        with self._errors("read the log checkpoints of", table):
            try:
                frame = self._spark.read.parquet(f"{log}/*.checkpoint*.parquet").selectExpr(
                    "_metadata.file_name AS file", "txn"
                )
                (newest,) = frame.selectExpr("max(file)").collect()[0]
            except Exception as exc:
                if _missing_path(exc):
                    return -1, {}
                raise
            version = int(newest[:20])
            # Each part of a multi-part checkpoint is named after its version.
            of_newest = frame.where(f"file LIKE '{version:020d}.%'")
            return version, _txn_rows(of_newest)

    def _note_commit(
        self, table: TableRef, before: int, latest: Mapping[str, Any], txn: Txn
    ) -> None:
        """Bring the table's transaction index up to the commit a write with ``txn`` just made
        (``latest``, the history row of the table's newest commit; ``before``, its version
        before the write), so the next write reads no log: only when that commit directly
        follows the version the index is current at and records exactly ``txn``. Anything
        else (another writer's commit in between, a write Delta skipped) leaves the index to
        be brought up to date from the log."""
        index = self._txn_indexes.get(table)
        if (
            index is not None
            and index.version == before
            and int(latest["version"]) == before + 1
            and _history_txns([latest]) == {txn.app_id: txn.version}
        ):
            index.txns[txn.app_id] = txn.version
            index.version = before + 1

    def _already_applied(self, table: TableRef, txn: Txn | None) -> bool:
        if txn is None:
            return False
        return txn_applied(table, txn, self.txn_version(table, txn.app_id), _log)

    # ------------------------------------------------------------------------- writing

    def _write(
        self,
        table: TableRef,
        data: Any,
        *,
        mode: Literal["append", "overwrite"],
        txn: Txn | None,
        options: dict[str, str],
    ) -> CommitResult:
        if self._already_applied(table, txn):
            return CommitResult(table, self.version(table), skipped=True, rows=0)
        df = self._dataframe(data)
        if not self.exists(table):
            self.ensure_table(table, df.schema)
        before = self._require(table)
        writer = df.write.format("delta").mode(mode)
        for key, value in options.items():
            writer = writer.option(key, value)
        # With a txn, the writer options carry everything Delta would otherwise take from the
        # session's settings (the txn, userMetadata, mergeSchema): no lock needed.
        exclusive = self._session_conf() if txn is None else contextlib.nullcontext()
        with self._errors(mode, table), exclusive:
            if self.location is None:
                writer.saveAsTable(self.qualified_name(table))
            else:
                writer.save(self.path(table))
        (latest,) = self._history_rows(table, 1)
        after = int(latest["version"])
        if after == before:
            # Delta skipped the write itself: the txn had been committed by another process.
            return CommitResult(table, after, skipped=True, rows=0)
        if txn is not None:
            self._note_commit(table, before, latest, txn)
        rows = metric_int(latest.get("operationMetrics") or {}, "numOutputRows")
        _log.debug("%s: %s of %d rows as version %d", table, mode, rows, after)
        return CommitResult(table, after, skipped=False, rows=rows)

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
        if isinstance(data, pa.Table) and data.num_rows == 0 and txn is None:
            return CommitResult(table, None, skipped=False, rows=0)
        options = write_options(txn, metadata, merge_schema=evolve_schema, layout=layout)
        return self._write(table, data, mode="append", txn=txn, options=options)

    def append_parts(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> list[CommitResult]:
        app_ids = [txn.app_id for _, txn in parts]
        if len(set(app_ids)) != len(app_ids):
            raise LakeError(f"{table}: one commit cannot record one app id twice ({app_ids})")
        if (
            self.one_commit_appends
            and len(parts) > 1
            and self.location is not None
            and self.exists(table)
        ):
            together = self._append_in_one_commit(table, parts, metadata)
            if together is not None:
                return together
        # A DataFrameWriter records one application transaction: a commit per part.
        return [self.append(table, data, txn=txn, metadata=metadata) for data, txn in parts]

    def _delta_log(self, table: TableRef) -> tuple[Any, Any] | None:
        """``(DeltaLog, its latest snapshot)`` through the py4j gateway, or ``None`` where
        Delta's classes cannot be reached that way (Spark Connect, another runtime)."""
        jvm: Any = getattr(self._spark, "_jvm", None)
        if jvm is None:
            return None
        if self.location is not None:
            path = self.path(table)
        else:
            with self._errors("describe", table):
                detail = self._sql(f"DESCRIBE DETAIL {self._ident(table)}").collect()[0]
            path = str(detail["location"])
        for name in _DELTA_LOG_CLASSES:
            try:
                delta_log = _jvm_class(jvm, name).forTable(self._spark._jsparkSession, path)
                empty = jvm.scala.Option.empty()
                return delta_log, delta_log.update(False, empty, empty)
            except Exception as exc:  # a class or signature this runtime does not have
                _log.debug("opening the Delta log of %s with %s failed: %s", table, name, exc)
        return None

    def _append_in_one_commit(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn]],
        metadata: Mapping[str, str] | None,
    ) -> list[CommitResult] | None:
        """The parts appended in one Delta commit that records every part's transaction,
        through Delta's own ``OptimisticTransaction`` (reached over the py4j gateway): the
        transaction reads each app id's version (so a concurrent commit of one of them is a
        conflict, as it is for a DataFrameWriter's ``txnAppId``), writes the rows of the parts
        not applied yet, and commits their files with a ``SetTransaction`` each. ``None`` --
        a commit per part instead -- where that is not possible here: no py4j gateway, a
        runtime whose classes differ, or rows whose columns are not exactly the table's (a
        DataFrameWriter evolves the schema, this path does not)."""
        opened = self._delta_log(table)
        if opened is None:
            return None
        delta_log, snapshot = opened
        jvm: Any = self._spark._jvm
        try:
            package = str(delta_log.getClass().getPackage().getName())
            write_operation = _jvm_class(jvm, f"{package}.DeltaOperations$Write")
            columns = [str(name) for name in snapshot.metadata().schema().fieldNames()]
        except Exception as exc:  # a runtime without these classes: a commit per part
            _log.debug("%s: no one-commit append on this runtime: %s", table, exc)
            return None
        if any(set(data.column_names) != set(columns) for data, _ in parts):
            return None
        selected = [data.select(columns) for data, _ in parts]
        if any(not part.schema.equals(selected[0].schema) for part in selected[1:]):
            return None  # parts of different types
        with self._errors("append", table):
            transaction = delta_log.startTransaction()
            version = int(snapshot.version())
            results: list[CommitResult] = []
            keep: list[int] = []
            for index, (_, txn) in enumerate(parts):
                recorded = int(transaction.txnVersion(txn.app_id))
                if txn_applied(table, txn, None if recorded < 0 else recorded, _log):
                    results.append(CommitResult(table, version, skipped=True, rows=0))
                else:
                    keep.append(index)
                    results.append(CommitResult(table, None, skipped=False, rows=0))
            if not keep:
                return results
            rows = pa.concat_tables([selected[i] for i in keep])
            files = transaction.writeFiles(self._dataframe(rows)._jdf)
            option = jvm.scala.Option
            now = option.apply(jvm.java.lang.Long.valueOf(int(self._clock() * 1000)))
            txns = [parts[i][1] for i in keep]
            for txn in txns:
                transaction.updateSetTransaction(txn.app_id, txn.version, now)
            text = encode_user_metadata(metadata, txns[0] if len(txns) == 1 else None)
            none = option.empty()
            operation = write_operation(
                jvm.org.apache.spark.sql.SaveMode.Append,
                none,
                none,
                option.apply(text) if text else none,
                none,
                none,
                none,
            )
            committed = int(transaction.commit(files, operation))
        for index in keep:
            results[index] = CommitResult(
                table, committed, skipped=False, rows=parts[index][0].num_rows
            )
        _log.debug("%s: appended %d parts as version %d", table, len(keep), committed)
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
        options = write_options(
            txn, metadata, merge_schema=not replace_schema, overwrite_schema=replace_schema
        )
        return self._write(table, data, mode="overwrite", txn=txn, options=options)

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
        merge_keys(on)  # a malformed key list fails before anything is read
        started = self._clock()
        if self._already_applied(table, txn):
            return MergeMetrics(table, 0, 0, 0, 0, self.version(table), True, 0.0)
        df = self._dataframe(source)
        lower = {c.lower() for c in df.columns}
        absent = [k for k in on if k.lower() not in lower]
        if absent:
            raise LakeError(
                f"merge into {table}: key columns {absent} are not in the source (columns: "
                f"{', '.join(df.columns)})"
            )
        if not self.exists(table):
            self.ensure_table(table, df.schema)
        before = self._require(table)
        # MERGE takes these from the session's settings only (Delta 4.1 also ignores the
        # statement's WITH SCHEMA EVOLUTION, which Databricks runtimes honour).
        conf = self._merge_conf(txn, metadata, evolve_schema=evolve_schema)
        target = self._ident(table)
        latest = self._run_merge(
            table,
            df,
            lambda view: merge_sql(
                target,
                view,
                on=on,
                update_condition=update_condition,
                delete_condition=delete_condition,
                insert=insert,
                evolve_schema=evolve_schema,
            ),
            conf,
        )
        after = int(latest["version"])
        if txn is not None:
            self._note_commit(table, before, latest, txn)
        inserted, updated, deleted, source_rows = (
            merge_counts(latest.get("operationMetrics") or {}) if after != before else (0, 0, 0, 0)
        )
        metrics = MergeMetrics(
            table, inserted, updated, deleted, source_rows, after, False, self._clock() - started
        )
        _log.info(
            "%s: merged %d source rows (%d inserted, %d updated, %d deleted) as version %d",
            table,
            source_rows,
            inserted,
            updated,
            deleted,
            after,
        )
        return metrics

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
        names = updated_columns(table, columns, merge_keys(on))
        started = self._clock()
        if self._already_applied(table, txn):
            return MergeMetrics(table, 0, 0, 0, 0, self.version(table), True, 0.0)
        before = self._require(table)
        schema = self.schema(table)
        known = {f.name.lower() for f in schema.fields} if schema is not None else set()
        missing = [c for c in (*on, *names) if c.lower() not in known]
        if missing:
            raise LakeError(
                f"update of columns in {table}: {missing} are not columns of the table "
                "(ensure_table adds them first)"
            )
        df = self._dataframe(source).select(*(f"`{c}`" for c in (*on, *names)))
        target = self._ident(table)
        latest = self._run_merge(
            table,
            df,
            lambda view: update_columns_sql(target, view, on=on, columns=names),
            self._merge_conf(txn, metadata, evolve_schema=False),
        )
        after = int(latest["version"])
        if txn is not None:
            self._note_commit(table, before, latest, txn)
        _inserted, updated, _deleted, source_rows = (
            merge_counts(latest.get("operationMetrics") or {}) if after != before else (0, 0, 0, 0)
        )
        metrics = MergeMetrics(
            table, 0, updated, 0, source_rows, after, False, self._clock() - started
        )
        _log.info(
            "%s: set %s of %d rows from %d source rows as version %d",
            table,
            ", ".join(names),
            updated,
            source_rows,
            after,
        )
        return metrics

    @staticmethod
    def _merge_conf(
        txn: Txn | None, metadata: Mapping[str, str] | None, *, evolve_schema: bool
    ) -> dict[str, str]:
        """The session settings a MERGE takes its schema evolution, transaction and
        ``userMetadata`` from (it has no writer options)."""
        conf = {SCHEMA_EVOLUTION_CONF: "true" if evolve_schema else "false"}
        if txn is not None:
            conf[TXN_APP_ID_CONF] = txn.app_id
            conf[TXN_VERSION_CONF] = str(txn.version)
        user_metadata = encode_user_metadata(metadata, txn)
        if user_metadata:
            conf[USER_METADATA_CONF] = user_metadata
        return conf

    def _run_merge(
        self,
        table: TableRef,
        source: DataFrame,
        statement: Callable[[str], str],
        conf: Mapping[str, str],
    ) -> dict[str, Any]:
        """Run the MERGE ``statement(view)`` makes of the temporary view that holds ``source``,
        with the session settings ``conf``; returns the history row of the table's newest
        commit after it."""
        # A temporary view of this session names the source in the statement; a name of its
        # own, so merges of several threads sharing the session never see each other's.
        view = f"sfcdc_merge_source_{uuid.uuid4().hex}"
        with self._errors("merge into", table):
            source.createOrReplaceTempView(view)
            try:
                with self._session_conf(conf):
                    self._sql(statement(view)).collect()
            finally:
                self._spark.catalog.dropTempView(view)
        (latest,) = self._history_rows(table, 1)
        return latest
