"""How the ``spark`` engine writes: appends and overwrites through ``DataFrameWriter``, merges
through ``DeltaTable.merge``, each reporting the version it committed and its row counts.

A write that carries a :class:`~pipelines.engines.base.Txn` is skipped when the table has
recorded that transaction already. The table's own record is the snapshot's application
transactions, read through Delta's JVM classes; where those cannot be reached (Spark Connect),
this process's writes and the ``userMetadata`` of the table's history stand in. Delta itself
also skips a write whose ``txnAppId`` / ``txnVersion`` it has committed, which the version
left unchanged after the write shows. Several parts, each with its own transaction, go into
one commit through Delta's ``OptimisticTransaction`` where its JVM classes are at hand (a
lake of paths); a DataFrameWriter commits one part at a time otherwise.

:class:`SparkWriteMixin` is part of :class:`~pipelines.engines.spark.SparkEngine`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
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
    PRESERVE_NULL_STRUCTS,
    TXN_APP_ID_CONF,
    TXN_VERSION_CONF,
    USER_METADATA_CONF,
    merge_condition,
    merge_counts,
    metric_int,
    write_options,
)
from pipelines.engines.spark_tables import _jvm_class

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["SparkWriteMixin"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")


class SparkWriteMixin:
    """Appends, overwrites and merges of :class:`~pipelines.engines.spark.SparkEngine`, and
    the application transactions that make them idempotent."""

    if TYPE_CHECKING:
        # What the writes use of the rest of the engine.
        _spark: SparkSession
        location: str | None
        _clock: Callable[[], float]
        _txns: dict[tuple[TableRef, str], int]

        def exists(self, table: TableRef) -> bool: ...
        def version(self, table: TableRef) -> int | None: ...
        def qualified_name(self, table: TableRef) -> str: ...
        def path(self, table: TableRef) -> str: ...
        def ensure_table(
            self,
            table: TableRef,
            schema: StructType,
            *,
            properties: Mapping[str, str] | None = None,
            deletion_vectors: bool = False,
        ) -> None: ...
        def _require(self, table: TableRef) -> int: ...
        def _dataframe(self, data: Any) -> DataFrame: ...
        def _history_rows(self, table: TableRef, limit: int | None) -> list[dict[str, Any]]: ...
        def _errors(self, action: str, table: TableRef) -> AbstractContextManager[None]: ...
        def _session_conf(self, values: Mapping[str, str]) -> AbstractContextManager[None]: ...
        def _delta_log(self, table: TableRef) -> tuple[Any, Any] | None: ...

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        """Latest txn version for ``app_id``: from the snapshot's transactions (read through
        Delta's JVM classes), or -- where those cannot be reached (Spark Connect) -- from
        this process's writes, else the ``userMetadata`` of the table's history."""
        if not self.exists(table):
            return None
        transactions = self._snapshot_transactions(table)
        if transactions is not None:
            return transactions.get(app_id)
        known = self._txns.get((table, app_id))
        if known is not None:
            return known
        for row in self._history_rows(table, None):
            _metadata, txn = decode_user_metadata(row.get("userMetadata"))
            if txn is not None and txn.app_id == app_id:
                self._txns[(table, app_id)] = txn.version
                return txn.version
        return None

    def _snapshot_transactions(self, table: TableRef) -> dict[str, int] | None:
        """The application transactions of the table's latest snapshot (``None``: unknown)."""
        opened = self._delta_log(table)
        if opened is None:
            return None
        try:
            iterator = opened[1].transactions().iterator()
            out: dict[str, int] = {}
            while iterator.hasNext():
                pair = iterator.next()
                out[str(pair._1())] = int(pair._2())
        except Exception as exc:
            _log.debug("reading the transactions of %s failed: %s", table, exc)
            return None
        return out

    def _already_applied(self, table: TableRef, txn: Txn | None) -> bool:
        if txn is None:
            return False
        return txn_applied(table, txn, self.txn_version(table, txn.app_id), _log)

    def _remember(self, table: TableRef, txn: Txn | None) -> None:
        if txn is not None:
            self._txns[(table, txn.app_id)] = txn.version

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
        with self._errors(mode, table), self._session_conf(PRESERVE_NULL_STRUCTS):
            if self.location is None:
                writer.saveAsTable(self.qualified_name(table))
            else:
                writer.save(self.path(table))
        (latest,) = self._history_rows(table, 1)
        after = int(latest["version"])
        self._remember(table, txn)
        if after == before:
            # Delta skipped the write itself: the txn had been committed by another process.
            return CommitResult(table, after, skipped=True, rows=0)
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
        if len(parts) > 1 and self.location is not None and self.exists(table):
            together = self._append_in_one_commit(table, parts, metadata)
            if together is not None:
                return together
        # A DataFrameWriter records one application transaction: a commit per part.
        return [self.append(table, data, txn=txn, metadata=metadata) for data, txn in parts]

    def _append_in_one_commit(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn]],
        metadata: Mapping[str, str] | None,
    ) -> list[CommitResult] | None:
        """The parts appended in one Delta commit that records every part's transaction,
        through Delta's own ``OptimisticTransaction`` (reached over the JVM gateway): the
        transaction reads each app id's version (so a concurrent commit of one of them is a
        conflict, as it is for a DataFrameWriter's ``txnAppId``), writes the rows of the parts
        not applied yet, and commits their files with a ``SetTransaction`` each. ``None`` --
        a commit per part instead -- where that is not possible here: no JVM gateway, a
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
            with self._session_conf(PRESERVE_NULL_STRUCTS):
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
        for txn in txns:
            self._remember(table, txn)
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
        try:
            from delta.tables import DeltaTable
        except ImportError as exc:
            raise LakeError(
                "the spark lake engine merges with delta-spark, which is not installed here; "
                "install sfcdc[spark] (Databricks runtimes include it) or use engine: local"
            ) from exc

        condition = merge_condition(on)
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
        with self._errors("merge into", table):
            if self.location is None:
                target = DeltaTable.forName(self._spark, self.qualified_name(table))
            else:
                target = DeltaTable.forPath(self._spark, self.path(table))
            builder = target.alias("target").merge(df.alias("source"), condition)
            if delete_condition:
                builder = builder.whenMatchedDelete(condition=delete_condition)
            builder = builder.whenMatchedUpdateAll(condition=update_condition)
            if insert:
                builder = builder.whenNotMatchedInsertAll()
            conf: dict[str, str] = dict(PRESERVE_NULL_STRUCTS)
            if evolve_schema:
                builder = builder.withSchemaEvolution()
            if txn is not None:
                conf[TXN_APP_ID_CONF] = txn.app_id
                conf[TXN_VERSION_CONF] = str(txn.version)
            user_metadata = encode_user_metadata(metadata, txn)
            if user_metadata:
                conf[USER_METADATA_CONF] = user_metadata
            with self._session_conf(conf):
                builder.execute()
        self._remember(table, txn)
        (latest,) = self._history_rows(table, 1)
        after = int(latest["version"])
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
        try:
            from delta.tables import DeltaTable
        except ImportError as exc:
            raise LakeError(
                "the spark lake engine merges with delta-spark, which is not installed here; "
                "install sfcdc[spark] (Databricks runtimes include it) or use engine: local"
            ) from exc

        condition = merge_condition(on)
        names = updated_columns(table, columns, merge_keys(on))
        started = self._clock()
        if self._already_applied(table, txn):
            return MergeMetrics(table, 0, 0, 0, 0, self.version(table), True, 0.0)
        before = self._require(table)
        with self._errors("update columns of", table):
            if self.location is None:
                target = DeltaTable.forName(self._spark, self.qualified_name(table))
            else:
                target = DeltaTable.forPath(self._spark, self.path(table))
            known = {c.lower() for c in target.toDF().columns}
        missing = [c for c in (*on, *names) if c.lower() not in known]
        if missing:
            raise LakeError(
                f"update of columns in {table}: {missing} are not columns of the table "
                "(ensure_table adds them first)"
            )
        df = self._dataframe(source).select(*(f"`{c}`" for c in (*on, *names)))
        with self._errors("update columns of", table):
            builder = (
                target.alias("target")
                .merge(df.alias("source"), condition)
                .whenMatchedUpdate(set={f"`{c}`": f"source.`{c}`" for c in names})
            )
            conf: dict[str, str] = dict(PRESERVE_NULL_STRUCTS)
            if txn is not None:
                conf[TXN_APP_ID_CONF] = txn.app_id
                conf[TXN_VERSION_CONF] = str(txn.version)
            user_metadata = encode_user_metadata(metadata, txn)
            if user_metadata:
                conf[USER_METADATA_CONF] = user_metadata
            with self._session_conf(conf):
                builder.execute()
        self._remember(table, txn)
        (latest,) = self._history_rows(table, 1)
        after = int(latest["version"])
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
