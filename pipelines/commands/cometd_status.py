"""What ``sfcdc status`` says about the Streaming API channels of a configuration: a topic (the
bronze side) and an object (silver and gold) each, as :mod:`pipelines.commands.status_model`
reports the Pub/Sub objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.bronze.cometd_tables import replay_number
from pipelines.commands.status_model import (
    ObjectStatus,
    TopicStatus,
    iso,
    object_status,
    read_progress,
)
from pipelines.engines.base import LakeEngine, TableRef
from pipelines.gold.tables import GOLD_APP_PREFIX
from pipelines.ops.summary import Summary
from pipelines.silver.cometd_job import silver_app_id
from pipelines.spec.conf import Conf

__all__ = ["stream_status"]


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
                committed_at=iso(last["committed_at"]) if last else None,
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
