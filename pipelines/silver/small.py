"""Small batches without Spark: the local engine's silver step decoded in the driver.

A continuous run's passes see a few seconds of events at a time: a few hundred to a few
thousand bronze rows per topic. Through Spark such a step costs a job (plan, Python worker,
spool) of about two seconds whatever its size, per object; in the driver it costs
milliseconds. So with the local engine, when a step's new bronze rows number at most
:data:`SMALL_BATCH_ROWS`, :func:`process_chunk`

- reads the Parquet files the step's bronze commits added (:func:`read_appended`, straight
  from the Delta log, the same files ``engine.read_appends`` hands Spark);
- decodes and shapes them with the functions the Spark workers run
  (:func:`~pipelines.silver.decode.decode_batches`, :func:`~pipelines.silver.shape.shape_batch`);
- writes silver and quarantine rows with the same transactions and metadata as the Spark
  path, through the same code in :mod:`pipelines.silver.job`.

Rows that must be quarantined are shaped by the same Spark transforms as on the Spark path
(:func:`~pipelines.silver.transforms.quarantined_rows`,
:func:`~pipelines.silver.transforms.undecodable_rows`): they are rare, and one definition of
the quarantine row is worth a Spark job when they occur. Anything the Arrow read cannot honour
(the log was cleaned up, a commit rewrote rows, deletion vectors, partitions, column mapping,
files removed by compaction and vacuumed) goes the Spark way. A table's first step reads
every commit from version 0: with appends only, their rows are the snapshot's rows.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.engines import LakeEngine, LocalEngine, TableRef
from pipelines.engines.arrow import arrow_to_dataframe, dataframe_to_arrow, spark_schema_to_arrow
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, decode_batches
from pipelines.silver.shape import shape_batch, shaped_schema
from pipelines.silver.transforms import (
    ERROR_COLUMNS,
    quarantined_rows,
    undecodable_rows,
)

if TYPE_CHECKING:
    from pipelines.silver.job import RegistryEntry, _Group
    from pipelines.spec import ObjectSpec

__all__ = ["SMALL_BATCH_ROWS", "appended_files", "process_chunk", "read_appended"]

_log = logging.getLogger(__name__)

# Above this many new bronze rows a step goes through Spark: its workers decode in parallel,
# and the driver's memory holds a step of this size comfortably.
SMALL_BATCH_ROWS = 50_000
_COLUMN_MAPPING = "delta.columnMapping"


def appended_files(engine: LakeEngine, table: TableRef, first: int, last: int) -> list[str] | None:
    """The data files commits ``first..last`` of ``table`` added (with ``dataChange``), or
    ``None`` when a plain Parquet read of them would not give the rows those commits
    appended: not the local engine, a commit missing from the log, a commit that removed
    rows, deletion vectors or partition values."""
    if not isinstance(engine, LocalEngine) or first > last:
        return None
    root = engine.path(table)
    files: list[str] = []
    for version in range(first, last + 1):
        try:
            text = (root / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            add, remove = action.get("add"), action.get("remove")
            if add and add.get("dataChange", True):
                if add.get("deletionVector") or add.get("partitionValues"):
                    return None
                files.append(_data_file(root, add["path"]))
            if remove and remove.get("dataChange", True):
                return None
    return files


def _data_file(root: Path, path: str) -> str:
    # Paths in the Delta log are URIs: percent-encoded, relative to the table unless absolute.
    if "://" in path:
        parsed = urllib.parse.urlparse(path)
        return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else path
    decoded = urllib.parse.unquote(path)
    return decoded if decoded.startswith("/") else str(root / decoded)


def read_appended(
    engine: LakeEngine,
    table: TableRef,
    *,
    after_version: int | None,
    until_version: int,
    max_rows: int,
    columns: Sequence[str] | None = None,
) -> pa.Table | None:
    """The rows commits ``after_version + 1 .. until_version`` (``after_version`` ``None``: from
    version 0) appended to ``table``, typed as the table's current schema (columns a file
    predates read as null), read with pyarrow; ``None`` when they number more than
    ``max_rows`` or cannot be read that way (see :func:`appended_files`, tables with column
    mapping, files no longer on disk)."""
    first = 0 if after_version is None else after_version + 1
    files = appended_files(engine, table, first, until_version)
    if files is None:
        return None
    spark_schema = engine.schema(table)
    if spark_schema is None or any(
        _COLUMN_MAPPING in json.dumps(f.metadata) for f in spark_schema.fields
    ):
        return None
    schema = spark_schema_to_arrow(spark_schema)
    names = list(schema.names if columns is None else columns)
    try:
        opened = [pq.ParquetFile(f) for f in files]
    except FileNotFoundError:
        # Compacted away and vacuumed: only the snapshot's files hold those rows now.
        return None
    if sum(p.metadata.num_rows for p in opened) > max_rows:
        return None
    pieces = []
    for parquet in opened:
        have = set(parquet.schema_arrow.names)
        part = parquet.read(columns=[n for n in names if n in have])
        pieces.append(
            pa.Table.from_arrays(
                [
                    part.column(n).cast(schema.field(n).type)
                    if n in have
                    else pa.nulls(part.num_rows, schema.field(n).type)
                    for n in names
                ],
                names=names,
            )
        )
    target = pa.schema([schema.field(n) for n in names])
    return pa.concat_tables(pieces).cast(target) if pieces else target.empty_table()


def process_chunk(group: _Group, after: int | None, end: int) -> bool:
    """Bring ``group``'s objects from bronze version ``after`` to ``end`` without Spark, as
    ``_Group._chunk`` does with it; ``False`` (nothing done) when the step is not small or
    cannot be read from the Delta log."""
    if group.engine.name != "local":
        return False
    rows = read_appended(
        group.engine,
        group.bronze,
        after_version=after,
        until_version=end,
        max_rows=SMALL_BATCH_ROWS,
        columns=BRONZE_COLUMNS,
    )
    if rows is None:
        return False
    _Step(group, rows).run(after, end)
    return True


class _Step:
    """One small step of a group: ``_Group._chunk`` with Arrow in place of DataFrames."""

    def __init__(self, group: _Group, rows: pa.Table) -> None:
        self.group = group
        self.rows = rows

    def run(self, after: int | None, end: int) -> None:
        from pipelines.silver import job

        g = self.group
        stats = job._schema_counts(self.rows.select(["schema_id", "batch_id"]))
        total = sum(n for n, _ in stats.values())
        if total == 0:
            return
        g.bronze_rows += total
        registry = g.registry()
        max_batch = max((b for _, b in stats.values() if b is not None), default=None)
        metadata = {
            job._META_BRONZE_TABLE: g.bronze.name,
            job._META_VERSIONS: f"{0 if after is None else after + 1}-{end}",
        }
        if max_batch is not None:
            metadata[job._META_MAX_BATCH] = str(max_batch)
        # Only its row count is asked of it here (quarantine rows are Arrow tables).
        parts = job._Parts(g.engine)
        decoded = []
        decodable: set[str] = set()
        for obj in g.objs:
            ids = [s.schema_id for s in job._versions(obj, registry)]
            decodable.update(ids)
            events = sum(stats[sid][0] for sid in ids if sid in stats)
            decoded.append(self._decode(obj, registry, ids, events))
        undecodable = self._undecodable(stats, registry, decodable)
        g._commit_step(parts, decoded, undecodable, after=after, end=end, metadata=metadata)

    def _decode(
        self,
        obj: ObjectSpec,
        registry: Mapping[str, RegistryEntry],
        ids: list[str],
        events: int,
    ) -> tuple[ObjectSpec, Any, pa.Table, pa.Table | None, int]:
        from pipelines.silver import job

        g = self.group
        started = g.clock()
        layout = job.silver_layout(obj, registry)
        job._check_types(g.engine, job._silver_table(obj), layout)
        if not events:
            empty = spark_schema_to_arrow(layout.silver_schema()).empty_table()
            return obj, layout, empty, None, 0
        plan = DecodePlan(
            layout=layout,
            schemas={sid: registry[sid].schema_json for sid in ids},
            registry=str(g.registry_table),
        )
        mine = self.rows.filter(pc.is_in(self.rows.column("schema_id"), pa.array(ids)))
        target = shaped_schema(layout)
        shaped = [
            shape_batch(layout, batch, target)
            for batch in decode_batches(plan, iter(mine.to_batches()))
        ]
        table = pa.Table.from_batches(shaped, schema=target)
        errors = table.column("_cdc_error")
        bad = None
        if errors.null_count == table.num_rows:
            silver = table.drop_columns(list(ERROR_COLUMNS))
        else:
            good = pc.is_null(errors)
            silver = table.filter(good).drop_columns(list(ERROR_COLUMNS))
            failed = table.filter(pc.invert(good)).select(list(job._FAILED_COLUMNS))
            quarantine = quarantined_rows(
                bronze_table=g.bronze.name, topic=g.topic, at=g.at, entity=obj.api_name
            )
            bad = dataframe_to_arrow(
                arrow_to_dataframe(g.engine.spark, failed).transform(quarantine)
            )
        seconds = g.clock() - started
        g.progress[obj.api_name].seconds += seconds
        _log.debug("silver: %s decoded in the driver in %.3f s", obj.api_name, seconds)
        return obj, layout, silver, bad, events

    def _undecodable(
        self,
        stats: Mapping[str, tuple[int, Any]],
        registry: Mapping[str, RegistryEntry],
        decodable: set[str],
    ) -> pa.Table | None:
        """As ``_Group._undecodable``: other objects' rows on a channel are counted, the rest
        quarantined (shaped by Spark, only when there are any)."""
        g = self.group
        split = g._split_undecodable(stats, registry, decodable)
        if split is None:
            return None
        skipped, reasons = split
        rest = arrow_to_dataframe(g.engine.spark, self.rows).transform(
            undecodable_rows(
                decodable=skipped,
                reasons=reasons,
                registry=str(g.registry_table),
                bronze_table=g.bronze.name,
                topic=g.topic,
                at=g.at,
            )
        )
        return dataframe_to_arrow(rest)
