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
from dataclasses import asdict, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.bronze.tables import CHECKPOINT_TABLE, TOPIC_FAILURES_TABLE
from pipelines.commands.cometd_status import stream_status
from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.commands.empty_lake import empty_lake_note
from pipelines.commands.status_model import (
    Status,
    TopicStatus,
    iso,
    object_status,
    read_progress,
)
from pipelines.engines.base import LakeEngine, TableRef
from pipelines.gold import job as gold_job
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.gold.tables import RECONCILE_TABLE
from pipelines.ops.summary import read_summary
from pipelines.session import engine_for
from pipelines.silver import job as silver_job
from pipelines.spec.conf import Conf

__all__ = ["format_status", "read_status", "register"]


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


def _read(engine: LakeEngine, table: TableRef, columns: list[str]) -> pa.Table | None:
    if not engine.exists(table):
        return None
    return engine.read_arrow(table, columns=columns)


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
                committed_at=iso(last["committed_at"]) if last else None,
                kind=last["kind"] if last else None,
                events_landed=sum(r["event_count"] for r in rows),
                replay_gaps=sum(1 for r in rows if r["kind"] == "replay_gap"),
                quarantined=quarantined,
                failed=failure["error"] if failure else None,
                failed_at=iso(failure["failed_at"]) if failure else None,
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
                    reconciled_at=iso(last["finished_at"]),
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
        now=iso(now) or "",
        # Every layer's run creates the table (empty): what tells is whether it holds rows.
        commits_table=bool(summary.groups),
    )


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
