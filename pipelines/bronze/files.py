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
import os
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
from pipelines.engines.base import (
    CommitResult,
    TableRef,
    Txn,
    encode_user_metadata,
    txn_applied,
)

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

    Each commit through delta-rs costs a pass over the table's log state and, on a local
    disk, a listing of the whole ``_delta_log`` directory, so its cost grows with every commit
    a table has had (7 ms at 200 commits, 58 ms at 3,000 on this project's benchmark machine).
    For tables with the plain protocol sfcdc creates (writer version 2 or lower, no table
    features) this writer therefore commits by itself, as the Delta protocol defines a
    commit: the actions of version ``N`` are written to a temporary file that is then linked
    to ``_delta_log/<N>.json``, which fails if that version exists (put-if-absent). The
    transaction versions and ``N`` are read from the table on the first append to it (and
    after a failed one); later appends follow from this writer's own commits. When version
    ``N`` turns out to be taken (maintenance compacted the table meanwhile), the table is
    re-read: if another writer recorded one of the commit's application transactions
    meanwhile (a concurrent landing of the same topic), the append fails; otherwise it is
    committed as the next version. Tables with other protocols are committed through
    delta-rs.
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
        # Per table committed here: its last version as this writer knows it.
        self._versions: dict[TableRef, int] = {}
        self._plain: dict[TableRef, bool] = {}

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
        protocol = dt.protocol()
        self._plain[table] = (
            protocol.min_writer_version <= _PLAIN_WRITER_VERSION
            and not protocol.writer_features
            and not protocol.reader_features
        )
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
        self._versions[table] = dt.version()
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
            if txn_applied(table, txn, recorded, _log):
                return CommitResult(
                    table, self._versions.get(table, dt.version()), skipped=True, rows=0
                )
        nulls = [f.name for f in schema if not f.nullable and data.column(f.name).null_count]
        if nulls:
            raise LakeError(f"{table}: nulls in NOT NULL columns {nulls}; nothing was written")
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
            size = (root / name).stat().st_size
            now_ms = int(self._clock() * 1000)
            if self._plain.get(table, False):
                version = self._commit_actions(
                    table, dt, _actions(name, size, now_ms, stats=stats, text=text, txns=txns), txns
                )
            else:
                add = AddAction(
                    path=name,
                    size=size,
                    partition_values={},
                    modification_time=now_ms,
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
                version = dt.version()
        except (DeltaError, LakeError, pa.ArrowException, OSError) as exc:
            self._applied.pop(table, None)
            self._versions.pop(table, None)
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
        self._versions[table] = version
        _log.debug("%s: appended %d rows as version %d", table, data.num_rows, version)
        return CommitResult(table, version, skipped=False, rows=data.num_rows)

    def _commit_actions(
        self, table: TableRef, dt: DeltaTable, actions: str, txns: Sequence[Txn]
    ) -> int:
        """Write ``actions`` as the table's next version (see the class notes); its number."""
        log = self._path_of(table) / "_delta_log"
        version = self._versions[table] + 1
        for _attempt in range(_COMMIT_ATTEMPTS):
            if _put_if_absent(log / f"{version:020d}.json", actions):
                return version
            # Version taken: who took it decides whether this commit may follow it.
            dt.update_incremental()
            known = self._applied.get(table, {})
            for txn in txns:
                recorded = dt.transaction_version(txn.app_id)
                if recorded is not None and int(recorded) != known.get(txn.app_id):
                    raise LakeError(
                        f"Concurrent transaction: {txn.app_id} is at version {recorded}, "
                        f"written by another writer"
                    )
            version = dt.version() + 1
        raise LakeError(f"no free version to commit after {_COMMIT_ATTEMPTS} attempts")


# Writer protocol versions whose appends need nothing beyond the actions written here: version
# 2 adds NOT NULL invariants (checked before writing) and append-only tables (these are
# appends).
_PLAIN_WRITER_VERSION = 2
_COMMIT_ATTEMPTS = 10


def _actions(
    name: str, size: int, now_ms: int, *, stats: str, text: str | None, txns: Sequence[Txn]
) -> str:
    """The newline-delimited JSON actions of a one-file blind append."""
    info: dict[str, object] = {
        "timestamp": now_ms,
        "operation": "WRITE",
        "operationParameters": {"mode": "Append"},
        "isBlindAppend": True,
        "engineInfo": "sfcdc",
    }
    if text:
        info["userMetadata"] = text
    actions: list[dict[str, object]] = [
        {"commitInfo": info},
        {
            "add": {
                "path": name,
                "partitionValues": {},
                "size": size,
                "modificationTime": now_ms,
                "dataChange": True,
                "stats": stats,
            }
        },
    ]
    actions.extend(
        {"txn": {"appId": t.app_id, "version": t.version, "lastUpdated": now_ms}} for t in txns
    )
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)


def _put_if_absent(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` in one step, unless it exists (then False)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(text, encoding="utf-8")
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink()
    return True
