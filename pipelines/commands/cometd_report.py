"""What ``sfcdc validate`` and ``sfcdc status`` say about the Streaming API channels of a
configuration (the Pub/Sub objects' lines are the commands' own)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engines import TableRef
from pipelines.spec import Conf
from pipelines.spec.cometd import CometdObjectSpec

if TYPE_CHECKING:
    from pipelines.commands.status import ObjectStatus, TopicStatus
    from pipelines.engines import LakeEngine
    from pipelines.ops.summary import Summary

__all__ = ["describe_streams", "stream_status"]

_KINDS = {
    "pushtopic": "PushTopic",
    "generic": "generic channel",
    "platform_event": "platform event channel",
    "change_event": "change event channel",
}


def _source(spec: CometdObjectSpec) -> str:
    kind = _KINDS[spec.channel_kind]
    topic = spec.pushtopic
    if topic is None:
        return f"{kind}" + (f" of {spec.api_name}" if spec.api_name else "")
    how = "made by sfcdc" if topic.manage == "create_or_update" else "existing, checked"
    query = topic.query or f"the org's query on {spec.api_name}"
    notify = topic.notify_for_fields or ("Referenced" if topic.manage != "existing" else None)
    extra = f", NotifyForFields {notify}" if notify else ""
    return f"{kind} {spec.push_topic_name} ({how}{extra}): {query}"


def describe_streams(conf: Conf) -> list[str]:
    """The lines ``sfcdc validate`` prints for the Streaming API channels (none without)."""
    if not conf.streams:
        return []
    enabled = conf.enabled_streams()
    lines = [
        f"  streaming api {conf.pipeline.streaming_api.api_version}: {len(enabled)} of "
        f"{len(conf.streams)} channels enabled, one CometD session"
    ]
    for spec in conf.streams:
        state = "" if spec.enabled else "  (disabled)"
        t = spec.tables
        gold = f", gold.{t.gold} ({spec.gold.deletes} deletes)" if spec.has_gold else " (no gold)"
        start = "-2, every retained" if spec.replay.start == "earliest" else "-1, new only"
        lines.append(f"  {spec.channel}{state}")
        lines.append(f"      {_source(spec)}")
        lines.append(
            f"      -> bronze.{t.bronze}, silver.{t.silver}{gold}; replay from {start}, "
            f"on_corrupted {spec.replay.on_corrupted}"
        )
    return lines


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds")


def stream_status(
    engine: LakeEngine,
    conf: Conf,
    *,
    checkpoints: pa.Table | None,
    quarantine: pa.Table | None,
    open_resync: Sequence[Mapping[str, Any]],
    summary: Summary,
    now: datetime,
) -> tuple[list[TopicStatus], list[ObjectStatus]]:
    """``sfcdc status`` entries of the enabled channels: one topic (the bronze side, keyed
    ``streaming:<channel>``, replay ids as numbers) and one object (silver and gold) each,
    judged against ``defaults.health`` with the commits table's ``summary``."""
    # Here, not at the top: validate (describe_streams) runs without Spark's packages.
    from pipelines.bronze.cometd_tables import replay_number
    from pipelines.commands.status import TopicStatus, object_status, read_progress
    from pipelines.gold.job import GOLD_APP_PREFIX
    from pipelines.silver.cometd_job import silver_app_id

    topics: list[TopicStatus] = []
    objects: list[ObjectStatus] = []
    for spec in conf.enabled_streams():
        bronze = TableRef("bronze", spec.tables.bronze)
        rows = (
            checkpoints.filter(pc.equal(checkpoints["topic"], spec.key)).to_pylist()
            if checkpoints is not None
            else []
        )
        last = max(rows, key=lambda r: r["batch_id"]) if rows else None
        quarantined = (
            0
            if quarantine is None
            else int(pc.sum(pc.equal(quarantine["bronze_table"], spec.tables.bronze)).as_py() or 0)
        )
        bronze_version = engine.version(bronze)
        topics.append(
            TopicStatus(
                topic=spec.key,
                bronze_table=str(bronze),
                bronze_version=bronze_version,
                batch_id=last["batch_id"] if last else None,
                replay_id=str(replay_number(last["replay_id"]))
                if last and last["replay_id"]
                else None,
                committed_at=_iso(last["committed_at"]) if last else None,
                kind=last["kind"] if last else None,
                events_landed=sum(r["event_count"] for r in rows),
                replay_gaps=sum(1 for r in rows if r["kind"] == "replay_gap"),
                quarantined=quarantined,
            )
        )
        progress = read_progress(
            engine,
            bronze,
            (TableRef("silver", spec.tables.silver), silver_app_id(spec)),
            (TableRef("gold", spec.tables.gold), f"{GOLD_APP_PREFIX}{spec.key}")
            if spec.has_gold
            else None,
        )
        objects.append(
            object_status(
                summary,
                progress,
                name=spec.key,
                topic=spec.channel,
                now=now,
                window=conf.pipeline.ops.rate_window_seconds,
                spec=conf.pipeline.defaults.health,
                open_resync=open_resync,
                quarantined=quarantined,
            )
        )
    return topics, objects
