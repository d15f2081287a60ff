"""Maintenance of sfcdc's tables that never removes what a consumer has yet to read.

Silver reads bronze by version, from the version after the one its Delta app transaction
records; gold reads silver the same way. Compaction rewrites small files and VACUUM later
deletes the files it replaced; log cleanup deletes old commit files. A consumer that is behind
still needs the files added, and the commit files written, at and after the oldest version it
has not read. So for each table the retention used is the larger of the configured one
(``maintenance`` in ``pipeline.yml``) and the age of that version's commit (plus a margin for
the time maintenance itself takes):

- bronze of a topic: the oldest of ``processed + 1`` over the silver tables of its objects;
- silver of an object: ``applied + 1`` of its gold table;
- other tables (gold, sfcdc's own bookkeeping tables) have no consumers: the configured values.

A consumer that has read everything, or has never read (its first read is the current
snapshot), needs no old files. Its next read still starts at the version after the last one
it read, which may be one maintenance itself commits (compaction, VACUUM), so the log is never
cleaned past ``processed + 1`` of any consumer that has read (:func:`log_floor`). Time travel
to versions older than the retention used is gone by design. Log cleanup deletes commit files
older than the retention and than a complete log checkpoint (the local engine:
:func:`pipelines.engines.deltalog.expire_log`; the spark engine: Delta itself, after
maintenance sets the table's ``delta.logRetentionDuration``); the engines do the Delta work
(:meth:`~pipelines.engines.LakeEngine.maintain`), VACUUM through the library's own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from ingest.errors import ConfigError
from pipelines.engines.base import LakeEngine, MaintenanceResult, TableRef
from pipelines.gold import job as gold_job
from pipelines.silver import job as silver_job
from pipelines.silver.cometd_job import silver_app_id
from pipelines.spec.conf import Conf
from pipelines.spec.models import MaintenanceSpec

__all__ = [
    "SAFETY_MARGIN_HOURS",
    "Consumer",
    "Need",
    "Retention",
    "TableMaintenance",
    "consumers_of",
    "describe",
    "log_floor",
    "maintain_tables",
    "oldest_needed",
    "retention_for",
    "tables_to_maintain",
    "tombstone_hours",
]

_log = logging.getLogger(__name__)

# Added to the age of the oldest needed commit: maintenance computes the retention, then
# compacts, checkpoints and vacuums, all while time passes.
SAFETY_MARGIN_HOURS = 0.25
_BOOKKEEPING_PREFIX = "sfcdc_"
# Reading a consumer's commit beside a busy writer: how often, and how many more entries than
# the last read showed (commits that may land during the next read).
_HISTORY_ATTEMPTS = 5
_HISTORY_SLACK = 32


@dataclass(frozen=True)
class Consumer:
    """A table that reads another by version; ``app_id``'s Delta app transaction on it
    records the last version it read."""

    table: TableRef
    app_id: str

    def __str__(self) -> str:
        return f"{self.table} ({self.app_id})"


@dataclass(frozen=True)
class Need:
    """``consumer`` has yet to read ``version`` (committed at ``committed_at``) and later."""

    consumer: Consumer
    version: int
    committed_at: datetime | None = None


@dataclass(frozen=True)
class Retention:
    """Hours VACUUM and log cleanup keep on one table, and why (``need``: a consumer's)."""

    vacuum_hours: float
    log_hours: float
    need: Need | None = None
    consumers: int = 0
    log_from: int | None = None

    @property
    def reason(self) -> str:
        if self.need is None:
            if not self.consumers:
                return "configured (no consumers)"
            return "configured (no consumer is behind)"
        need = self.need
        when = "" if need.committed_at is None else f", committed {_iso(need.committed_at)}"
        return f"consumer {need.consumer} needs version {need.version}{when}"


@dataclass(frozen=True)
class TableMaintenance:
    """What maintenance did to one table (``result`` is ``None`` on a dry run)."""

    table: TableRef
    retention: Retention
    result: MaintenanceResult | None


def oldest_needed(
    latest: int | None, processed: Mapping[Consumer, int | None]
) -> tuple[Consumer, int] | None:
    """The oldest version of a table whose latest version is ``latest`` that a consumer still
    has to read, given the last version each consumer read (``None``: never read; its first
    read is a snapshot of the then-current version, which needs nothing old)."""
    if latest is None:
        return None
    needs = [
        (version + 1, consumer)
        for consumer, version in processed.items()
        if version is not None and version < latest
    ]
    if not needs:
        return None
    version, consumer = min(needs, key=lambda n: n[0])
    return consumer, version


def log_floor(processed: Mapping[Consumer, int | None]) -> int | None:
    """The oldest version whose log entry must stay: where the next read of a consumer that
    has read starts (``processed + 1``, which may not exist yet)."""
    starts = [version + 1 for version in processed.values() if version is not None]
    return min(starts) if starts else None


def retention_for(
    spec: MaintenanceSpec,
    need: Need | None,
    *,
    now: datetime,
    consumers: int = 0,
    log_from: int | None = None,
) -> Retention:
    """The retention to use on a table: the configured hours, or more when ``need``'s
    commit is older (its age plus :data:`SAFETY_MARGIN_HOURS`). A need whose commit time is
    unknown keeps everything (infinite hours)."""
    vacuum, log = spec.vacuum_retention_hours, spec.log_retention_hours
    if need is not None:
        if need.committed_at is None:
            age = math.inf
        else:
            age = max(0.0, (now - need.committed_at).total_seconds() / 3600)
            age += SAFETY_MARGIN_HOURS
        vacuum, log = max(vacuum, age), max(log, age)
    return Retention(vacuum, log, need, consumers, log_from)


def consumers_of(conf: Conf) -> dict[TableRef, list[Consumer]]:
    """Which tables read each table by version, over every enabled object and channel
    (whether or not a maintenance run selects it: objects share bronze tables)."""
    found: dict[TableRef, list[Consumer]] = {}
    for obj in conf.enabled_objects():
        bronze = TableRef("bronze", obj.tables.bronze)
        silver = TableRef("silver", obj.tables.silver)
        found.setdefault(bronze, []).append(Consumer(silver, silver_job.app_id(obj)))
        if obj.kind == "change_events":
            consumer = Consumer(gold_job.gold_table(obj), gold_job.app_id(obj))
            found.setdefault(silver, []).append(consumer)
    for spec in conf.enabled_streams():
        bronze = TableRef("bronze", spec.tables.bronze)
        silver = TableRef("silver", spec.tables.silver)
        found.setdefault(bronze, []).append(Consumer(silver, silver_app_id(spec)))
        if spec.has_gold:
            gold = TableRef("gold", spec.tables.gold)
            app = f"{gold_job.GOLD_APP_PREFIX}{spec.key}"
            found.setdefault(silver, []).append(Consumer(gold, app))
    return found


def tables_to_maintain(
    engine: LakeEngine, conf: Conf, objects: Sequence[str] | None = None
) -> list[TableRef]:
    """The existing tables of the selected objects and channels (default: every enabled one;
    a channel is named by its ``streaming:<channel>`` key), then sfcdc's bookkeeping tables."""
    wanted = set(objects or ())
    known = {o.api_name for o in conf.objects} | {s.key for s in conf.streams}
    unknown = sorted(wanted - known)
    if unknown:
        raise ConfigError(
            "cannot select the objects to maintain",
            [
                f"--objects: no object {name!r} in {conf.conf_dir} (configured: "
                f"{', '.join(sorted(known))}; names are case-sensitive)"
                for name in unknown
            ],
        )
    tables: list[TableRef] = []
    for obj in conf.enabled_objects():
        if wanted and obj.api_name not in wanted:
            continue
        tables += [TableRef("bronze", obj.tables.bronze), TableRef("silver", obj.tables.silver)]
        if obj.kind == "change_events":
            tables += [
                gold_job.gold_table(obj),
                gold_job.tombstone_table(obj),
                gold_job.history_table(obj),
            ]
    for spec in conf.enabled_streams():
        if wanted and spec.key not in wanted:
            continue
        tables += [TableRef("bronze", spec.tables.bronze), TableRef("silver", spec.tables.silver)]
        if spec.has_gold:
            tables.append(TableRef("gold", spec.tables.gold))
    tables += [t for t in engine.tables() if t.name.startswith(_BOOKKEEPING_PREFIX)]
    unique = list(dict.fromkeys(tables))
    return [t for t in unique if engine.exists(t)]


def _processed(engine: LakeEngine, consumers: Iterable[Consumer]) -> dict[Consumer, int | None]:
    return {
        c: engine.txn_version(c.table, c.app_id) if engine.exists(c.table) else None
        for c in consumers
    }


def _need(
    engine: LakeEngine, table: TableRef, processed: Mapping[Consumer, int | None]
) -> Need | None:
    latest = engine.version(table)
    oldest = oldest_needed(latest, processed)
    if oldest is None or latest is None:
        return None
    consumer, version = oldest
    committed_at = _commit_time(engine, table, version, latest)
    if committed_at is None:
        _log.warning(
            "%s: the commit of version %d, which %s still needs, is not in the log; keeping "
            "every file and log entry",
            table,
            version,
            consumer,
        )
    return Need(consumer, version, committed_at)


def _commit_time(engine: LakeEngine, table: TableRef, version: int, latest: int) -> datetime | None:
    """When ``version`` of ``table`` was committed (``None``: its log entry is gone). The
    history's newest entries are read, as many as lead back to it; a writer that commits
    meanwhile (bronze's landing, several times a second) pushes it out of them, so they are
    read again, reaching further back, until they hold it or start before it."""
    limit = latest - version + 1
    for _ in range(_HISTORY_ATTEMPTS):
        entries = engine.history(table, limit=limit)
        found = next((e.timestamp for e in entries if e.version == version), None)
        if found is not None or not entries or min(e.version for e in entries) <= version:
            return found
        limit = max(e.version for e in entries) - version + 1 + _HISTORY_SLACK
    return None


def maintain_tables(
    engine: LakeEngine,
    conf: Conf,
    *,
    objects: Sequence[str] | None = None,
    dry_run: bool = False,
    clock: Callable[[], datetime] | None = None,
    tables: Sequence[TableRef] | None = None,
) -> list[TableMaintenance]:
    """Compact, checkpoint, clean the log of and VACUUM every table :func:`tables_to_maintain`
    selects (or only ``tables``), with the retention :func:`retention_for` chooses
    (``dry_run``: only choose)."""
    spec = conf.pipeline.maintenance
    now = clock or (lambda: datetime.now(timezone.utc))
    consumers = consumers_of(conf)
    done = []
    chosen = tables_to_maintain(engine, conf, objects) if tables is None else tables
    for table in chosen:
        processed = _processed(engine, consumers.get(table, []))
        retention = retention_for(
            spec,
            _need(engine, table, processed),
            now=now(),
            consumers=len(processed),
            log_from=log_floor(processed),
        )
        result = None
        if not dry_run:
            keep_all = math.isinf(retention.vacuum_hours)
            result = engine.maintain(
                table,
                compact=spec.compact,
                checkpoint=not keep_all,
                vacuum_hours=None if keep_all else retention.vacuum_hours,
                log_hours=None if keep_all else retention.log_hours,
                log_from_version=retention.log_from,
                tombstone_hours=None
                if keep_all
                else tombstone_hours(spec.vacuum_retention_hours, retention.vacuum_hours),
            )
        done.append(TableMaintenance(table, retention, result))
    return done


def tombstone_hours(configured: float, used: float) -> float:
    """How long a table's checkpoints keep the tombstones of removed files, for a VACUUM
    retention of ``configured`` hours that this round extends to ``used`` for a consumer that
    is behind: the configured one, doubled as often as it takes to cover ``used``, so that it
    changes (a commit) only now and then while a consumer catches up."""
    base = max(configured, 1 / 60)
    hours = base
    while hours < used:
        hours *= 2
    return hours


def describe(item: TableMaintenance) -> str:
    """One line for ``sfcdc maintain``: what was done to the table, the retention and why."""
    r, result = item.retention, item.result
    kept = "" if r.log_from is None else f" from version {r.log_from}"
    hours = (
        f"retention {_hours(r.vacuum_hours)} (files), {_hours(r.log_hours)} (log{kept}): {r.reason}"
    )
    if result is None:
        return f"{item.table}: dry run, would use {hours}"
    return (
        f"{item.table}: compacted {result.files_removed} files into {result.files_added}, "
        f"vacuumed {_count(result.vacuumed_files)} files, removed "
        f"{_count(result.log_entries_removed)} log entries; {hours}"
    )


def _hours(value: float) -> str:
    return (
        "all" if math.isinf(value) else f"{value:g} h" if value == int(value) else f"{value:.2f} h"
    )


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat(timespec="seconds")
