"""The local engine's own MERGE: copy-on-write in Arrow, committed as one Delta version.

delta-rs' MERGE joins the source with the table in DataFusion and writes the result with its
Parquet writer, which on this project's benchmark (100,000 gold changes into 1,000,000 rows)
takes longer than rewriting the whole table; pyarrow encodes the same rows about three times
faster. So when a MERGE is the kind the pipeline runs -- on one key column, with clause
conditions :mod:`pipelines.engines.merge_predicate` understands, into a table of the plain
protocol (:func:`~pipelines.engines.deltalog.plain_protocol`) whose schema the source has
exactly -- :class:`DirectMerger` runs it itself, with the semantics of Delta's MERGE:

- files whose key statistics rule out every source key are not read; every other file is
  read whole, its rows matched to the source rows by key (``index_in``);
- a matched target row is deleted where the delete clause's condition holds, else replaced
  by its source row where the update clause's holds (or always, without one), else kept;
  a file where nothing changes stays as it is; the others are written again, their rows in
  their old order, and removed;
- source rows that matched no target row are inserted (one new file);
- two source rows with one key are refused, as Delta refuses them;
- with the change data feed on (every table of the engine), the commit carries change
  files: pre- and post-images of updated rows, deleted and inserted rows, as delta-rs writes
  them (one file per data file rewritten, and one for the inserts);
- the commit (``remove``, ``add``, ``cdc``, ``txn`` and ``commitInfo`` actions, written by
  :func:`~pipelines.engines.deltalog.commit_rewrite`) is put-if-absent as the version after
  the one read. The caller holds the table's rewrite lock,
  so only a blind append can take that version first; then the files written are deleted
  and the caller runs the MERGE through delta-rs on the newer version (as it does when a
  data file's path is not a plain relative name, which the log may spell escaped).

Files are processed two at a time (pyarrow releases the GIL while it reads, compares and
encodes). Tests run each MERGE both ways and compare rows, counts and change feed.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pipelines.engines.base import CDF_PROPERTY, Txn
from pipelines.engines.deltalog import (
    STATS_PREFIX,
    Rewrite,
    commit_rewrite,
    indexed_columns,
    nested_nulls,
    plain_protocol,
    remove_action,
    write_change_file,
    write_data_file,
)
from pipelines.engines.merge_predicate import Condition, UnsupportedCondition, parse_condition
from pipelines.engines.parquet_read import data_file, read_parquet

__all__ = ["DirectMerger", "MergePlan"]

_log = logging.getLogger(__name__)
_WORKERS = max(1, min(2, os.cpu_count() or 1))
# Data file paths this writer removes: relative, and spelt the same escaped or not.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._=/-]+")


@dataclass(frozen=True)
class MergePlan:
    """One MERGE, as :meth:`DirectMerger.plan` accepted it."""

    key: str
    source: pa.Table
    update: Condition | None
    delete: Condition | None
    insert: bool
    predicate: str
    indexed: frozenset[str] = frozenset()


@dataclass
class _FileResult:
    """What the MERGE did to one data file."""

    matched: pa.Array  # positions of the source rows that matched rows of the file
    updated: int = 0
    deleted: int = 0
    copied: int = 0
    add: dict[str, object] | None = None
    remove: dict[str, object] | None = None
    cdc: dict[str, object] | None = None  # the file of its changes (change data feed on)


class DirectMerger:
    """Runs the MERGEs it accepts on local tables (see the module notes). ``clock`` (epoch
    seconds) stamps the actions."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    @staticmethod
    def plan(
        dt: DeltaTable,
        source: pa.Table,
        *,
        on: Sequence[str],
        update_condition: str | None,
        delete_condition: str | None,
        insert: bool,
    ) -> MergePlan | None:
        """The MERGE as this writer would run it, or ``None`` when it must go to delta-rs
        (or when delta-rs must refuse it with its own error)."""
        if len(on) != 1 or not plain_protocol(dt):
            return None
        if dt.metadata().configuration.get("delta.appendOnly", "false").lower() == "true":
            return None  # delta-rs refuses it, with its own message
        schema = pa.schema(dt.schema().to_arrow())
        if [(f.name, f.type) for f in schema] != [(f.name, f.type) for f in source.schema]:
            return None
        key = on[0]
        keys = source.column(key)
        if keys.null_count:
            return None
        if pc.count_distinct(keys).as_py() != source.num_rows:
            return None  # delta-rs refuses it, with its own message
        try:
            update = parse_condition(update_condition, schema, schema) if update_condition else None
            delete = parse_condition(delete_condition, schema, schema) if delete_condition else None
        except UnsupportedCondition as exc:
            _log.debug("MERGE through delta-rs: %s", exc)
            return None
        try:
            source = source.cast(schema).combine_chunks()
        except pa.ArrowException:
            return None
        if nested_nulls(source, schema):
            return None  # delta-rs refuses it, with its own message
        indexed = indexed_columns(schema, dt.metadata().configuration)
        return MergePlan(
            key, source, update, delete, insert, f"target.{key} = source.{key}", indexed
        )

    def merge(
        self,
        dt: DeltaTable,
        plan: MergePlan,
        *,
        txn: Txn | None,
        metadata: Mapping[str, str] | None,
    ) -> dict[str, int] | None:
        """Run ``plan`` against ``dt`` (its latest version, read under the table's rewrite
        lock) and commit it; delta-rs' metric names and counts, or ``None`` when another
        writer took the next version first, or a file to rewrite has a path this writer does
        not remove (nothing is left behind then)."""
        root = Path(data_file(dt.table_uri))
        schema = plan.source.schema
        cdf = dt.metadata().configuration.get(CDF_PROPERTY, "false").lower() == "true"
        files = pa.table(dt.get_add_actions(flatten=True))
        # Largest first: two threads then finish close together.
        candidates = sorted(_candidates(files, plan), key=lambda e: -int(e["size_bytes"]))  # type: ignore[call-overload]
        if not all(_PLAIN_PATH.fullmatch(str(e["path"])) for e in candidates):
            return None  # a path the log may spell otherwise (escaped, absolute)
        written: list[Path] = []
        committed = False  # else the files written go again
        try:
            with ThreadPoolExecutor(_WORKERS, thread_name_prefix="sfcdc-merge") as pool:
                results = list(
                    pool.map(
                        lambda entry: self._rewrite(
                            root, entry, plan, schema, cdf=cdf, written=written
                        ),
                        candidates,
                    )
                )
            inserts = schema.empty_table()
            if plan.insert:
                unseen = np.ones(plan.source.num_rows, dtype=bool)
                for r in results:
                    unseen[r.matched.to_numpy()] = False
                inserts = plan.source.filter(pa.array(unseen))
            adds = [r.add for r in results if r.add is not None]
            removes = [r.remove for r in results if r.remove is not None]
            cdc = [r.cdc for r in results if r.cdc is not None]
            now_ms = int(self._clock() * 1000)
            if inserts.num_rows:
                adds.append(
                    write_data_file(root, inserts, now_ms, written=written, indexed=plan.indexed)
                )
                if cdf:
                    cdc.append(
                        write_change_file(root, _labelled(inserts, "insert"), written=written)
                    )
            metrics = {
                "num_source_rows": plan.source.num_rows,
                "num_target_rows_inserted": inserts.num_rows,
                "num_target_rows_updated": sum(r.updated for r in results),
                "num_target_rows_deleted": sum(r.deleted for r in results),
                "num_target_rows_copied": sum(r.copied for r in results),
                "num_output_rows": inserts.num_rows
                + sum(r.updated + r.copied for r in results if r.add is not None),
                "num_target_files_scanned": len(candidates),
                "num_target_files_skipped_during_scan": files.num_rows - len(candidates),
                "num_target_files_added": len(adds),
                "num_target_files_removed": len(removes),
            }
            if not adds and not removes and txn is None:
                committed = True  # nothing changed and nothing to record: no commit
                return metrics
            rewrite = Rewrite("MERGE", _parameters(plan), dt.version(), metrics, removes, adds, cdc)
            committed = commit_rewrite(root, rewrite, now_ms, txn=txn, metadata=metadata)
            return metrics if committed else None
        finally:
            if not committed:
                for path in written:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()

    def _rewrite(
        self,
        root: Path,
        entry: dict[str, object],
        plan: MergePlan,
        schema: pa.Schema,
        *,
        cdf: bool,
        written: list[Path],
    ) -> _FileResult:
        """Match one data file's rows to the source; write it again when a row changes."""
        path = str(entry["path"])
        rows = read_parquet([str(root / path)], schema, schema.names, [])
        positions = pc.index_in(rows.column(plan.key), value_set=plan.source.column(plan.key))
        hit = pc.is_valid(positions)
        matched = pc.drop_null(positions).combine_chunks()
        if not len(matched):
            return _FileResult(matched)
        where = pc.indices_nonzero(hit)  # the matched rows' places in the file
        target = rows.take(where)
        source = plan.source.take(matched)
        deleted = (
            plan.delete(target, source) if plan.delete else pa.array(np.zeros(len(matched), bool))
        )
        updated = pc.and_(
            pc.invert(deleted),
            plan.update(target, source) if plan.update else pa.array(np.ones(len(matched), bool)),
        )
        n_deleted, n_updated = pc.sum(deleted).as_py() or 0, pc.sum(updated).as_py() or 0
        result = _FileResult(matched)
        if not n_deleted and not n_updated:
            return result
        # Every row in its old place: a kept row from the file, an updated one from the
        # source (appended after the file's rows), a deleted one left out.
        count = rows.num_rows
        order = np.arange(count)
        order[where.filter(updated).to_numpy()] = count + np.arange(n_updated)
        keep = np.ones(count, dtype=bool)
        keep[where.filter(deleted).to_numpy()] = False
        replacements = source.filter(updated)
        output = pa.concat_tables([rows, replacements]).take(pa.array(order[keep]))
        now_ms = int(self._clock() * 1000)
        result.updated, result.deleted = n_updated, n_deleted
        result.copied = count - n_updated - n_deleted
        result.remove = remove_action(path, int(entry["size_bytes"]), now_ms)  # type: ignore[call-overload]
        if output.num_rows:
            result.add = write_data_file(
                root, output, now_ms, written=written, indexed=plan.indexed
            )
        if cdf:
            # Written here, by the thread that rewrote the file, rather than all at the end.
            changes = [
                _labelled(target.filter(updated), "update_preimage"),
                _labelled(replacements, "update_postimage"),
                _labelled(target.filter(deleted), "delete"),
            ]
            result.cdc = write_change_file(root, pa.concat_tables(changes), written=written)
        return result


def _labelled(rows: pa.Table, change: str) -> pa.Table:
    return rows.append_column("_change_type", pa.array([change] * rows.num_rows, pa.string()))


def _candidates(files: pa.Table, plan: MergePlan) -> list[dict[str, object]]:
    """The data files whose key range may hold a source key (all, without statistics)."""
    keys = sorted(plan.source.column(plan.key).to_pylist())
    low_name, high_name = f"min.{plan.key}", f"max.{plan.key}"
    names = set(files.column_names)
    out: list[dict[str, object]] = []
    for entry in files.select(
        [n for n in ("path", "size_bytes", low_name, high_name) if n in names]
    ).to_pylist():
        low, high = entry.get(low_name), entry.get(high_name)
        if low is not None and high is not None and not (_cut(low) or _cut(high)):
            try:
                first = bisect.bisect_left(keys, low)
                if first == len(keys) or keys[first] > high:
                    continue
            except TypeError:
                pass  # statistics of another type than the keys: read the file
        out.append(entry)
    return out


def _cut(bound: object) -> bool:
    """Whether a text bound may be a prefix of the real one (writers cut long text in file
    statistics, Delta Spark at 32 characters): such a bound rules nothing out."""
    return isinstance(bound, str) and len(bound) >= STATS_PREFIX


def _parameters(plan: MergePlan) -> dict[str, str]:
    """The MERGE's ``operationParameters``, named as delta-rs names them."""
    matched = [
        {"actionType": kind, "predicate": clause.text}
        if clause is not None
        else {"actionType": kind}
        for kind, clause in (("delete", plan.delete), ("update", plan.update))
        if kind == "update" or clause is not None
    ]
    return {
        "mergePredicate": plan.predicate,
        "matchedPredicates": json.dumps(matched),
        "notMatchedPredicates": json.dumps([{"actionType": "insert"}] if plan.insert else []),
        "notMatchedBySourcePredicates": "[]",
    }
