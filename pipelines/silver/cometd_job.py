"""The silver job of the Streaming API source: new bronze messages of each channel -> the
channel's silver table and the quarantine, exactly once.

For every enabled Streaming API channel, :func:`run_cometd_silver`

1. finds how far the silver table got: the version of its Delta app transaction
   ``sfcdc.silver:streaming:<channel>`` is the last bronze version it processed;
2. reads only the bronze rows appended after it (``engine.read_appends``), as many bronze
   versions at a time as ``silver.max_rows_per_commit`` and ``max_bytes_per_commit`` allow;
3. runs :class:`~pipelines.silver.cometd.CometdRows` over them (the channel's plan is
   built from ``bronze.sfcdc_describes``: no call to Salesforce) and takes its output apart
   into silver rows and quarantine rows;
4. appends the quarantine rows to ``silver.sfcdc_quarantine`` with the txn
   ``(sfcdc.silver.quarantine:streaming:<channel>, bronze version)``, then the silver rows with
   ``(sfcdc.silver:streaming:<channel>, bronze version)``.

A run that dies between the two writes finds the quarantine ahead of silver: it first
processes exactly the range the quarantine recorded (whose quarantine write is then skipped),
so no row is quarantined twice. A retried run with nothing new reads nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ingest.errors import ConfigError
from pipelines.bookkeeping import ensure_bookkeeping
from pipelines.bronze.cometd_setup import DescribeEntry, read_describes
from pipelines.bronze.tables import CHECKPOINT_TABLE
from pipelines.chunking import plan_chunks, version_sizes
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import LakeEngine, TableRef, Txn
from pipelines.ops.newest import newest_time
from pipelines.ops.table import CommitRecord
from pipelines.silver.cometd import STREAM_BRONZE_COLUMNS, CometdRows, StreamPlan, stream_plan
from pipelines.silver.quarantine import QUARANTINE_SCHEMA, AfterBatch, QuarantinePart, SilverPart
from pipelines.silver.tables import BOOKKEEPING, QUARANTINE_TABLE
from pipelines.silver.topic_run import maintain_on_schedule
from pipelines.spec.cometd import CometdObjectSpec
from pipelines.spec.conf import Conf

__all__ = [
    "CometdSilverResult",
    "StreamResult",
    "cometd_plan",
    "quarantine_app_id",
    "run_cometd_silver",
    "select_streams",
    "silver_app_id",
]

_log = logging.getLogger(__name__)

_META_MAX_BATCH = "sfcdc.silver.bronze_max_batch_id"
_META_VERSIONS = "sfcdc.silver.bronze_versions"
_BRONZE_FIELDS = STREAM_BRONZE_COLUMNS
# The silver column the commits table's lag is measured from (the notification's createdDate).
_CREATED = "_cdc_created_date"


def silver_app_id(spec: CometdObjectSpec) -> str:
    """The app id under which a channel's silver table records the bronze version."""
    return f"sfcdc.silver:{spec.key}"


def quarantine_app_id(spec: CometdObjectSpec) -> str:
    """The app id of a channel's quarantine writes."""
    return f"sfcdc.silver.quarantine:{spec.key}"


@dataclass(frozen=True)
class StreamResult:
    """What one run did for one channel: bronze rows read, silver rows written, rows
    quarantined, commits, and the bronze version the silver table stands at."""

    stream: str
    table: TableRef
    bronze_table: TableRef
    after_version: int | None
    bronze_version: int | None
    bronze_rows: int = 0
    rows: int = 0
    quarantined: int = 0
    commits: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class CometdSilverResult:
    """What :func:`run_cometd_silver` did, per channel."""

    streams: tuple[StreamResult, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.streams)

    @property
    def quarantined(self) -> int:
        return sum(s.quarantined for s in self.streams)


def select_streams(conf: Conf, names: Sequence[str] | None) -> tuple[CometdObjectSpec, ...]:
    """The enabled channels, or those whose channel (``/topic/X``) or key is in ``names``."""
    enabled = conf.enabled_streams()
    if not names:
        return enabled
    known = {s.channel: s for s in conf.streams} | {s.key: s for s in conf.streams}
    missing = [n for n in names if n not in known]
    if missing:
        listed = ", ".join(s.channel for s in conf.streams) or "none"
        raise ConfigError(
            f"no Streaming API channel {missing} in {conf.conf_dir} (configured: {listed})"
        )
    wanted = {known[n].key for n in names}
    return tuple(s for s in enabled if s.key in wanted)


def cometd_plan(spec: CometdObjectSpec, entries: Sequence[DescribeEntry]) -> StreamPlan:
    """The decoding plan of ``spec``'s channel from its registry rows."""
    return stream_plan(
        key=spec.key,
        channel=spec.channel,
        kind=spec.channel_kind,
        entity=spec.api_name,
        describes=[(e.describe, e.query) for e in entries],
        compounds=spec.silver.compound_fields,
    )


def run_cometd_silver(
    engine: LakeEngine,
    conf: Conf,
    *,
    streams: Sequence[str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    on_commit: Callable[[CommitRecord], object] | None = None,
) -> CometdSilverResult:
    """Bring the silver tables of the Streaming API channels up to date with bronze (see the
    module docstring); ``streams`` selects channels by name (default: every enabled one).
    ``on_commit`` receives a commit record per silver commit (the commits table)."""
    chosen = select_streams(conf, streams)
    ensure_bookkeeping(engine, BOOKKEEPING, logger=_log)
    registry: Mapping[str, list[DescribeEntry]] | None = None
    at = now()
    results = []
    for spec in chosen:
        bronze = TableRef("bronze", spec.tables.bronze)
        if not engine.exists(bronze):
            _log.info("silver: %s has no bronze table %s yet", spec.channel, bronze)
            continue
        if registry is None:
            registry = read_describes(engine)
        plan = cometd_plan(spec, registry.get(spec.key, []))
        run = _Run(
            engine,
            spec,
            bronze,
            plan,
            at=at,
            clock=clock,
            on_commit=on_commit,
            maintain_every=conf.pipeline.ingest.maintain_every_commits,
        )
        results.append(run.run())
    return CometdSilverResult(tuple(results))


class _Run:
    def __init__(
        self,
        engine: LakeEngine,
        spec: CometdObjectSpec,
        bronze: TableRef,
        plan: StreamPlan,
        *,
        at: datetime,
        clock: Callable[[], float],
        on_commit: Callable[[CommitRecord], object] | None = None,
        maintain_every: int = 0,
    ) -> None:
        self.engine = engine
        self.on_commit = on_commit
        self.maintain_every = maintain_every
        self.spec = spec
        self.bronze = bronze
        self.silver = TableRef("silver", spec.tables.silver)
        self.plan = plan
        self.at = at
        self.clock = clock
        self.bronze_rows = self.rows = self.quarantined = self.commits = 0

    def run(self) -> StreamResult:
        engine, spec = self.engine, self.spec
        started = self.clock()
        after = engine.txn_version(self.silver, silver_app_id(spec))
        first_after = after
        current = engine.version(self.bronze)
        assert current is not None
        ends: list[int] = []
        if engine.exists(QUARANTINE_TABLE):
            ahead = engine.txn_version(QUARANTINE_TABLE, quarantine_app_id(spec))
            if ahead is not None and (after is None or ahead > after):
                # A run stopped between the quarantine and the silver write: redo exactly
                # that range first (its quarantine write is then a no-op).
                ends.append(ahead)
        start = ends[-1] if ends else after
        if start is None or start < current:
            ends += plan_chunks(
                self._sizes(start, current),
                start,
                current,
                max_rows=spec.silver.max_rows_per_commit,
                max_bytes=spec.silver.max_bytes_per_commit,
            )
        for end in ends:
            self._chunk(after, end)
            after = end
        if not self.commits:
            _log.info("silver: %s is up to date with %s v%s", self.silver, self.bronze, current)
        return StreamResult(
            stream=spec.key,
            table=self.silver,
            bronze_table=self.bronze,
            after_version=first_after,
            bronze_version=engine.txn_version(self.silver, silver_app_id(spec)),
            bronze_rows=self.bronze_rows,
            rows=self.rows,
            quarantined=self.quarantined,
            commits=self.commits,
            seconds=self.clock() - started,
        )

    def _sizes(self, after: int | None, current: int) -> dict[int, tuple[int, int]]:
        first = 0 if after is None else after + 1
        history = self.engine.history(self.bronze, limit=max(current - first + 1, 1))
        checkpoints: list[Mapping[str, object]] = []
        table = TableRef("bronze", CHECKPOINT_TABLE)
        if self.engine.exists(table):
            checkpoints = self.engine.read_arrow(
                table,
                columns=["bronze_version", "event_count", "payload_bytes"],
                where=[("topic", "=", self.spec.key), ("bronze_version", ">=", first)],
            ).to_pylist()
        return version_sizes(history, checkpoints)

    def _chunk(self, after: int | None, end: int) -> None:
        engine, spec, plan = self.engine, self.spec, self.plan
        changes = engine.read_appends(
            self.bronze, after_version=after, until_version=end, columns=list(_BRONZE_FIELDS)
        )
        if changes.start_version is None:
            return
        rows = changes.rows
        if changes.full_read and after is not None:
            last = self._last_batch()
            if last is not None:
                bronze_schema = engine.schema(self.bronze)
                assert bronze_schema is not None
                rows = engine.map_batches(rows, AfterBatch(last), bronze_schema)
        rows = engine.persist(rows)
        held = [rows]
        try:
            count = engine.count(rows)
            if count == 0:
                return
            self.bronze_rows += count
            decoded = engine.persist(
                engine.map_batches(rows, CometdRows(plan), plan.decoded_schema())
            )
            held.append(decoded)
            bad = engine.persist(
                engine.map_batches(
                    decoded,
                    QuarantinePart(
                        bronze_table=self.bronze.name,
                        topic=spec.key,
                        at=self.at,
                        entity=spec.api_name or spec.channel,
                    ),
                    QUARANTINE_SCHEMA,
                )
            )
            held.append(bad)
            quarantined = engine.count(bad)
            if quarantined:
                engine.ensure_table(QUARANTINE_TABLE, QUARANTINE_SCHEMA)
                engine.append(
                    QUARANTINE_TABLE,
                    bad,
                    txn=Txn(quarantine_app_id(spec), end),
                    metadata={"sfcdc.silver.stream": spec.key},
                )
            good = engine.map_batches(decoded, SilverPart(plan.names), plan.schema)
            engine.ensure_table(self.silver, plan.schema)
            max_batch = self._max_batch(rows)
            newest = newest_time(engine, good, _CREATED) if self.on_commit is not None else None
            result = engine.append(
                self.silver,
                good,
                txn=Txn(silver_app_id(spec), end),
                metadata={
                    _META_VERSIONS: f"{changes.start_version}-{end}",
                    **({_META_MAX_BATCH: str(max_batch)} if max_batch is not None else {}),
                },
            )
            written = result.rows if not result.skipped else 0
            if not result.skipped:
                maintain_on_schedule(engine, self.silver, result.version, self.maintain_every)
            if self.on_commit is not None and not result.skipped:
                self.on_commit(
                    CommitRecord(
                        layer="silver",
                        kind="commit",
                        visible_at=datetime.now(timezone.utc),
                        topic=spec.key,
                        object=spec.key,
                        table=str(self.silver),
                        version=result.version,
                        events=count,
                        rows=result.rows,
                        quarantined=quarantined,
                        newest_commit_at=newest,
                    )
                )
            self.rows += written
            self.quarantined += quarantined
            self.commits += 1
            _log.info(
                "silver: %s <- %s versions %s..%s: %d messages, %d rows, %d quarantined",
                self.silver,
                self.bronze,
                changes.start_version,
                end,
                count,
                written,
                quarantined,
            )
        finally:
            for kept in held:
                engine.release(kept)

    def _max_batch(self, rows: Any) -> int | None:
        table = self.engine.to_arrow(self.engine.map_batches(rows, _MaxBatch(), _MAX_BATCH_SCHEMA))
        values = [v for v in table.column("max_batch").to_pylist() if v is not None]
        return max(values) if values else None

    def _last_batch(self) -> int | None:
        for entry in self.engine.history(self.silver, limit=100):
            if entry.txn is not None and entry.txn.app_id == silver_app_id(self.spec):
                value = entry.metadata.get(_META_MAX_BATCH)
                return int(value) if value is not None and value.isdigit() else None
        return None


class _MaxBatch:
    """Bronze rows -> the highest batch id of each Arrow batch."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = spark_schema_to_arrow(_MAX_BATCH_SCHEMA)
        for batch in batches:
            value = pc.max(batch.column("batch_id")).as_py() if batch.num_rows else None
            yield pa.RecordBatch.from_pylist([{"max_batch": value}], schema=schema)


_MAX_BATCH_SCHEMA = T.StructType([T.StructField("max_batch", T.LongType())])
