"""``sfcdc status``: where every topic and object stands, read from the Delta logs.

::

    sfcdc status [--conf conf/] [--json] [--check]

Per object first: how many seconds it is behind Salesforce (now minus the newest commit
timestamp its last table has applied, per layer), the events/s its tables applied over the last
``ops.rate_window_seconds``, quarantine and re-sync counts, the last recorded error and when,
and OK / WARN / FAIL against the object's ``health`` thresholds (read from the commits table,
:mod:`pipelines.ops`). ``--check`` exits 1 when any object is FAIL (for cron and CI).

Per topic: the last bronze checkpoint (replay id, batch, commit time, kind), the events
landed, replay gaps and quarantined rows. Per object: the bronze version silver has
processed and the silver version gold has applied (from their Delta app transactions), so
the lag of each layer in table versions, and the open re-sync work (records, whole object).
With the local engine no JVM is started: the Delta logs are read with delta-rs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.bronze import CHECKPOINT_TABLE
from pipelines.bronze.tables import TOPIC_FAILURES_TABLE
from pipelines.commands.cometd_report import stream_status
from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.commands.empty_lake import empty_lake_note
from pipelines.engines import LakeEngine, TableRef
from pipelines.gold import job as gold_job
from pipelines.gold.resync import OBJECT_LEVEL_REASONS, RESYNC_TABLE
from pipelines.gold.tables import RECONCILE_TABLE
from pipelines.ops.health import State, Verdict, judge, layer_lags, layer_rate
from pipelines.ops.summary import Summary, read_summary
from pipelines.session import engine_for
from pipelines.silver import job as silver_job
from pipelines.spec import Conf, HealthSpec

__all__ = [
    "LayerHealth",
    "ObjectStatus",
    "Progress",
    "Status",
    "TopicStatus",
    "format_status",
    "object_status",
    "read_progress",
    "read_status",
    "register",
]


def register(subparsers: Any) -> None:
    """Add ``status`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "status",
        help="checkpoints, lag, quarantine and re-sync counts per topic and object",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_conf_options(parser)
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (text)"
    )
    parser.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="print JSON for scripts (same as --format json)",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 when any object is FAIL"
    )
    parser.set_defaults(handler=run)


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


def _read(engine: LakeEngine, table: TableRef, columns: list[str]) -> pa.Table | None:
    if not engine.exists(table):
        return None
    return engine.read_arrow(table, columns=columns)


def _lag(current: int | None, processed: int | None) -> int | None:
    if current is None:
        return None
    return max(0, current - (processed if processed is not None else 0))


def read_status(engine: LakeEngine, conf: Conf, *, now: datetime | None = None) -> Status:
    """The status of ``conf``'s enabled topics and objects in ``engine``'s lake at ``now``
    (default: the current time)."""
    now = now or datetime.now(timezone.utc)
    window = conf.pipeline.ops.rate_window_seconds
    summary = read_summary(engine, since=now - timedelta(seconds=window))
    checkpoints = _read(
        engine,
        TableRef("bronze", CHECKPOINT_TABLE),
        ["topic", "batch_id", "kind", "replay_id", "event_count", "committed_at"],
    )
    quarantine = _open_quarantine(engine)
    failures = _read(
        engine, TableRef("bronze", TOPIC_FAILURES_TABLE), ["topic", "status", "error", "failed_at"]
    )
    resync = _read(engine, RESYNC_TABLE, ["object", "record_id", "reason", "resolved_at"])
    reconciled = _last_reconcile(engine)

    topics = []
    for spec in conf.topics():
        bronze = TableRef("bronze", spec.bronze_table)
        rows = (
            checkpoints.filter(pc.equal(checkpoints["topic"], spec.topic)).to_pylist()
            if checkpoints is not None
            else []
        )
        last = max(rows, key=lambda r: r["batch_id"]) if rows else None
        quarantined = (
            0
            if quarantine is None
            else int(pc.sum(pc.equal(quarantine["bronze_table"], spec.bronze_table)).as_py() or 0)
        )
        failure = _open_failure(failures, spec.topic, last["committed_at"] if last else None)
        topics.append(
            TopicStatus(
                topic=spec.topic,
                bronze_table=str(bronze),
                bronze_version=engine.version(bronze),
                batch_id=last["batch_id"] if last else None,
                replay_id=last["replay_id"].hex() if last and last["replay_id"] else None,
                committed_at=_iso(last["committed_at"]) if last else None,
                kind=last["kind"] if last else None,
                events_landed=sum(r["event_count"] for r in rows),
                replay_gaps=sum(1 for r in rows if r["kind"] == "replay_gap"),
                quarantined=quarantined,
                failed=failure["error"] if failure else None,
                failed_at=_iso(failure["failed_at"]) if failure else None,
            )
        )

    topic_failures = {t.topic: t.failed for t in topics if t.failed is not None}
    open_resync = resync.filter(pc.is_null(resync["resolved_at"])).to_pylist() if resync else []
    objects = []
    for spec in conf.topics():
        bronze = TableRef("bronze", spec.bronze_table)
        quarantined = next(t.quarantined for t in topics if t.topic == spec.topic)
        for obj in spec.objects:
            gold = gold_job.gold_table(obj) if obj.kind == "change_events" else None
            progress = read_progress(
                engine,
                bronze,
                (TableRef("silver", obj.tables.silver), silver_job.app_id(obj)),
                (gold, gold_job.app_id(obj)) if gold is not None else None,
            )
            status = object_status(
                summary,
                progress,
                name=obj.api_name,
                topic=spec.topic,
                now=now,
                window=window,
                spec=obj.health,
                open_resync=open_resync,
                quarantined=quarantined,
                failed=topic_failures.get(spec.topic),
            )
            last = reconciled.get(obj.api_name)
            if last is not None:
                status = replace(
                    status,
                    reconciled_at=_iso(last["finished_at"]),
                    drift_missing=last["drift_missing"],
                    drift_extra=last["drift_extra"],
                    drift_stale=last["drift_stale"],
                    drift_repaired=last["repaired"],
                )
            objects.append(status)
    more_topics, more_objects = stream_status(
        engine,
        conf,
        checkpoints=checkpoints,
        quarantine=quarantine,
        open_resync=open_resync,
        summary=summary,
        now=now,
    )
    topics += more_topics
    objects += more_objects
    location = getattr(engine, "location", None)
    return Status(
        str(location or engine.name),
        tuple(topics),
        tuple(objects),
        now=_iso(now) or "",
        # Every layer's run creates the table (empty): what tells is whether it holds rows.
        commits_table=bool(summary.groups),
    )


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
            newest_commit_at=_iso(lag.watermark),
            last_commit_at=_iso(lag.last_commit_at),
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
        "last_error_at": _iso(error.at) if error else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _last_reconcile(engine: LakeEngine) -> dict[str, dict[str, Any]]:
    """Each object's latest row of the reconcile table."""
    rows = _read(
        engine,
        RECONCILE_TABLE,
        ["object", "finished_at", "drift_missing", "drift_extra", "drift_stale", "repaired"],
    )
    last: dict[str, dict[str, Any]] = {}
    for row in rows.to_pylist() if rows is not None else []:
        seen = last.get(row["object"])
        if seen is None or row["finished_at"] > seen["finished_at"]:
            last[row["object"]] = row
    return last


def _open_quarantine(engine: LakeEngine) -> pa.Table | None:
    """The quarantine's rows not yet resolved by ``sfcdc silver --retry-quarantine``."""
    table = silver_job.QUARANTINE_TABLE
    schema = engine.schema(table)
    if schema is None:
        return None
    if "resolved_at" not in schema.fieldNames():
        return engine.read_arrow(table, columns=["bronze_table"])
    rows = engine.read_arrow(table, columns=["bronze_table", "resolved_at"])
    return rows.filter(pc.is_null(rows["resolved_at"]))


def _open_failure(
    failures: pa.Table | None, topic: str, checkpointed: datetime | None
) -> dict[str, Any] | None:
    """The topic's last failure when nothing was checkpointed after it."""
    if failures is None:
        return None
    rows = failures.filter(pc.equal(failures["topic"], topic)).to_pylist()
    if not rows:
        return None
    last: dict[str, Any] = max(rows, key=lambda r: r["failed_at"])
    if checkpointed is not None and checkpointed > last["failed_at"]:
        return None
    return last


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds")


def _v(value: int | None) -> str:
    return "-" if value is None else str(value)


def _behind(seconds: float | None) -> str:
    return "lag unknown" if seconds is None else f"behind by {seconds:,.0f} s"


def _health_lines(status: Status) -> list[str]:
    lines = [f"health at {status.now}: {status.state}"]
    if not status.commits_table:
        lines.append(
            "  (no commit records yet: lag and rates appear once landing, silver and gold have "
            "committed with ops.commits_table on)"
        )
    for o in status.objects:
        rate = "-" if o.events_per_second is None else f"{o.events_per_second:,.1f}"
        per_layer = ", ".join(
            f"{h.layer} {'-' if h.behind_seconds is None else f'{h.behind_seconds:,.0f}'} s"
            for h in o.layers
        )
        counts = f"{o.quarantined} quarantined, {o.resync_records} re-sync records"
        if o.resync_full_object:
            counts += f" + {o.resync_full_object} whole-object"
        layers = f" ({per_layer})" if per_layer else ""
        lines.append(
            f"  {o.state:<4} {o.object}: {_behind(o.behind_seconds)}{layers}; "
            f"{rate} events/s; {counts}"
        )
        if o.last_error is not None:
            lines.append(f"       last error at {o.last_error_at}: {o.last_error}")
        lines.extend(f"       {reason}" for reason in o.reasons)
    return lines


def format_status(status: Status) -> list[str]:
    """``status`` as the text ``sfcdc status`` prints."""
    lines = [f"lake {status.lake}", *_health_lines(status), "topics:"]
    for t in status.topics:
        if t.batch_id is None:
            where = "no checkpoint yet"
        else:
            where = (
                f"batch {t.batch_id} ({t.kind}) at {t.committed_at}, replay id {t.replay_id or '-'}"
            )
        extras = []
        if t.replay_gaps:
            extras.append(f"{t.replay_gaps} REPLAY GAP")
        if t.quarantined:
            extras.append(f"{t.quarantined} quarantined")
        extra = f"; {', '.join(extras)}" if extras else ""
        if t.failed is not None:
            extra += f"; FAIL at {t.failed_at}: {t.failed}"
        lines.append(
            f"  {t.topic} -> {t.bronze_table} v{_v(t.bronze_version)}: {t.events_landed} "
            f"events landed; {where}{extra}"
        )
    lines.append("objects:")
    for o in status.objects:
        silver = (
            f"{o.silver_table} v{_v(o.silver_version)} (bronze up to v{_v(o.bronze_processed)}, "
            f"lag {_v(o.bronze_lag)})"
        )
        gold = (
            f"{o.gold_table} v{_v(o.gold_version)} (silver up to v{_v(o.silver_applied)}, "
            f"lag {_v(o.silver_lag)})"
            if o.gold_table
            else "no gold (platform event)"
        )
        resync = ""
        if o.resync_records or o.resync_full_object:
            resync = (
                f"; re-sync pending: {o.resync_records} records, "
                f"{o.resync_full_object} whole-object"
            )
        failed = f"; FAIL: {o.failed}" if o.failed is not None else ""
        drift = ""
        if o.reconciled_at is not None:
            drift = (
                f"; reconciled at {o.reconciled_at}: drift_missing {o.drift_missing}, "
                f"drift_extra {o.drift_extra}, drift_stale {o.drift_stale}, "
                f"repaired {o.drift_repaired}"
            )
        lines.append(f"  {o.object}: {silver}; {gold}{resync}{drift}{failed}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the status of ``args.conf``'s lake."""
    conf = conf_from_args(args)
    engine = engine_for(conf.pipeline.lake)
    status = read_status(engine, conf)
    if args.format == "json":
        print(json.dumps({**asdict(status), "state": status.state}, indent=2))
    else:
        if not engine.tables():
            print(f"note: {empty_lake_note(conf, 'status')}")
        for line in format_status(status):
            print(line)
    return 1 if getattr(args, "check", False) and status.state == "FAIL" else 0
