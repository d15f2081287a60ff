"""What ``sfcdc status`` reports on a topic and an object (:class:`TopicStatus`,
:class:`ObjectStatus`, :class:`Status`), and how an object's status is read and judged from its
tables' :class:`Progress` and the commits table (:func:`read_progress`, :func:`object_status`).
Both the Pub/Sub objects (:mod:`pipelines.commands.status`) and the Streaming API channels
(:mod:`pipelines.commands.cometd_status`) are reported with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipelines.engines.base import LakeEngine, TableRef
from pipelines.gold.resync import OBJECT_LEVEL_REASONS
from pipelines.ops.health import State, Verdict, judge, layer_lags, layer_rate
from pipelines.ops.summary import Summary
from pipelines.spec.sections import HealthSpec

__all__ = [
    "LayerHealth",
    "ObjectStatus",
    "Progress",
    "Status",
    "TopicStatus",
    "iso",
    "object_status",
    "read_progress",
]


@dataclass(frozen=True)
class TopicStatus:
    """A topic's bronze table and its last checkpoint (``None`` fields: nothing landed)."""

    topic: str
    bronze_table: str
    bronze_version: int | None
    batch_id: int | None
    replay_id: str | None
    committed_at: str | None
    kind: str | None
    events_landed: int
    replay_gaps: int
    quarantined: int
    # The topic's subscription failed for good after its last checkpoint (FAIL): why, when.
    failed: str | None = None
    failed_at: str | None = None


@dataclass(frozen=True)
class LayerHealth:
    """One table of an object: how far behind Salesforce it is (``None``: not known yet) and
    the events per second its commits applied over the rate window."""

    layer: str
    table: str
    behind_seconds: float | None
    newest_commit_at: str | None
    last_commit_at: str | None
    events_per_second: float | None


@dataclass(frozen=True)
class ObjectStatus:
    """An object's silver and gold progress. ``bronze_lag``: bronze versions silver has not
    processed; ``silver_lag``: silver versions gold has not applied (``None`` without gold).
    ``state`` (OK, WARN, FAIL) and its ``reasons``; ``behind_seconds``: the lag of the
    object's last table; ``layers``: each table's lag and rate; ``last_error``: the latest
    recorded failure of any of its layers (``last_error_at`` when)."""

    object: str
    topic: str
    silver_table: str
    silver_version: int | None
    bronze_processed: int | None
    bronze_lag: int | None
    gold_table: str | None
    gold_version: int | None
    silver_applied: int | None
    silver_lag: int | None
    resync_records: int
    resync_full_object: int
    failed: str | None = None  # its topic's subscription failed for good (FAIL)
    quarantined: int = 0
    state: State = "WARN"
    reasons: tuple[str, ...] = ()
    behind_seconds: float | None = None
    events_per_second: float | None = None
    layers: tuple[LayerHealth, ...] = ()
    last_error: str | None = None
    last_error_at: str | None = None
    # The latest `sfcdc reconcile` of the object (None: never reconciled): when, and the drift
    # it found and repaired.
    reconciled_at: str | None = None
    drift_missing: int | None = None
    drift_extra: int | None = None
    drift_stale: int | None = None
    drift_repaired: int | None = None


@dataclass(frozen=True)
class Status:
    """Every enabled topic and object of a configuration, as of ``now``."""

    lake: str
    topics: tuple[TopicStatus, ...]
    objects: tuple[ObjectStatus, ...]
    now: str = ""
    # The commits table holds records (lag and rates can be told).
    commits_table: bool = False

    @property
    def state(self) -> State:
        """The worst state of any object."""
        return Verdict.worst([o.state for o in self.objects])


def _lag(current: int | None, processed: int | None) -> int | None:
    if current is None:
        return None
    return max(0, current - (processed if processed is not None else 0))


@dataclass(frozen=True)
class Progress:
    """How far each table of an object is and how far its consumer read it: bronze, silver
    (``processed``: the last bronze version silver read) and gold (``applied``: the last
    silver version gold read; ``gold`` is ``None`` for an object without gold)."""

    bronze: TableRef
    bronze_version: int | None
    silver: TableRef
    silver_version: int | None
    processed: int | None
    gold: TableRef | None = None
    gold_version: int | None = None
    applied: int | None = None

    @property
    def bronze_lag(self) -> int | None:
        return _lag(self.bronze_version, self.processed)

    @property
    def silver_lag(self) -> int | None:
        return _lag(self.silver_version, self.applied) if self.gold is not None else None


def read_progress(
    engine: LakeEngine,
    bronze: TableRef,
    silver: tuple[TableRef, str],
    gold: tuple[TableRef, str] | None,
) -> Progress:
    """The :class:`Progress` of an object whose silver and gold are ``(table, app id of the
    Delta transaction that records the version it read)``."""

    def read(table: TableRef, app_id: str) -> tuple[int | None, int | None]:
        version = engine.version(table)
        return version, engine.txn_version(table, app_id) if version is not None else None

    silver_version, processed = read(*silver)
    gold_version, applied = read(*gold) if gold is not None else (None, None)
    return Progress(
        bronze,
        engine.version(bronze),
        silver[0],
        silver_version,
        processed,
        gold[0] if gold is not None else None,
        gold_version,
        applied,
    )


def object_status(
    summary: Summary,
    progress: Progress,
    *,
    name: str,
    topic: str,
    now: datetime,
    window: float,
    spec: HealthSpec,
    open_resync: Sequence[Mapping[str, Any]],
    quarantined: int,
    failed: str | None = None,
) -> ObjectStatus:
    """The :class:`ObjectStatus` of the object ``name`` (its rows in the re-sync table are
    those whose ``object`` is ``name``), judged against ``spec`` with the commits table's
    ``summary``. ``failed``: why its source cannot be subscribed (FAIL)."""
    mine = [r for r in open_resync if r["object"] == name]
    records = len({r["record_id"] for r in mine if r["record_id"]})
    whole = sum(1 for r in mine if r["record_id"] is None or r["reason"] in OBJECT_LEVEL_REASONS)
    chain = [("bronze", str(progress.bronze)), ("silver", str(progress.silver))]
    caught_up = [True, progress.bronze_lag == 0]
    if progress.gold is not None:
        chain.append(("gold", str(progress.gold)))
        # No silver table although silver has read all of bronze (a topic without events yet):
        # gold has nothing to apply, so it is as current as silver.
        empty = progress.silver_version is None and progress.bronze_lag == 0
        caught_up.append(progress.silver_lag == 0 or empty)
    health = _health(
        summary,
        now=now,
        window=window,
        chain=chain,
        caught_up=caught_up,
        spec=spec,
        topic=topic,
        obj=name,
        quarantined=quarantined,
        resync_records=records,
        resync_whole=whole,
        failed=failed,
    )
    return ObjectStatus(
        object=name,
        topic=topic,
        silver_table=str(progress.silver),
        silver_version=progress.silver_version,
        bronze_processed=progress.processed,
        bronze_lag=progress.bronze_lag,
        gold_table=str(progress.gold) if progress.gold is not None else None,
        gold_version=progress.gold_version,
        silver_applied=progress.applied,
        silver_lag=progress.silver_lag,
        resync_records=records,
        resync_full_object=whole,
        quarantined=quarantined,
        **health,
    )


def _health(
    summary: Summary,
    *,
    now: datetime,
    window: float,
    chain: Sequence[tuple[str, str]],
    caught_up: Sequence[bool],
    spec: HealthSpec,
    topic: str,
    obj: str,
    quarantined: int,
    resync_records: int,
    resync_whole: int,
    failed: str | None = None,
) -> dict[str, Any]:
    """The health fields of an :class:`ObjectStatus` whose tables are ``chain`` (``(layer,
    table)``, bronze first; ``caught_up`` as :func:`~pipelines.ops.health.layer_lags` takes
    it), judged against ``spec``."""
    lags = layer_lags(summary, now=now, tables=chain, caught_up=caught_up)
    verdict, error = judge(
        summary,
        lags,
        spec,
        topic=topic,
        obj=obj,
        quarantined=quarantined,
        resync_records=resync_records,
        resync_whole=resync_whole,
    )
    state, reasons = verdict.state, verdict.reasons
    if failed is not None:
        # The object's source cannot be subscribed: nothing new can reach its tables.
        state, reasons = "FAIL", (f"topic subscription failed: {failed}", *reasons)
    layers = tuple(
        LayerHealth(
            layer=lag.layer,
            table=lag.table,
            behind_seconds=_round(lag.behind_seconds),
            newest_commit_at=iso(lag.watermark),
            last_commit_at=iso(lag.last_commit_at),
            events_per_second=_round(layer_rate(summary, lag.layer, lag.table, window)),
        )
        for lag in lags
    )
    return {
        "failed": failed,
        "state": state,
        "reasons": reasons,
        "behind_seconds": layers[-1].behind_seconds if layers else None,
        "events_per_second": layers[-1].events_per_second if layers else None,
        "layers": layers,
        "last_error": error.message if error else None,
        "last_error_at": iso(error.at) if error else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def iso(value: datetime | None) -> str | None:
    """``value`` in ISO 8601 to the millisecond (``None`` stays ``None``)."""
    return None if value is None else value.isoformat(timespec="milliseconds")
