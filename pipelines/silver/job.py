"""The silver job: new bronze rows -> silver tables and the quarantine, exactly once.

For every bronze table (one per topic) that feeds a configured object, :func:`run_silver`

1. finds how far each object's silver table got: the version of its Delta app transaction
   ``sfcdc.silver:<object>`` is the last bronze version it processed;
2. reads only the bronze rows appended after that version (``engine.read_appends``), as many
   bronze versions at a time as ``silver.max_rows_per_commit`` and
   ``silver.max_bytes_per_commit`` allow (sizes from bronze's history and landing's
   checkpoints), then the schema registry (read after bronze, so every schema id in those
   rows is in it);
3. hands each object's decoder the rows written with one of the object's schemas, so every
   row is decoded once (:mod:`pipelines.silver.decode`) even on a channel that carries
   several objects, and computes the object's silver rows and undecodable rows in one pass
   (:func:`~pipelines.silver.transforms.to_silver_and_quarantine`);
4. appends the silver rows to the object's table with the txn ``(sfcdc.silver:<object>,
   bronze version)``, after writing the range's undecodable rows to ``silver.sfcdc_quarantine``:
   an object's with the txn ``(sfcdc.silver.quarantine:<object>, bronze version)``, rows whose
   schema id no object can use with ``(sfcdc.silver.quarantine:<bronze table>, bronze
   version)``.

A retried run is a no-op: a table that recorded the txn version skips the write, and with
nothing new in bronze nothing is read or written at all. A run that died between two writes
resumes where each table stands: objects of one topic that stand at different bronze
versions are processed as separate groups. The quarantine is written before the silver
tables, so a run that dies in between finds it done when it decodes the range again; where an
earlier run quarantined a range that ended elsewhere, rows are matched on their bronze
coordinates (bronze table, batch id, batch seq) so none is added twice.

With the local engine a pass is collected once, as Arrow, and split there; with the spark
engine it is cached while its two parts are written. One silver run per lake at a time: runs
do not coordinate with each other.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.errors import ConfigError, LakeError
from ingest.schema import EventSchema, parse_event_schema
from pipelines.bronze.tables import CHECKPOINT_TABLE, SCHEMA_REGISTRY_TABLE, bronze_tables
from pipelines.engines import HistoryEntry, LakeEngine, TableRef, Txn
from pipelines.engines.arrow import (
    arrow_to_dataframe,
    dataframe_to_arrow,
    same_type,
    spark_schema_to_arrow,
)
from pipelines.silver.columns import SilverLayout, build_layout
from pipelines.silver.decode import (
    BRONZE_COLUMNS,
    FILES_SCHEMA,
    SPOOL_SCHEMA,
    DecodePlan,
    decode_function,
    decoded_schema,
    spool_files_function,
    spool_function,
)
from pipelines.silver.shape import shaped_schema
from pipelines.silver.transforms import (
    ERROR_COLUMNS,
    QUARANTINE_SCHEMA,
    Transform,
    quarantined_rows,
    silver_rows,
    to_silver_and_quarantine,
    undecodable_rows,
)
from pipelines.spec import Conf, ObjectSpec, parse_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "QUARANTINE_APP_PREFIX",
    "QUARANTINE_TABLE",
    "REGISTRY_TABLE",
    "SILVER_APP_PREFIX",
    "ObjectResult",
    "RegistryEntry",
    "SilverResult",
    "TopicResult",
    "app_id",
    "plan_chunks",
    "read_registry",
    "run_silver",
    "silver_layout",
    "version_sizes",
]

_log = logging.getLogger(__name__)

SILVER_APP_PREFIX = "sfcdc.silver:"
QUARANTINE_APP_PREFIX = "sfcdc.silver.quarantine:"
QUARANTINE_TABLE = TableRef("silver", "sfcdc_quarantine")
REGISTRY_TABLE = TableRef("bronze", SCHEMA_REGISTRY_TABLE)
_META_BRONZE_TABLE = "sfcdc.silver.bronze_table"
_META_VERSIONS = "sfcdc.silver.bronze_versions"
_META_MAX_BATCH = "sfcdc.silver.bronze_max_batch_id"
_QUARANTINE_KEYS = ("bronze_table", "bronze_batch_id", "bronze_batch_seq")
# What quarantined_rows reads of an undecodable row.
_FAILED_COLUMNS = (
    "_cdc_bronze_batch_id",
    "_cdc_bronze_batch_seq",
    "_cdc_replay_id",
    "_cdc_event_id",
    "_cdc_schema_id",
    *ERROR_COLUMNS,
)
# How the two Delta implementations name the rows a write added, in DESCRIBE HISTORY.
_ADDED_ROWS_METRICS = ("num_added_rows", "numOutputRows")

Data = Any  # a pyarrow.Table (local engine) or a DataFrame (spark engine)


def app_id(obj: ObjectSpec) -> str:
    """The Delta app id under which ``obj``'s silver table records the bronze version."""
    return f"{SILVER_APP_PREFIX}{obj.api_name}"


def _silver_table(obj: ObjectSpec) -> TableRef:
    return TableRef("silver", obj.tables.silver)


@dataclass(frozen=True)
class RegistryEntry:
    """One schema of the registry table, parsed (``schema`` is None when it does not parse,
    and ``problem`` says why)."""

    schema_id: str
    schema_json: str
    topic: str | None
    first_seen_at: datetime | None
    schema: EventSchema | None
    problem: str | None = None


@dataclass(frozen=True)
class ObjectResult:
    """What one run did for one object.

    ``events``: bronze rows written with the object's schemas in the range read (decoded,
    or quarantined when they could not be); ``rows``: silver rows written (events fanned out
    per record id); ``commits``: silver commits made. ``bronze_version`` is where the
    object's table stands afterwards.
    """

    object: str
    table: TableRef
    bronze_table: TableRef
    after_version: int | None
    bronze_version: int | None
    events: int = 0
    rows: int = 0
    commits: int = 0
    silver_version: int | None = None
    duration_s: float = 0.0

    @property
    def up_to_date(self) -> bool:
        """Nothing was new in bronze for this object."""
        return self.commits == 0 and self.after_version == self.bronze_version


@dataclass(frozen=True)
class TopicResult:
    """What one run did with one bronze table (for one group of objects at one version).

    ``other_entities`` counts rows of objects that have no silver table here (on a channel).
    """

    topic: str
    bronze_table: TableRef
    after_version: int | None
    bronze_version: int | None
    bronze_rows: int
    quarantined: int
    objects: tuple[ObjectResult, ...]
    other_entities: Mapping[str, int] = field(default_factory=dict)
    full_read: bool = False


@dataclass(frozen=True)
class SilverResult:
    """What :func:`run_silver` did, per bronze table group."""

    topics: tuple[TopicResult, ...]

    @property
    def objects(self) -> tuple[ObjectResult, ...]:
        return tuple(o for t in self.topics for o in t.objects)

    @property
    def quarantined(self) -> int:
        return sum(t.quarantined for t in self.topics)

    @property
    def rows(self) -> int:
        return sum(o.rows for o in self.objects)


# ------------------------------------------------------------------------- registry


def read_registry(engine: LakeEngine, table: TableRef = REGISTRY_TABLE) -> dict[str, RegistryEntry]:
    """The schema registry, one entry per schema id (the earliest row of an id wins: a
    landing that crashed may have registered a schema twice)."""
    if not engine.exists(table):
        return {}
    rows = engine.read_arrow(
        table, columns=["schema_id", "schema_json", "topic", "first_seen_at"]
    ).to_pylist()
    entries: dict[str, RegistryEntry] = {}
    ordered = sorted(
        rows,
        key=lambda r: (r["first_seen_at"] is None, r["first_seen_at"] or 0, r["schema_id"] or ""),
    )
    for row in ordered:
        sid, text = row["schema_id"], row["schema_json"]
        if not sid or sid in entries:
            continue
        schema: EventSchema | None = None
        problem: str | None = None
        try:
            schema = parse_event_schema(str(text), expected_id=sid)
        except Exception as exc:  # json, fastavro and our parser each raise their own
            problem = f"schema {sid} in {table} is not a valid event schema: {exc}"
        entries[sid] = RegistryEntry(
            sid, str(text), row["topic"], row["first_seen_at"], schema, problem
        )
    return entries


def _versions(obj: ObjectSpec, registry: Mapping[str, RegistryEntry]) -> list[EventSchema]:
    return [
        e.schema
        for e in registry.values()
        if e.schema is not None and e.schema.entity_name == obj.api_name
    ]


def silver_layout(obj: ObjectSpec, registry: Mapping[str, RegistryEntry]) -> SilverLayout:
    """``obj``'s silver columns from every registry schema of its entity (oldest first).

    With no schema yet the layout has only the metadata columns; fields arrive with the
    first schema (schema evolution adds them).
    """
    versions = _versions(obj, registry)
    change_events = obj.kind == "change_events"
    wrong = [s.schema_id for s in versions if s.is_change_event != change_events]
    if wrong:
        raise ConfigError(
            f"{obj.api_name} is configured as kind {obj.kind}, but its schemas "
            f"{', '.join(wrong)} are {'platform' if change_events else 'change'} events"
        )
    compounds = obj.silver.compound_fields
    if not versions:
        return SilverLayout(obj.api_name, change_events, (), compounds)
    try:
        return build_layout(obj.api_name, versions, compounds=compounds)
    except ValueError as exc:
        raise ConfigError(f"silver columns of {obj.api_name}: {exc}") from exc


# ----------------------------------------------------------------------------- run


def _select_objects(conf: Conf, names: Sequence[str] | None) -> list[ObjectSpec]:
    enabled = list(conf.enabled_objects())
    if not names:
        return enabled
    by_name = {o.api_name: o for o in conf.objects}
    problems = []
    for name in names:
        obj = by_name.get(name)
        if obj is None:
            known = ", ".join(o.api_name for o in conf.objects) or "none"
            problems.append(
                f"--objects: no object {name!r} in {conf.conf_dir} (configured: {known})"
            )
        elif not obj.enabled:
            problems.append(f"--objects: {name} is disabled (enabled: false in its file)")
    if problems:
        raise ConfigError("cannot select the objects to process", problems)
    wanted = set(names)
    return [o for o in enabled if o.api_name in wanted]


def run_silver(
    engine: LakeEngine,
    conf: Conf,
    *,
    objects: Sequence[str] | None = None,
    registry_table: TableRef = REGISTRY_TABLE,
    clock: Callable[[], float] = time.perf_counter,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> SilverResult:
    """Bring the silver tables of ``objects`` (default: every enabled object) up to date
    with bronze. See the module docstring for the protocol; ``clock`` times the work and
    ``now`` stamps quarantined rows."""
    selected = _select_objects(conf, objects)
    for obj in selected:
        if _silver_table(obj) == QUARANTINE_TABLE:
            raise ConfigError(
                f"{obj.api_name}: silver table name {QUARANTINE_TABLE.name!r} is reserved for "
                "the quarantine; set tables.silver to another name"
            )
    by_topic: dict[str, list[ObjectSpec]] = {}
    for obj in selected:
        by_topic.setdefault(obj.topic, []).append(obj)
    tables = bronze_tables(conf.topics(include_disabled=True))
    results: list[TopicResult] = []
    for topic, objs in sorted(by_topic.items()):
        bronze = tables.bronze(topic)
        if not engine.exists(bronze):
            _log.info("silver: %s (%s) has no bronze table yet; nothing to do", bronze, topic)
            continue
        groups: dict[int | None, list[ObjectSpec]] = {}
        for obj in objs:
            groups.setdefault(engine.txn_version(_silver_table(obj), app_id(obj)), []).append(obj)
        for after in sorted(groups, key=lambda v: -1 if v is None else v):
            group = _Group(
                engine,
                topic,
                bronze,
                groups[after],
                registry_table=registry_table,
                clock=clock,
                now=now,
            )
            results.append(group.run(after))
    return SilverResult(tuple(results))


def _added_rows(entry: HistoryEntry) -> int:
    for key in _ADDED_ROWS_METRICS:
        value = entry.metrics.get(key)
        if value is not None and str(value).isdigit():
            return int(value)
    return 0


def version_sizes(
    history: Iterable[HistoryEntry], checkpoints: Iterable[Mapping[str, Any]] = ()
) -> dict[int, tuple[int, int]]:
    """``(rows, payload bytes)`` each bronze version added: rows from the table's history,
    bytes from landing's checkpoint rows (``bronze_version``, ``event_count``,
    ``payload_bytes``); a version landing did not record has 0 bytes."""
    sizes = {entry.version: (_added_rows(entry), 0) for entry in history}
    for row in checkpoints:
        version = row.get("bronze_version")
        if version is None:
            continue
        rows, _ = sizes.get(version, (0, 0))
        sizes[version] = (
            max(rows, int(row.get("event_count") or 0)),
            int(row.get("payload_bytes") or 0),
        )
    return sizes


def plan_chunks(
    sizes: Mapping[int, tuple[int, int]],
    after: int | None,
    current: int,
    *,
    max_rows: int,
    max_bytes: int,
) -> list[int]:
    """The bronze versions to stop at, after ``after`` and up to ``current``, so that each
    step reads at most ``max_rows`` rows and ``max_bytes`` payload bytes (one version is
    never split; versions missing from ``sizes`` count as empty)."""
    if after is not None and after >= current:
        return []
    ends: list[int] = []
    rows = size = 0
    for version in range(0 if after is None else after + 1, current + 1):
        n, b = sizes.get(version, (0, 0))
        if (rows or size) and (rows + n > max_rows or size + b > max_bytes):
            ends.append(version - 1)
            rows = size = 0
        rows += n
        size += b
    ends.append(current)
    return ends


class _Parts:
    """Materialises a pass once and splits it into silver and quarantine rows: collected as
    Arrow with the local engine (which writes Arrow anyway), cached with the spark engine."""

    def __init__(self, engine: LakeEngine) -> None:
        self.engine = engine
        self.local = engine.name == "local"
        self.cached: list[DataFrame] = []
        self.spool: str | None = None

    def split(
        self,
        rows: DataFrame,
        plan: DecodePlan,
        quarantine: Transform,
        files: Sequence[str] | None = None,
    ) -> tuple[Data, Data | None]:
        """The silver rows of the bronze ``rows`` decoded by ``plan`` and their quarantine
        rows (``None`` when the local engine saw every row decode). ``files``: the local
        Parquet files ``rows`` were read from, when the local engine's tasks can read them
        themselves (:func:`_bronze_files`)."""
        if not self.local:
            frame = (
                rows.mapInArrow(decode_function(plan), decoded_schema(plan))  # type: ignore[arg-type]
                .transform(to_silver_and_quarantine(plan.layout))
                .persist()
            )
            self.cached.append(frame)
            return frame.transform(silver_rows), frame.transform(quarantine)
        table = self._spooled(rows, plan, files)
        errors = table.column("_cdc_error")
        if errors.null_count == table.num_rows:
            return table.drop_columns(list(ERROR_COLUMNS)), None
        good = pc.is_null(errors)
        silver = table.filter(good).drop_columns(list(ERROR_COLUMNS))
        failed = table.filter(pc.invert(good)).select(list(_FAILED_COLUMNS))
        # Few rows: shaped by the same transform as everywhere else.
        bad = arrow_to_dataframe(self.engine.spark, failed).transform(quarantine)
        return silver, dataframe_to_arrow(bad)

    def _spooled(self, rows: DataFrame, plan: DecodePlan, files: Sequence[str] | None) -> pa.Table:
        """Decoded and shaped by the workers into Arrow files (the local engine's workers
        share the driver's disk), read back here: Spark only lists the files, so the wide
        silver rows never become JVM rows. Given the bronze ``files``, the workers read
        them too, and the payloads never become JVM rows either."""
        if self.spool is None:
            self.spool = tempfile.mkdtemp(prefix="sfcdc-silver-")
        if files:
            spark = self.engine.spark
            # A task per file (up to a few per core): bronze files are one landing commit each.
            slices = min(len(files), 4 * spark.sparkContext.defaultParallelism)
            names = spark.sparkContext.parallelize([(f,) for f in files], slices)
            tasks = spark.createDataFrame(names, FILES_SCHEMA)
            function = spool_files_function(plan, self.spool)
            _log.debug(
                "silver: %s: the tasks read %d bronze files themselves",
                plan.layout.entity,
                len(files),
            )
        else:
            tasks = rows
            function = spool_function(plan, self.spool)
        listing = tasks.mapInArrow(function, SPOOL_SCHEMA).collect()  # type: ignore[arg-type]
        tables = [pa.ipc.open_file(pa.memory_map(row["path"])).read_all() for row in listing]
        if not tables:
            return shaped_schema(plan.layout).empty_table()
        return pa.concat_tables(tables)

    def rows(self, data: Data) -> Data:
        return dataframe_to_arrow(data) if self.local else data

    @staticmethod
    def count(data: Data) -> int:
        if isinstance(data, pa.Table):
            return int(data.num_rows)
        return int(data.count())

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()
        self.cached.clear()
        if self.spool is not None:
            shutil.rmtree(self.spool, ignore_errors=True)
            self.spool = None


@dataclass
class _Progress:
    events: int = 0
    rows: int = 0
    commits: int = 0
    version: int | None = None
    seconds: float = 0.0


class _Group:
    """The objects of one topic that stand at the same bronze version."""

    def __init__(
        self,
        engine: LakeEngine,
        topic: str,
        bronze: TableRef,
        objs: list[ObjectSpec],
        *,
        registry_table: TableRef,
        clock: Callable[[], float],
        now: Callable[[], datetime],
    ) -> None:
        self.engine = engine
        self.topic = topic
        self.bronze = bronze
        self.objs = objs
        self.registry_table = registry_table
        self.clock = clock
        self.at = now()
        self.topic_entity = parse_topic(topic).entity
        self.max_rows = min(o.silver.max_rows_per_commit for o in objs)
        self.max_bytes = min(o.silver.max_bytes_per_commit for o in objs)
        self.progress = {o.api_name: _Progress() for o in objs}
        self.others: dict[str, int] = {}
        self.quarantined = 0
        self.bronze_rows = 0
        self.full_read = False
        self._registry_version: int | None = None
        self._registry: dict[str, RegistryEntry] = {}

    def run(self, after: int | None) -> TopicResult:
        started = self.clock()
        current = self.engine.version(self.bronze)
        assert current is not None
        if after is not None and after > current:
            names = ", ".join(o.api_name for o in self.objs)
            raise LakeError(
                f"the silver tables of {names} processed {self.bronze} up to version {after}, "
                f"but it is at version {current}: was it dropped and re-created? Drop those "
                "silver tables to rebuild them from the new bronze table"
            )
        start = after
        first = 0 if after is None else after + 1
        history = self.engine.history(self.bronze, limit=max(current - first + 1, 1))
        sizes = version_sizes(history, self._checkpoints(first))
        chunks = plan_chunks(
            sizes, after, current, max_rows=self.max_rows, max_bytes=self.max_bytes
        )
        for end in chunks:
            self._chunk(after, end)
            after = end
        if start == after:
            _log.info("silver: %s has nothing new after version %s", self.bronze, start)
        else:
            _log.info(
                "silver: %s versions %s..%s done: %d bronze rows, %d quarantined (%.1f s)",
                self.bronze,
                first,
                after,
                self.bronze_rows,
                self.quarantined,
                self.clock() - started,
            )
        objects = []
        for obj in self.objs:
            p = self.progress[obj.api_name]
            table = _silver_table(obj)
            version = p.version if p.version is not None else self.engine.version(table)
            objects.append(
                ObjectResult(
                    obj.api_name,
                    table,
                    self.bronze,
                    start,
                    after,
                    p.events,
                    p.rows,
                    p.commits,
                    version,
                    p.seconds,
                )
            )
        return TopicResult(
            self.topic,
            self.bronze,
            start,
            after,
            self.bronze_rows,
            self.quarantined,
            tuple(objects),
            dict(self.others),
            self.full_read,
        )

    def _checkpoints(self, first: int) -> list[dict[str, Any]]:
        """Landing's checkpoint rows of this topic from bronze version ``first`` on (their
        payload bytes size the steps); none when landing keeps no checkpoints here."""
        table = TableRef("bronze", CHECKPOINT_TABLE)
        if not self.engine.exists(table):
            return []
        rows = self.engine.read_arrow(
            table,
            columns=["bronze_version", "event_count", "payload_bytes"],
            where=[("topic", "=", self.topic), ("bronze_version", ">=", first)],
        )
        return list(rows.to_pylist())

    def registry(self) -> dict[str, RegistryEntry]:
        version = self.engine.version(self.registry_table)
        if version != self._registry_version or not self._registry:
            self._registry = read_registry(self.engine, self.registry_table)
            self._registry_version = version
        return self._registry

    def _chunk(self, after: int | None, end: int) -> None:
        from pipelines.silver.small import process_chunk

        # A small step of the local engine is decoded in the driver, without a Spark job.
        if process_chunk(self, after, end):
            return
        changes = self.engine.read_appends(self.bronze, after_version=after, until_version=end)
        if changes.start_version is None:
            return
        df = changes.df
        if changes.full_read and after is not None:
            self.full_read = True
            df = _unprocessed(self.engine, df, self.bronze, self.objs, after)
        started = self.clock()
        files = None if changes.full_read else self._bronze_files(df)
        if files is not None:
            stats = _schema_counts(_read_files(files, _COUNTED))
        else:
            stats = _schema_counts(dataframe_to_arrow(df.select(*_COUNTED.names)))
        total = sum(n for n, _ in stats.values())
        _log.debug(
            "silver: %s versions %s..%s: %d rows counted per schema id in %.2f s",
            self.bronze,
            changes.start_version,
            end,
            total,
            self.clock() - started,
        )
        if total == 0:
            return
        self.bronze_rows += total
        registry = self.registry()
        max_batch = max((b for _, b in stats.values() if b is not None), default=None)
        metadata = {
            _META_BRONZE_TABLE: self.bronze.name,
            _META_VERSIONS: f"{changes.start_version}-{end}",
        }
        if max_batch is not None:
            metadata[_META_MAX_BATCH] = str(max_batch)
        parts = _Parts(self.engine)
        try:
            passes = []
            decodable: set[str] = set()
            for obj in self.objs:
                ids = [s.schema_id for s in _versions(obj, registry)]
                decodable.update(ids)
                events = sum(stats[sid][0] for sid in ids if sid in stats)
                passes.append(
                    self._decode(
                        obj,
                        df,
                        registry=registry,
                        ids=ids,
                        events=events,
                        parts=parts,
                        files=files,
                    )
                )
            undecodable = self._undecodable(df, stats, registry, decodable, parts)
            self._commit_step(parts, passes, undecodable, after=after, end=end, metadata=metadata)
        finally:
            parts.release()

    def _commit_step(
        self,
        parts: _Parts,
        decoded: Sequence[tuple[ObjectSpec, SilverLayout, Data, Data | None, int]],
        undecodable: Data | None,
        *,
        after: int | None,
        end: int,
        metadata: Mapping[str, str],
    ) -> None:
        """Commit a decoded step: quarantine first, then each object's silver rows."""
        # The quarantine first: a run that dies before the silver writes decodes this
        # range again and finds the quarantine already holding it.
        for obj, _, _, bad, _ in decoded:
            if bad is not None:
                self._quarantine(
                    parts, bad, app_for=obj.api_name, after=after, end=end, metadata=metadata
                )
        if undecodable is not None:
            self._quarantine(
                parts,
                undecodable,
                app_for=self.bronze.name,
                after=after,
                end=end,
                metadata=metadata,
            )
        for obj, layout, data, _, events in decoded:
            self._write(obj, layout, data, events=events, end=end, metadata=metadata)

    def _bronze_files(self, df: DataFrame) -> list[str] | None:
        """The local Parquet files behind the bronze rows ``df`` (a plain Parquet read of the
        files the range added, which the local engine makes from the Delta log), or None
        where the rows must go through Spark: another engine, a table read through
        delta-rs, files that are not local."""
        if self.engine.name != "local":
            return None
        uris = list(df.inputFiles())
        if not uris:
            return None
        paths = [_local_path(u) for u in uris]
        if any(p is None for p in paths):
            return None
        return [p for p in paths if p is not None]

    def _undecodable(
        self,
        df: DataFrame,
        stats: Mapping[str, tuple[int, Any]],
        registry: Mapping[str, RegistryEntry],
        decodable: set[str],
        parts: _Parts,
    ) -> Data | None:
        """Rows no configured object decodes: counted when they belong to another object on a
        channel, quarantined otherwise (unknown or unusable schema id, another object's
        schema on a single-object topic)."""
        split = self._split_undecodable(stats, registry, decodable)
        if split is None:
            return None
        skipped, reasons = split
        rest = df.select(*BRONZE_COLUMNS).transform(
            undecodable_rows(
                decodable=skipped,
                reasons=reasons,
                registry=str(self.registry_table),
                bronze_table=self.bronze.name,
                topic=self.topic,
                at=self.at,
            )
        )
        return parts.rows(rest)

    def _split_undecodable(
        self,
        stats: Mapping[str, tuple[int, Any]],
        registry: Mapping[str, RegistryEntry],
        decodable: set[str],
    ) -> tuple[set[str], dict[str, tuple[str, str]]] | None:
        """The schema ids to leave out of the quarantine (decoded, or another object's on a
        channel, whose rows are counted in ``others``) and the quarantine reasons of the
        rest; None when no row needs quarantining."""
        reasons = self._reasons(registry, decodable)
        skipped = set(decodable)
        for sid, (n, _) in stats.items():
            entry = registry.get(sid) if sid else None
            if sid in skipped or entry is None or entry.schema is None or sid in reasons:
                continue
            skipped.add(sid)
            entity = entry.schema.entity_name
            self.others[entity] = self.others.get(entity, 0) + n
        if all(sid in skipped and sid not in reasons for sid in stats):
            return None
        return skipped, reasons

    def _reasons(
        self, registry: Mapping[str, RegistryEntry], decodable: set[str]
    ) -> dict[str, tuple[str, str]]:
        reasons: dict[str, tuple[str, str]] = {}
        for sid, entry in registry.items():
            if entry.problem is not None:
                reasons[sid] = ("invalid_schema", entry.problem)
            elif (
                entry.schema is not None
                and sid not in decodable
                and self.topic_entity is not None
                and entry.schema.entity_name != self.topic_entity
            ):
                reasons[sid] = (
                    "wrong_entity",
                    f"schema {sid} is a {entry.schema.entity_name} schema, but {self.topic} "
                    f"carries {self.topic_entity} events",
                )
        return reasons

    def _decode(
        self,
        obj: ObjectSpec,
        df: DataFrame,
        *,
        registry: Mapping[str, RegistryEntry],
        ids: list[str],
        events: int,
        parts: _Parts,
        files: Sequence[str] | None = None,
    ) -> tuple[ObjectSpec, SilverLayout, Data, Data | None, int]:
        """One pass over the object's rows: its silver rows and its undecodable rows."""
        from pyspark.sql import functions as F

        started = self.clock()
        layout = silver_layout(obj, registry)
        _check_types(self.engine, _silver_table(obj), layout)
        if not events:
            # Nothing for this object in the range: an empty commit still records the bronze
            # version (and creates the table the first time), without a Spark job.
            empty = spark_schema_to_arrow(layout.silver_schema()).empty_table()
            return obj, layout, empty, None, 0
        plan = DecodePlan(
            layout=layout,
            schemas={sid: registry[sid].schema_json for sid in ids},
            registry=str(self.registry_table),
        )
        rows = df.where(F.col("schema_id").isin(ids)).select(*BRONZE_COLUMNS)
        quarantine = quarantined_rows(
            bronze_table=self.bronze.name, topic=self.topic, at=self.at, entity=obj.api_name
        )
        planned = self.clock()
        data, bad = parts.split(rows, plan, quarantine, files)
        done = self.clock()
        _log.debug(
            "silver: %s decoded in %.2f s (plan %.2f s)",
            obj.api_name,
            done - started,
            planned - started,
        )
        self.progress[obj.api_name].seconds += done - started
        return obj, layout, data, bad, events

    def _write(
        self,
        obj: ObjectSpec,
        layout: SilverLayout,
        data: Data,
        *,
        events: int,
        end: int,
        metadata: Mapping[str, str],
    ) -> None:
        started = self.clock()
        table = _silver_table(obj)
        if not self.engine.exists(table):
            # Created from the layout, so every column is nullable whatever the first rows
            # hold (Spark marks literal and coalesced columns NOT NULL).
            self.engine.ensure_table(table, layout.silver_schema())
        result = self.engine.append(table, data, txn=Txn(app_id(obj), end), metadata=metadata)
        _log.debug("silver: %s written in %.2f s", table, self.clock() - started)
        p = self.progress[obj.api_name]
        p.events += events
        p.rows += result.rows
        p.commits += 0 if result.skipped else 1
        p.version = result.version
        p.seconds += self.clock() - started
        _log.info(
            "silver: %s <- %s up to version %d: %d events, %d rows, version %s%s",
            table,
            self.bronze,
            end,
            events,
            result.rows,
            result.version,
            " (already committed)" if result.skipped else "",
        )

    def _quarantine(
        self,
        parts: _Parts,
        rows: Data,
        *,
        app_for: str,
        after: int | None,
        end: int,
        metadata: Mapping[str, str],
    ) -> None:
        """Append quarantine rows of the bronze range ``(after, end]`` under the txn
        ``sfcdc.silver.quarantine:<app_for>`` (an object's undecodable rows, or the bronze
        table's rows no object decodes)."""
        engine = self.engine
        app = f"{QUARANTINE_APP_PREFIX}{app_for}"
        done = engine.txn_version(QUARANTINE_TABLE, app)
        if done is not None and done >= end:
            _log.info("silver: quarantine %s up to version %d already committed", app, end)
            return
        if parts.count(rows) == 0:
            return
        if done is not None and (after is None or done > after):
            # An earlier run quarantined part of this range (it stopped at another version).
            rows = _without_quarantined(engine, rows, self.bronze)
        if not engine.exists(QUARANTINE_TABLE):
            engine.ensure_table(QUARANTINE_TABLE, QUARANTINE_SCHEMA)
        result = engine.append(QUARANTINE_TABLE, rows, txn=Txn(app, end), metadata=metadata)
        self.quarantined += result.rows
        _log.warning(
            "silver: %d rows of %s could not be decoded (%s); quarantined in %s (version %s)",
            result.rows,
            self.bronze,
            app_for,
            QUARANTINE_TABLE,
            result.version,
        )


# The bronze columns counted per schema id.
_COUNTED = pa.schema([("schema_id", pa.string()), ("batch_id", pa.int64())])


def _local_path(uri: str) -> str | None:
    """A local file's path from what Spark lists (``file:/...`` or a bare path)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    if parsed.scheme == "" and uri.startswith("/"):
        return uri
    return None


def _read_files(files: Sequence[str], schema: pa.Schema) -> pa.Table:
    """``schema``'s columns of Parquet files, in ``schema``'s types."""
    tables = [pq.read_table(f, columns=schema.names).cast(schema) for f in files]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _schema_counts(rows: pa.Table) -> dict[str, tuple[int, int | None]]:
    """Rows and highest batch id per schema id. Two narrow columns collected and counted in
    Arrow: a single Spark stage, where a groupBy would shuffle."""
    grouped = rows.group_by("schema_id").aggregate([([], "count_all"), ("batch_id", "max")])
    return {
        sid: (int(n), None if top is None else int(top))
        for sid, n, top in zip(
            grouped.column("schema_id").to_pylist(),
            grouped.column("count_all").to_pylist(),
            grouped.column("batch_id_max").to_pylist(),
            strict=True,
        )
    }


def _without_quarantined(engine: LakeEngine, rows: Data, bronze: TableRef) -> Data:
    from pyspark.sql import functions as F

    existing = (
        engine.read(QUARANTINE_TABLE)
        .where(F.col("bronze_table") == F.lit(bronze.name))
        .select(*_QUARANTINE_KEYS)
    )
    if isinstance(rows, pa.Table):
        seen = {tuple(r[k] for k in _QUARANTINE_KEYS) for r in existing.collect()}
        keys = zip(*(rows.column(k).to_pylist() for k in _QUARANTINE_KEYS), strict=True)
        return rows.filter(pa.array([k not in seen for k in keys], pa.bool_()))
    return rows.join(existing, on=list(_QUARANTINE_KEYS), how="left_anti").select(
        *QUARANTINE_SCHEMA.names
    )


def _unprocessed(
    engine: LakeEngine, df: DataFrame, bronze: TableRef, objs: Iterable[ObjectSpec], after: int
) -> DataFrame:
    """Bronze could not be read incrementally (its log was cleaned up or rows were rewritten)
    and ``df`` is the whole table: keep the rows of batches after the last one processed,
    which every silver commit records."""
    from pyspark.sql import functions as F

    processed: list[int] = []
    for obj in objs:
        for entry in engine.history(_silver_table(obj), limit=100):
            if entry.txn is not None and entry.txn.app_id == app_id(obj):
                value = entry.metadata.get(_META_MAX_BATCH)
                if value is not None and value.isdigit():
                    processed.append(int(value))
                break
    if not processed:
        raise LakeError(
            f"{bronze} cannot be read incrementally after version {after} and the silver "
            "commits do not say which bronze batches they processed; rebuild the silver "
            f"tables of {', '.join(o.api_name for o in objs)} (drop them and run again)"
        )
    last = min(processed)
    _log.warning(
        "silver: reading all of %s and keeping the batches after %d, the last processed",
        bronze,
        last,
    )
    return df.where(F.col("batch_id") > F.lit(last))


def _check_types(engine: LakeEngine, table: TableRef, layout: SilverLayout) -> None:
    current = engine.schema(table)
    if current is None:
        return
    have = {f.name.lower(): f for f in current.fields}
    for f in layout.silver_schema().fields:
        old = have.get(f.name.lower())
        if old is None or same_type(old.dataType, f.dataType) or _grows(old.dataType, f.dataType):
            continue
        raise LakeError(
            f"{table}: column {f.name!r} is {old.dataType.simpleString()} but the schema "
            f"versions of {layout.entity} now make it {f.dataType.simpleString()} (a field "
            "changed type in Salesforce); rebuild the silver table (drop it and run again) so "
            "the column takes a type that holds every version's values"
        )


def _grows(old: Any, new: Any) -> bool:
    """Whether ``new`` only adds struct fields to ``old`` (appends evolve the table)."""
    from pyspark.sql import types as T

    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        theirs = {f.name.lower(): f for f in new.fields}
        return all(
            f.name.lower() in theirs
            and (
                same_type(f.dataType, theirs[f.name.lower()].dataType)
                or _grows(f.dataType, theirs[f.name.lower()].dataType)
            )
            for f in old.fields
        )
    return False
