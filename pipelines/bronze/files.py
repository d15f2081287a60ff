"""Bronze appends on the local engine: Parquet written by pyarrow, committed with add actions.

A landing commit is one Parquet file and one Delta commit. delta-rs' ``write_deltalake``
encodes the file in its own runtime and compresses every column; for bronze, whose payloads
are Avro bytes nobody filters on, most of that work buys nothing. :class:`LocalBronzeWriter`
writes the file with pyarrow instead (which releases the GIL while it encodes and writes, so
the stream keeps being received meanwhile) and then commits it to the Delta log with
delta-rs' add-action API, in the same single commit as the topic's application transaction.
The commit protocol of :mod:`pipelines.bronze.checkpoint` is unchanged: the transaction
version is checked before the write and recorded atomically with the file, and a file written
by a process killed before its commit is referenced by no version.

Checkpoint rows take the same path (a one-row file and its commit), with pyarrow's default
layout and the row count as their only file statistics.

The bronze file layout: one row group per batch; no dictionary for columns whose values are all
distinct; statistics only for the columns readers filter on (``batch_id``, ``batch_seq``,
``received_at``); payloads and ids uncompressed (Avro payloads of change events compress
poorly, and the compression costs more CPU per event than writing them as they are).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction

from ingest.errors import LakeError
from pipelines.bronze.tables import BRONZE_SCHEMA
from pipelines.engines.base import CommitResult, TableRef, Txn, encode_user_metadata

__all__ = ["LocalBronzeWriter", "bronze_file_stats"]

_log = logging.getLogger(__name__)

# Columns with a handful of values per batch: dictionary-encoded and (small) compressed.
_REPEATED = ("schema_id", "topic")
# Columns readers filter on: Parquet statistics and Delta file statistics.
_INDEXED = ("received_at", "batch_id", "batch_seq")
_COMPRESSION = {name: ("snappy" if name in _REPEATED else "none") for name in BRONZE_SCHEMA.names}


def _stats_value(value: object) -> object:
    # Delta file statistics write timestamps as ISO text at millisecond precision, like
    # delta-rs and Spark do (readers widen a bound by that precision when they skip files).
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + (
            f"{value.microsecond // 1000:03d}Z"
        )
    return value


def bronze_file_stats(table: pa.Table) -> str:
    """The Delta ``stats`` JSON of a bronze file holding ``table``: row count, min/max of the
    columns readers filter on, null counts of every non-binary column (all zero: bronze
    columns are NOT NULL)."""
    minimum: dict[str, object] = {}
    maximum: dict[str, object] = {}
    if table.num_rows:
        for name in _INDEXED:
            bounds = pc.min_max(table.column(name))
            minimum[name] = _stats_value(bounds["min"].as_py())
            maximum[name] = _stats_value(bounds["max"].as_py())
    nulls = {
        f.name: table.column(f.name).null_count
        for f in table.schema
        if not pa.types.is_binary(f.type)
    }
    return json.dumps(
        {
            "numRecords": table.num_rows,
            "minValues": minimum,
            "maxValues": maximum,
            "nullCount": nulls,
        },
        separators=(",", ":"),
    )


class LocalBronzeWriter:
    """Appends bronze batches and checkpoint rows to the local engine's Delta tables (see the
    module notes).

    ``path_of`` maps a table to its directory (:meth:`LocalEngine.path`). Only tables whose
    schema is exactly the one landing writes are written this way (:meth:`accepts`); a table
    that gained columns goes through the engine. ``clock`` (epoch seconds) stamps the add
    actions.

    Each commit costs delta-rs a pass over the table's log state, and so does each snapshot
    refresh and transaction lookup: with a few dozen files, more than writing a batch. So
    the transaction version is read from the table only on the first append to it (and
    after a failed one); later appends commit on the snapshot this writer left after its own
    last commit, and delta-rs refuses such a commit when another writer committed the same
    application transaction meanwhile (a concurrent landing of the same topic).
    """

    def __init__(
        self,
        path_of: Callable[[TableRef], Path],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path_of = path_of
        self._clock = clock
        self._tables: dict[TableRef, DeltaTable] = {}
        self._schemas: dict[TableRef, pa.Schema] = {}
        # Per table, the transaction versions this writer committed on its current snapshot
        # (absent: the snapshot must be refreshed and the transactions read first).
        self._applied: dict[TableRef, dict[str, int]] = {}

    def _load(self, table: TableRef) -> DeltaTable:
        dt = self._tables.get(table)
        path = self._path_of(table)
        try:
            if dt is None:
                dt = DeltaTable(str(path))
                self._tables[table] = dt
            else:
                dt.update_incremental()
        except (DeltaError, OSError) as exc:
            self._tables.pop(table, None)
            raise LakeError(f"open {table} ({path}) failed: {exc}") from exc
        return dt

    def accepts(self, table: TableRef, schema: pa.Schema = BRONZE_SCHEMA) -> bool:
        """Whether ``table`` exists with exactly ``schema`` (and no partitions); if so,
        :meth:`append` takes rows of ``schema`` for it."""
        try:
            dt = self._load(table)
        except LakeError:
            return False
        current = pa.schema(dt.schema().to_arrow())
        same = [(f.name, f.type) for f in current] == [(f.name, f.type) for f in schema]
        if not same or dt.metadata().partition_columns:
            return False
        self._schemas[table] = schema
        return True

    def _recorded(self, table: TableRef, app_id: str) -> tuple[DeltaTable, int | None]:
        applied = self._applied.get(table)
        if applied is not None:
            return self._tables[table], applied.get(app_id)
        dt = self._load(table)
        try:
            recorded = dt.transaction_version(app_id)
        except DeltaError as exc:
            raise LakeError(f"read the transactions of {table} failed: {exc}") from exc
        self._applied[table] = {} if recorded is None else {app_id: int(recorded)}
        return dt, None if recorded is None else int(recorded)

    def append(
        self, table: TableRef, data: pa.Table, *, txn: Txn, metadata: Mapping[str, str]
    ) -> CommitResult:
        """Write ``data`` as one file and commit it under ``txn``; an already applied ``txn``
        writes nothing and reports ``skipped``. ``table`` must have been :meth:`accepts`-ed
        for the schema of ``data``."""
        return self.append_all(table, data, txns=[txn], metadata=metadata)

    def append_all(
        self,
        table: TableRef,
        data: pa.Table,
        *,
        txns: Sequence[Txn],
        metadata: Mapping[str, str],
    ) -> CommitResult:
        """:meth:`append` recording several application transactions (of distinct app ids) in
        the one commit; if any of them is applied already, nothing is written and the result
        is ``skipped``. (The commit's ``userMetadata`` names a transaction only when there is
        one: Delta's own transaction actions are what readers of these tables look up.)"""
        schema = self._schemas.get(table)
        if schema is None or data.schema != schema:
            expected = f"rows of {schema.names}" if schema is not None else "an accepted table"
            raise LakeError(
                f"{table}: a direct append needs {expected}; got rows of {data.schema.names}"
            )
        if not txns or len({txn.app_id for txn in txns}) != len(txns):
            raise LakeError(f"{table}: a direct append needs distinct transactions (got {txns})")
        for txn in txns:
            dt, recorded = self._recorded(table, txn.app_id)
            if recorded is not None and txn.version <= recorded:
                _log.info(
                    "%s: skipping write of txn %s version %d (already applied up to %d)",
                    table,
                    txn.app_id,
                    txn.version,
                    recorded,
                )
                return CommitResult(table, dt.version(), skipped=True, rows=0)
        root = self._path_of(table)
        name = f"part-00000-{uuid.uuid4()}-c000.parquet"
        text = encode_user_metadata(metadata, txns[0] if len(txns) == 1 else None)
        bronze = schema == BRONZE_SCHEMA
        try:
            if bronze:
                pq.write_table(
                    data,
                    str(root / name),
                    row_group_size=max(data.num_rows, 1),
                    compression=_COMPRESSION,
                    use_dictionary=list(_REPEATED),
                    write_statistics=list(_INDEXED),
                )
                stats = bronze_file_stats(data)
            else:
                pq.write_table(data, str(root / name))
                stats = json.dumps({"numRecords": data.num_rows}, separators=(",", ":"))
            add = AddAction(
                path=name,
                size=(root / name).stat().st_size,
                partition_values={},
                modification_time=int(self._clock() * 1000),
                data_change=True,
                stats=stats,
            )
            dt.create_write_transaction(
                [add],
                mode="append",
                schema=dt.schema(),
                commit_properties=CommitProperties(
                    custom_metadata={"userMetadata": text} if text else None,
                    app_transactions=[Transaction(t.app_id, t.version) for t in txns],
                ),
            )
            dt.update_incremental()
        except (DeltaError, pa.ArrowException, OSError) as exc:
            self._applied.pop(table, None)
            raise LakeError(
                f"append to {table} ({root}) failed: {exc}"
                + (
                    " (another writer committed this table's transaction meanwhile: two "
                    "landings of one topic cannot run at once)"
                    if "Concurrent transaction" in str(exc)
                    else ""
                )
            ) from exc
        for txn in txns:
            self._applied[table][txn.app_id] = txn.version
        version = dt.version()
        _log.debug("%s: appended %d rows as version %d", table, data.num_rows, version)
        return CommitResult(table, version, skipped=False, rows=data.num_rows)
