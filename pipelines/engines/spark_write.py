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
(:func:`~pipelines.engines.spark_access.session_lock`) while they run.

``one_commit_appends`` (off by default) turns on a fast path for a classic session on a lake of
paths: several parts, each with its own transaction, go into one Delta commit through Delta's
``OptimisticTransaction`` over the py4j gateway, instead of a commit per part.

:class:`SparkWrites` is the part of :class:`~pipelines.engines.spark.SparkEngine` that writes;
the transactions are :mod:`pipelines.engines.spark_txns`'s.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pyspark.sql.types import StructType

from ingest.errors import LakeError
from pipelines.engines.base import (
    CommitResult,
    Kept,
    MergeMetrics,
    TableRef,
    Txn,
    WriteLayout,
    encode_user_metadata,
    merge_keys,
    txn_applied,
    updated_columns,
)
from pipelines.engines.spark_access import SparkTableAccess, jvm_class
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
from pipelines.engines.spark_tables import SparkTables
from pipelines.engines.spark_txns import SparkTransactions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SparkWrites"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")


class SparkWrites:
    """Appends, overwrites and merges into the tables of one engine (``access``): tables are
    created or evolved by ``tables``, and ``transactions`` make each write idempotent."""

    def __init__(
        self,
        access: SparkTableAccess,
        tables: SparkTables,
        transactions: SparkTransactions,
        *,
        one_commit_appends: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._access = access
        self._tables = tables
        self._transactions = transactions
        self.one_commit_appends = one_commit_appends
        self._clock = clock

    def _write(
        self,
        table: TableRef,
        data: Any,
        *,
        mode: Literal["append", "overwrite"],
        txn: Txn | None,
        options: dict[str, str],
    ) -> CommitResult:
        if self._transactions.already_applied(table, txn):
            return CommitResult(table, self._access.version(table), skipped=True, rows=0)
        df = self._access.dataframe(data)
        if not self._access.exists(table):
            self._tables.ensure_table(table, df.schema)
        before = self._access.require(table)
        writer = df.write.format("delta").mode(mode)
        for key, value in options.items():
            writer = writer.option(key, value)
        # With a txn, the writer options carry everything Delta would otherwise take from the
        # session's settings (the txn, userMetadata, mergeSchema): no lock needed.
        exclusive = self._access.session_conf() if txn is None else contextlib.nullcontext()
        with self._access.errors(mode, table), exclusive:
            if self._access.location is None:
                writer.saveAsTable(self._access.qualified_name(table))
            else:
                writer.save(self._access.path(table))
        latest = self._access.newest_commit(table)
        after = int(latest["version"])
        if after == before:
            # Delta skipped the write itself: the txn had been committed by another process.
            return CommitResult(table, after, skipped=True, rows=0)
        if txn is not None:
            self._transactions.note_commit(table, before, latest, txn)
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
            and self._access.location is not None
            and self._access.exists(table)
        ):
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
        through Delta's own ``OptimisticTransaction`` (reached over the py4j gateway): the
        transaction reads each app id's version (so a concurrent commit of one of them is a
        conflict, as it is for a DataFrameWriter's ``txnAppId``), writes the rows of the parts
        not applied yet, and commits their files with a ``SetTransaction`` each. ``None`` --
        a commit per part instead -- where that is not possible here: no py4j gateway, a
        runtime whose classes differ, or rows whose columns are not exactly the table's (a
        DataFrameWriter evolves the schema, this path does not)."""
        opened = self._access.delta_log(table)
        if opened is None:
            return None
        delta_log, snapshot = opened
        jvm: Any = self._access.spark._jvm
        try:
            package = str(delta_log.getClass().getPackage().getName())
            write_operation = jvm_class(jvm, f"{package}.DeltaOperations$Write")
            columns = [str(name) for name in snapshot.metadata().schema().fieldNames()]
        except Exception as exc:  # a runtime without these classes: a commit per part
            _log.debug("%s: no one-commit append on this runtime: %s", table, exc)
            return None
        if any(set(data.column_names) != set(columns) for data, _ in parts):
            return None
        selected = [data.select(columns) for data, _ in parts]
        if any(not part.schema.equals(selected[0].schema) for part in selected[1:]):
            return None  # parts of different types
        with self._access.errors("append", table):
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
            files = transaction.writeFiles(self._access.dataframe(rows)._jdf)
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
            # The commit takes no txn from the session's settings, but its userMetadata when
            # it has none of its own: it runs clear of them as every other write does.
            with self._access.session_conf():
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
        keep: Kept | None = None,
    ) -> MergeMetrics:
        merge_keys(on)  # a malformed key list fails before anything is read
        started = self._clock()
        if self._transactions.already_applied(table, txn):
            return MergeMetrics(table, 0, 0, 0, 0, self._access.version(table), True, 0.0)
        df = self._access.dataframe(source)
        lower = {c.lower() for c in df.columns}
        absent = [k for k in on if k.lower() not in lower]
        if absent:
            raise LakeError(
                f"merge into {table}: key columns {absent} are not in the source (columns: "
                f"{', '.join(df.columns)})"
            )
        if not self._access.exists(table):
            written = [f for f in df.schema.fields if keep is None or f.name != keep.flags]
            self._tables.ensure_table(table, StructType(written))
        before = self._access.require(table)
        if keep is not None:
            self._check_kept(table, df.columns, keep)
            evolve_schema = False  # the table has every column the statement names
        # MERGE takes these from the session's settings only (Delta 4.1 also ignores the
        # statement's WITH SCHEMA EVOLUTION, which Databricks runtimes honour).
        conf = self._merge_conf(txn, metadata, evolve_schema=evolve_schema)
        target = self._access.ident(table)
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
                keep=keep,
                columns=df.columns,
            ),
            conf,
        )
        after = int(latest["version"])
        if txn is not None:
            self._transactions.note_commit(table, before, latest, txn)
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
        if self._transactions.already_applied(table, txn):
            return MergeMetrics(table, 0, 0, 0, 0, self._access.version(table), True, 0.0)
        before = self._access.require(table)
        schema = self._access.schema(table)
        known = {f.name.lower() for f in schema.fields} if schema is not None else set()
        missing = [c for c in (*on, *names) if c.lower() not in known]
        if missing:
            raise LakeError(
                f"update of columns in {table}: {missing} are not columns of the table "
                "(ensure_table adds them first)"
            )
        df = self._access.dataframe(source).select(*(f"`{c}`" for c in (*on, *names)))
        target = self._access.ident(table)
        latest = self._run_merge(
            table,
            df,
            lambda view: update_columns_sql(target, view, on=on, columns=names),
            self._merge_conf(txn, metadata, evolve_schema=False),
        )
        after = int(latest["version"])
        if txn is not None:
            self._transactions.note_commit(table, before, latest, txn)
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

    def _check_kept(self, table: TableRef, columns: Sequence[str], keep: Kept) -> None:
        """A MERGE keeping columns names the source's columns: the table must have them."""
        schema = self._access.schema(table)
        known = {f.name.lower() for f in schema.fields} if schema is not None else set()
        problems = []
        lacking = [c for c in columns if c != keep.flags and c.lower() not in known]
        if lacking:
            problems.append(f"{lacking} are not columns of the table")
        absent = [c for c in (keep.flags, *keep.columns) if c not in columns]
        if absent:
            problems.append(f"{absent} are not columns of the source")
        if problems:
            raise LakeError(f"merge into {table} keeping columns: " + "; ".join(problems))

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
        with self._access.errors("merge into", table):
            source.createOrReplaceTempView(view)
            try:
                with self._access.session_conf(conf):
                    self._access.sql(statement(view)).collect()
            finally:
                self._access.spark.catalog.dropTempView(view)
        return self._access.newest_commit(table)
