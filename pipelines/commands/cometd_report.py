"""What ``sfcdc validate`` says about the Streaming API channels of a configuration (the
Pub/Sub objects' lines are the command's own; ``sfcdc status`` reports the channels with
:mod:`pipelines.commands.cometd_status`)."""

from __future__ import annotations

from pipelines.spec.cometd import CometdObjectSpec
from pipelines.spec.conf import Conf

__all__ = ["describe_streams"]

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
