"""``sfcdc status``: where every topic and object stands, read from the Delta logs.

::

    sfcdc status [--conf conf/] [--format text|json]

Per topic: the last bronze checkpoint (replay id, batch, commit time, kind), the events
landed, replay gaps and quarantined rows. Per object: the bronze version silver has
processed and the silver version gold has applied (from their Delta app transactions), so
the lag of each layer in table versions, and the open re-sync work (records, whole object).
With the local engine no JVM is started: the Delta logs are read with delta-rs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.bronze import CHECKPOINT_TABLE
from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.commands.streaming_report import stream_status
from pipelines.engines import LakeEngine, TableRef
from pipelines.gold import job as gold_job
from pipelines.gold.resync import OBJECT_LEVEL_REASONS, RESYNC_TABLE
from pipelines.session import engine_for
from pipelines.silver import job as silver_job
from pipelines.spec import Conf

__all__ = ["ObjectStatus", "Status", "TopicStatus", "format_status", "read_status", "register"]


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


@dataclass(frozen=True)
class ObjectStatus:
    """An object's silver and gold progress. ``bronze_lag``: bronze versions silver has not
    processed; ``silver_lag``: silver versions gold has not applied (``None`` without gold)."""

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


@dataclass(frozen=True)
class Status:
    """Every enabled topic and object of a configuration."""

    lake: str
    topics: tuple[TopicStatus, ...]
    objects: tuple[ObjectStatus, ...]


def _read(engine: LakeEngine, table: TableRef, columns: list[str]) -> pa.Table | None:
    if not engine.exists(table):
        return None
    return engine.read_arrow(table, columns=columns)


def _lag(current: int | None, processed: int | None) -> int | None:
    if current is None:
        return None
    return max(0, current - (processed if processed is not None else 0))


def read_status(engine: LakeEngine, conf: Conf) -> Status:
    """The status of ``conf``'s enabled topics and objects in ``engine``'s lake."""
    checkpoints = _read(
        engine,
        TableRef("bronze", CHECKPOINT_TABLE),
        ["topic", "batch_id", "kind", "replay_id", "event_count", "committed_at"],
    )
    quarantine = _read(engine, silver_job.QUARANTINE_TABLE, ["bronze_table"])
    resync = _read(engine, RESYNC_TABLE, ["object", "record_id", "reason", "resolved_at"])

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
            )
        )

    open_resync = resync.filter(pc.is_null(resync["resolved_at"])).to_pylist() if resync else []
    objects = []
    for spec in conf.topics():
        bronze_version = engine.version(TableRef("bronze", spec.bronze_table))
        for obj in spec.objects:
            silver = TableRef("silver", obj.tables.silver)
            silver_version = engine.version(silver)
            processed = (
                engine.txn_version(silver, silver_job.app_id(obj))
                if silver_version is not None
                else None
            )
            gold_name = applied = gold_version = None
            if obj.kind == "change_events":
                gold = gold_job.gold_table(obj)
                gold_name = str(gold)
                gold_version = engine.version(gold)
                applied = (
                    engine.txn_version(gold, gold_job.app_id(obj))
                    if gold_version is not None
                    else None
                )
            mine = [r for r in open_resync if r["object"] == obj.api_name]
            whole = sum(
                1 for r in mine if r["record_id"] is None or r["reason"] in OBJECT_LEVEL_REASONS
            )
            objects.append(
                ObjectStatus(
                    object=obj.api_name,
                    topic=spec.topic,
                    silver_table=str(silver),
                    silver_version=silver_version,
                    bronze_processed=processed,
                    bronze_lag=_lag(bronze_version, processed),
                    gold_table=gold_name,
                    gold_version=gold_version,
                    silver_applied=applied,
                    silver_lag=_lag(silver_version, applied) if gold_name else None,
                    resync_records=len({r["record_id"] for r in mine if r["record_id"]}),
                    resync_full_object=whole,
                )
            )
    more_topics, more_objects = stream_status(
        engine, conf, checkpoints=checkpoints, quarantine=quarantine, open_resync=open_resync
    )
    topics += more_topics
    objects += more_objects
    location = getattr(engine, "location", None)
    return Status(str(location or engine.name), tuple(topics), tuple(objects))


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds")


def _v(value: int | None) -> str:
    return "-" if value is None else str(value)


def format_status(status: Status) -> list[str]:
    """``status`` as the text ``sfcdc status`` prints."""
    lines = [f"lake {status.lake}", "topics:"]
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
        lines.append(f"  {o.object}: {silver}; {gold}{resync}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the status of ``args.conf``'s lake."""
    conf = conf_from_args(args)
    status = read_status(engine_for(conf.pipeline.lake), conf)
    if args.format == "json":
        print(json.dumps(asdict(status), indent=2))
    else:
        for line in format_status(status):
            print(line)
    return 0
