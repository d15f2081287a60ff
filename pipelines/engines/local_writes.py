"""Writes of the local engine: table creation and schema growth, appends, overwrites and MERGE
through delta-rs, each recording its transaction (app id and version) in the commit so a
retried write is skipped.

:class:`LocalWriter` is the writing role of :class:`~pipelines.engines.local.LocalEngine`; it
uses the table cache, error translation, rewrite lock, direct-write policy and write hook of
:class:`~pipelines.engines.local_tables.LocalTables`. Appends whose rows
already have the table's schema go to :class:`~pipelines.engines.deltalog.DirectAppender`
first, a MERGE to :class:`~pipelines.engines.direct_merge.DirectMerger` when it accepts it; a
commit that removes files (overwrite, MERGE) holds the table's rewrite lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Schema,
    Transaction,
    WriterProperties,
    write_deltalake,
)

from ingest.errors import LakeError
from pipelines.engines.arrow import (
    conform_to_schema,
    delta_schema,
    delta_type_name,
    normalize_arrow,
    same_delta_type,
)
from pipelines.engines.base import (
    CommitResult,
    MergeMetrics,
    TableRef,
    Txn,
    WriteLayout,
    encode_user_metadata,
    merge_keys,
    txn_applied,
    updated_columns,
)
from pipelines.engines.deltalog import DirectAppender, DirectWritesUnavailable, StaleTable
from pipelines.engines.direct_merge import DirectMerger
from pipelines.engines.local_tables import LocalTables, as_arrow, schema_of

__all__ = ["LocalWriter"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.local")


def _dq(name: str) -> str:
    """A double-quoted identifier for delta-rs (DataFusion) SQL."""
    return '"' + name.replace('"', '""') + '"'


class LocalWriter:
    """Table creation, appends, overwrites and MERGE of the tables of ``lake``.

    Appends go to ``appender`` and MERGEs to ``merger`` while ``lake`` allows direct commits;
    ``clock`` times merges; a table created here gets ``default_properties``.
    """

    def __init__(
        self,
        lake: LocalTables,
        *,
        appender: DirectAppender,
        merger: DirectMerger,
        clock: Callable[[], float],
        default_properties: Mapping[str, str],
    ) -> None:
        self._lake = lake
        self._direct = appender
        self._merger = merger
        self._clock = clock
        self.default_properties = default_properties

    def ensure_table(
        self,
        table: TableRef,
        schema: pa.Schema,
        *,
        properties: Mapping[str, str] | None = None,
        deletion_vectors: bool = False,
    ) -> None:
        """``schema`` is in the Arrow types Delta stores
        (:func:`~pipelines.engines.arrow.delta_schema`)."""
        # delta-rs neither writes deletion vectors nor reads a table that has them: a MERGE
        # here rewrites the files it touches, whatever deletion_vectors asks.
        lake = self._lake
        wanted = {**self.default_properties, **(properties or {})}
        dt = lake.load(table)
        if dt is None:
            if lake.where.local is not None:
                lake.path(table).mkdir(parents=True, exist_ok=True)
            with lake.errors("create", table):
                DeltaTable.create(
                    lake.uri(table),
                    schema,
                    mode="ignore",
                    configuration=wanted or None,
                    storage_options=lake.storage_options,
                )
            _log.info("created %s at %s", table, lake.uri(table))
            lake.after_write(table)
            return
        by_name = {f.name.lower(): f for f in schema_of(dt)}
        missing = []
        for f in schema:
            existing = by_name.get(f.name.lower())
            if existing is None:
                missing.append(f)
            elif not same_delta_type(existing.type, f.type):
                raise LakeError(
                    f"column {f.name!r} of {table} is {delta_type_name(existing.type)}, not "
                    f"{delta_type_name(f.type)}; changing a column type needs a rewrite"
                )
        with lake.errors("alter", table):
            if missing:
                # Existing rows have no value for a new column, so it cannot be NOT NULL.
                fields = pa.schema([f.with_nullable(True) for f in missing])
                dt.alter.add_columns(Schema.from_arrow(fields).fields)
                _log.info("%s: added columns %s", table, ", ".join(f.name for f in missing))
            changed = {k: v for k, v in wanted.items() if dt.metadata().configuration.get(k) != v}
            if changed:
                dt.alter.set_table_properties(changed)
        if missing or changed:
            lake.after_write(table)

    @staticmethod
    def _commit_properties(txn: Txn | None, metadata: Mapping[str, str] | None) -> CommitProperties:
        text = encode_user_metadata(metadata, txn)
        return CommitProperties(
            custom_metadata={"userMetadata": text} if text else None,
            app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None,
        )

    def _already_applied(self, dt: DeltaTable | None, table: TableRef, txn: Txn | None) -> bool:
        if dt is None or txn is None:
            return False
        return txn_applied(table, txn, dt.transaction_version(txn.app_id), _log)

    @staticmethod
    def _writer_properties(layout: WriteLayout | None) -> WriterProperties | None:
        if layout is None:
            return None
        columns: dict[str, ColumnProperties] = {}
        for name in dict.fromkeys([*layout.distinct, *layout.unindexed]):
            columns[name] = ColumnProperties(
                dictionary_enabled=False if name in layout.distinct else None,
                statistics_enabled="NONE" if name in layout.unindexed else None,
            )
        return WriterProperties(
            max_row_group_size=layout.row_group_rows, column_properties=columns or None
        )

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
        arrow = normalize_arrow(as_arrow(data))
        direct = self._direct_append(table, [(arrow, txn)], metadata=metadata, layout=layout)
        if direct is not None:
            return direct[0]
        dt = self._lake.load(table)
        if dt is None:
            if arrow.num_rows == 0 and txn is None:
                return CommitResult(table, None, skipped=False, rows=0)
            self.ensure_table(table, delta_schema(arrow.schema))
            dt = self._lake.require(table)
        target = schema_of(dt)
        arrow, grows = conform_to_schema(arrow, target, evolve=evolve_schema, table_name=str(table))
        if not grows:
            direct = self._direct_append(table, [(arrow, txn)], metadata=metadata, layout=layout)
            if direct is not None:
                return direct[0]
        if self._already_applied(dt, table, txn):
            return CommitResult(table, dt.version(), skipped=True, rows=0)
        if arrow.num_rows == 0 and txn is None:
            return CommitResult(table, None, skipped=False, rows=0)
        writer = self._writer_properties(layout)
        # delta-rs takes no explicit None for its writer defaults.
        tuning: dict[str, Any] = {"writer_properties": writer} if writer is not None else {}
        with self._lake.errors("append to", table):
            write_deltalake(
                dt,
                arrow,
                mode="append",
                schema_mode="merge" if grows else None,
                commit_properties=self._commit_properties(txn, metadata),
                **tuning,
            )
            dt.update_incremental()
        self._direct.forget(table)
        _log.debug("%s: appended %d rows as version %d", table, arrow.num_rows, dt.version())
        self._lake.after_write(table)
        return CommitResult(table, dt.version(), skipped=False, rows=arrow.num_rows)

    def append_parts(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> list[CommitResult]:
        if not parts:
            return []
        fitted = [(normalize_arrow(data), txn) for data, txn in parts]
        direct = self._direct_append(table, fitted, metadata=metadata)
        if direct is not None:
            return direct
        dt = self._lake.load(table)
        if dt is not None:
            target = schema_of(dt)
            fitted = [
                (conform_to_schema(data, target, evolve=False, table_name=str(table))[0], txn)
                for data, txn in parts
            ]
            direct = self._direct_append(table, fitted, metadata=metadata)
            if direct is not None:
                return direct
        return [self.append(table, data, txn=txn, metadata=metadata) for data, txn in parts]

    def _direct_append(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn | None]],
        *,
        metadata: Mapping[str, str] | None,
        layout: WriteLayout | None = None,
    ) -> list[CommitResult] | None:
        """The parts committed by :class:`~pipelines.engines.deltalog.DirectAppender` when it
        takes them (they have the table's exact schema and the table a plain protocol);
        ``None`` when they must go through delta-rs."""
        if not self._lake.direct_allowed():
            return None
        if not all(self._direct.accepts(table, data.schema) for data, _ in parts):
            return None
        try:
            results = self._direct.append_parts(table, parts, metadata=metadata, layout=layout)
        except StaleTable:
            return None
        except DirectWritesUnavailable as exc:
            self._lake.direct_failed(exc)
            return None
        if any(r.version is not None and not r.skipped for r in results):
            self._lake.after_write(table)
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
        dt = self._lake.load(table)
        if self._already_applied(dt, table, txn):
            assert dt is not None
            return CommitResult(table, dt.version(), skipped=True, rows=0)
        arrow = as_arrow(data)
        props = self._commit_properties(txn, metadata)
        if dt is None:
            self.ensure_table(table, delta_schema(normalize_arrow(arrow).schema))
            dt = self._lake.require(table)
        with self._lake.rewriting(table, "overwrite"), self._lake.errors("overwrite", table):
            dt.update_incremental()  # every file of the latest version goes (see merge)
            if replace_schema:
                arrow = normalize_arrow(arrow)
                write_deltalake(
                    dt, arrow, mode="overwrite", schema_mode="overwrite", commit_properties=props
                )
            else:
                target = schema_of(dt)
                arrow, grows = conform_to_schema(arrow, target, evolve=True, table_name=str(table))
                write_deltalake(
                    dt,
                    arrow,
                    mode="overwrite",
                    schema_mode="merge" if grows else None,
                    commit_properties=props,
                )
            dt.update_incremental()
        self._direct.forget(table)
        _log.info("%s: overwrote with %d rows as version %d", table, arrow.num_rows, dt.version())
        self._lake.after_write(table)
        return CommitResult(table, dt.version(), skipped=False, rows=arrow.num_rows)

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
        keys = merge_keys(on)
        started = self._clock()
        dt = self._lake.load(table)
        if self._already_applied(dt, table, txn):
            assert dt is not None
            return MergeMetrics(table, 0, 0, 0, 0, dt.version(), True, self._clock() - started)
        arrow = normalize_arrow(as_arrow(source))
        lower = {c.lower() for c in arrow.column_names}
        absent = [k for k in keys if k.lower() not in lower]
        if absent:
            raise LakeError(
                f"merge into {table}: key columns {absent} are not in the source (columns: "
                f"{', '.join(arrow.column_names)})"
            )
        if dt is None:
            self.ensure_table(table, delta_schema(arrow.schema))
            dt = self._lake.require(table)
        target = schema_of(dt)
        arrow, _grows = conform_to_schema(
            arrow, target, evolve=evolve_schema, table_name=str(table), fill_missing=False
        )
        predicate = " AND ".join(f"target.{_dq(k)} = source.{_dq(k)}" for k in keys)
        with self._lake.rewriting(table, "merge"), self._lake.errors("merge into", table):
            # The latest version, read under the lock: merged into an older one, delta-rs
            # would let this commit remove files a compaction has already replaced.
            dt.update_incremental()
            before = dt.version()
            plan = (
                DirectMerger.plan(
                    dt,
                    arrow,
                    on=keys,
                    update_condition=update_condition,
                    delete_condition=delete_condition,
                    insert=insert,
                )
                if self._lake.direct_allowed()
                else None
            )
            direct = None
            if plan is not None:
                try:
                    direct = self._merger.merge(dt, plan, txn=txn, metadata=metadata)
                except DirectWritesUnavailable as exc:
                    self._lake.direct_failed(exc)
            reported: Mapping[str, Any]
            if direct is not None:
                reported = direct
            else:
                # Not a MERGE sfcdc runs itself, or another writer committed first.
                dt.update_incremental()
                before = dt.version()
                reported = self._delta_rs_merge(
                    dt,
                    arrow,
                    predicate,
                    update_condition=update_condition,
                    delete_condition=delete_condition,
                    insert=insert,
                    evolve_schema=evolve_schema,
                    props=self._commit_properties(txn, metadata),
                )
            dt.update_incremental()
            if txn is not None and dt.version() == before:
                # delta-rs commits nothing when no row changes; the txn must still be recorded.
                write_deltalake(
                    dt,
                    target.empty_table(),
                    mode="append",
                    commit_properties=self._commit_properties(txn, metadata),
                )
                dt.update_incremental()
        self._direct.forget(table)
        metrics = MergeMetrics(
            table,
            inserted=int(reported.get("num_target_rows_inserted", 0)),
            updated=int(reported.get("num_target_rows_updated", 0)),
            deleted=int(reported.get("num_target_rows_deleted", 0)),
            source_rows=int(reported.get("num_source_rows", arrow.num_rows)),
            version=dt.version(),
            skipped=False,
            duration_s=self._clock() - started,
        )
        _log.info(
            "%s: merged %d source rows (%d inserted, %d updated, %d deleted) as version %d",
            table,
            metrics.source_rows,
            metrics.inserted,
            metrics.updated,
            metrics.deleted,
            metrics.version,
        )
        self._lake.after_write(table)
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
        keys = merge_keys(on)
        started = self._clock()
        names = updated_columns(table, columns, keys)
        dt = self._lake.require(table)
        if self._already_applied(dt, table, txn):
            return MergeMetrics(table, 0, 0, 0, 0, dt.version(), True, self._clock() - started)
        target = schema_of(dt)
        missing = [c for c in (*keys, *names) if target.get_field_index(c) < 0]
        if missing:
            raise LakeError(
                f"update of columns in {table}: {missing} are not columns of the table "
                "(ensure_table adds them first)"
            )
        arrow = normalize_arrow(as_arrow(source)).select([*keys, *names])
        arrow, _grows = conform_to_schema(
            arrow, target, evolve=False, table_name=str(table), fill_missing=False
        )
        predicate = " AND ".join(f"target.{_dq(k)} = source.{_dq(k)}" for k in keys)
        with self._lake.rewriting(table, "merge"), self._lake.errors("update columns of", table):
            dt.update_incremental()
            before = dt.version()
            # A MERGE of its own: the direct merger replaces whole rows, this sets a few columns
            # and leaves every other one as it is.
            reported = (
                dt.merge(
                    arrow,
                    predicate,
                    source_alias="source",
                    target_alias="target",
                    streamed_exec=False,
                    commit_properties=self._commit_properties(txn, metadata),
                )
                .when_matched_update(updates={_dq(c): f"source.{_dq(c)}" for c in names})
                .execute()
            )
            dt.update_incremental()
            if txn is not None and dt.version() == before:
                # delta-rs commits nothing when no row changes; the txn must still be recorded.
                write_deltalake(
                    dt,
                    target.empty_table(),
                    mode="append",
                    commit_properties=self._commit_properties(txn, metadata),
                )
                dt.update_incremental()
        self._direct.forget(table)
        metrics = MergeMetrics(
            table,
            inserted=0,
            updated=int(reported.get("num_target_rows_updated", 0)),
            deleted=0,
            source_rows=int(reported.get("num_source_rows", arrow.num_rows)),
            version=dt.version(),
            skipped=False,
            duration_s=self._clock() - started,
        )
        _log.info(
            "%s: set %s of %d rows from %d source rows as version %d",
            table,
            ", ".join(names),
            metrics.updated,
            metrics.source_rows,
            metrics.version,
        )
        self._lake.after_write(table)
        return metrics

    @staticmethod
    def _delta_rs_merge(
        dt: DeltaTable,
        arrow: pa.Table,
        predicate: str,
        *,
        update_condition: str | None,
        delete_condition: str | None,
        insert: bool,
        evolve_schema: bool,
        props: CommitProperties,
    ) -> Mapping[str, Any]:
        merger = dt.merge(
            arrow,
            predicate,
            source_alias="source",
            target_alias="target",
            merge_schema=evolve_schema,
            # The source is an Arrow table in memory already: merged as a table, delta-rs
            # knows its key range and joins it without streaming it through a spill-able
            # plan (a third less time for 100k changes into 1M rows).
            streamed_exec=False,
            commit_properties=props,
        )
        if delete_condition:
            merger = merger.when_matched_delete(predicate=delete_condition)
        merger = merger.when_matched_update_all(predicate=update_condition)
        if insert:
            merger = merger.when_not_matched_insert_all()
        return merger.execute()
