"""The silver job: new bronze rows -> silver tables and the quarantine, exactly once.

For every bronze table (one per topic) that feeds a configured object, :func:`run_silver`
(and for each polled object, :func:`pipelines.polled.silver.run_polled_silver`)

1. finds how far each object's silver table got: the version of its Delta app transaction
   ``sfcdc.silver:<object>`` is the last bronze version it processed;
2. reads only the bronze rows appended after that version (``engine.read_appends``), as many
   bronze versions at a time as ``silver.max_rows_per_commit`` and
   ``silver.max_bytes_per_commit`` allow (sizes from bronze's history and landing's
   checkpoints), then the schema registry (read after bronze, so every schema id in those
   rows is in it);
3. runs each object's batch function (:class:`~pipelines.silver.decode.SilverRows`) over
   the rows written with one of the object's schemas, so every row is decoded once even on
   a channel that carries several objects, and takes its output apart into silver rows and
   quarantine rows (:mod:`pipelines.silver.quarantine`);
4. appends the silver rows to the object's table with the txn ``(sfcdc.silver:<object>,
   bronze version)``, after writing the range's undecodable rows to ``silver.sfcdc_quarantine``:
   an object's with the txn ``(sfcdc.silver.quarantine:<object>, bronze version)``, rows whose
   schema id no object can use with ``(sfcdc.silver.quarantine:<bronze table>, bronze
   version)``.

Each silver commit is reported to ``on_commit`` (the commits table, :mod:`pipelines.ops`) with
the newest Salesforce commit time among its rows, and a run over a backlog reports its
progress (:mod:`pipelines.progress`) in bronze events.

A retried run is a no-op: a table that recorded the txn version skips the write, and with
nothing new in bronze nothing is read or written at all. A run that died between two writes
resumes where each table stands: objects of one topic that stand at different bronze
versions are processed as separate groups. The quarantine is written before the silver
tables, so a run that dies in between finds it done when it decodes the range again; where an
earlier run quarantined a range that ended elsewhere, rows are matched on their bronze
coordinates (bronze table, batch id, batch seq) so none is added twice.

The engine runs the batch functions where its rows are (this process for the local engine,
Spark executors for the spark engine) and keeps a step's decoded rows while their parts are
written. One silver run per lake at a time: runs do not coordinate with each other.

:class:`~pipelines.silver.topic_run.TopicRun` runs one group's steps and writes,
:mod:`pipelines.silver.registry` reads the schema registry and builds an object's silver
columns, and :mod:`pipelines.silver.tables` names the tables and app ids; this module keeps
:func:`run_silver` and re-exports their public names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

from ingest.errors import ConfigError
from pipelines.bookkeeping import ensure_bookkeeping
from pipelines.bronze.tables import bronze_tables
from pipelines.engines.base import LakeEngine, TableRef
from pipelines.ops.table import CommitRecord
from pipelines.polled.silver import run_polled_silver
from pipelines.silver.registry import (
    REGISTRY_TABLE,
    RegistryEntry,
    read_registry,
    read_schema_failures,
    silver_layout,
)
from pipelines.silver.tables import (
    BOOKKEEPING,
    QUARANTINE_APP_PREFIX,
    QUARANTINE_TABLE,
    SILVER_APP_PREFIX,
    app_id,
    silver_table,
)
from pipelines.silver.topic_run import ObjectResult, TopicResult, TopicRun, maintain_on_schedule
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec

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
    "maintain_on_schedule",
    "read_registry",
    "read_schema_failures",
    "run_silver",
    "silver_layout",
]

_log = logging.getLogger(__name__)


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
    on_commit: Callable[[CommitRecord], object] | None = None,
) -> SilverResult:
    """Bring the silver tables of ``objects`` (default: every enabled object) up to date
    with bronze. See the module docstring for the protocol; ``clock`` times the work and
    ``now`` stamps quarantined rows and commit records; ``on_commit`` receives a record of
    every silver commit."""
    selected = _select_objects(conf, objects)
    for obj in selected:
        if silver_table(obj) == QUARANTINE_TABLE:
            raise ConfigError(
                f"{obj.api_name}: silver table name {QUARANTINE_TABLE.name!r} is reserved for "
                "the quarantine; set tables.silver to another name"
            )
    # The bookkeeping tables are created (on a new lake) while the first reads run: the first
    # write waits for them, and a failure to create one is raised there, before any write.
    with ThreadPoolExecutor(1, thread_name_prefix="sfcdc-silver-tables") as ahead:
        bookkeeping = ahead.submit(ensure_bookkeeping, engine, BOOKKEEPING, logger=_log)
        results = _run_topics(
            engine,
            conf,
            selected,
            registry_table=registry_table,
            clock=clock,
            now=now,
            on_commit=on_commit,
            before_write=bookkeeping.result,
        )
        bookkeeping.result()
    for obj in selected:
        if obj.kind == "polled":
            polled = run_polled_silver(
                engine,
                obj,
                maintain_every=conf.pipeline.ingest.maintain_every_commits,
                now=now,
                clock=clock,
                on_commit=on_commit,
            )
            if polled is not None:
                results.append(polled)
    return SilverResult(tuple(results))


def _run_topics(
    engine: LakeEngine,
    conf: Conf,
    selected: Sequence[ObjectSpec],
    *,
    registry_table: TableRef,
    clock: Callable[[], float],
    now: Callable[[], datetime],
    on_commit: Callable[[CommitRecord], object] | None,
    before_write: Callable[[], object],
) -> list[TopicResult]:
    """The runs of the selected objects that read a topic's bronze table, by topic and by the
    bronze version their silver tables stand at."""
    by_topic: dict[str, list[ObjectSpec]] = {}
    for obj in selected:
        if obj.kind != "polled":
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
            groups.setdefault(engine.txn_version(silver_table(obj), app_id(obj)), []).append(obj)
        for after in sorted(groups, key=lambda v: -1 if v is None else v):
            group = TopicRun(
                engine,
                topic,
                bronze,
                groups[after],
                registry_table=registry_table,
                clock=clock,
                now=now,
                on_commit=on_commit,
                maintain_every=conf.pipeline.ingest.maintain_every_commits,
                before_write=before_write,
            )
            results.append(group.run(after))
    return results
