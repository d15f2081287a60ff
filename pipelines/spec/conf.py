"""A loaded ``conf/`` directory (:class:`Conf`): the pipeline, its Pub/Sub and polled objects
and its Streaming API channels, defaults applied. :mod:`pipelines.spec.load` builds it; it sits
above both :mod:`pipelines.spec.models` and :mod:`pipelines.spec.cometd`, which import neither
it nor each other in the other direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.spec.cometd import CometdObjectSpec
from pipelines.spec.models import ObjectSpec, PipelineSpec, TopicSpec, parse_topic

__all__ = ["Conf"]


@dataclass(frozen=True)
class Conf:
    """A loaded ``conf/`` directory: the pipeline and its objects, defaults applied."""

    pipeline: PipelineSpec
    objects: tuple[ObjectSpec, ...]
    conf_dir: Path
    object_files: Mapping[str, Path] = field(default_factory=dict)
    # Object files of kind streaming_api: Streaming API channels (pipelines.spec.cometd).
    streams: tuple[CometdObjectSpec, ...] = ()

    def object(self, api_name: str) -> ObjectSpec:
        """The object called ``api_name`` (case-sensitive, as in Salesforce)."""
        for obj in self.objects:
            if obj.api_name == api_name:
                return obj
        known = ", ".join(o.api_name for o in self.objects)
        raise KeyError(f"no object {api_name!r} in {self.conf_dir} (configured: {known})")

    def enabled_objects(self) -> tuple[ObjectSpec, ...]:
        return tuple(o for o in self.objects if o.enabled)

    def enabled_streams(self) -> tuple[CometdObjectSpec, ...]:
        """The Streaming API channels to land (object files of kind streaming_api)."""
        return tuple(s for s in self.streams if s.enabled)

    def polled_objects(self) -> tuple[ObjectSpec, ...]:
        """The enabled objects read by incremental queries (kind polled)."""
        return tuple(o for o in self.objects if o.enabled and o.kind == "polled")

    def objects_by_topic(
        self, *, include_disabled: bool = False
    ) -> Mapping[str, tuple[ObjectSpec, ...]]:
        """Objects grouped by topic, topics in name order (polled objects have none). Objects
        sharing a topic share its subscription and its bronze table."""
        groups: dict[str, list[ObjectSpec]] = {}
        for obj in self.objects:
            if obj.kind == "polled":
                continue
            if obj.enabled or include_disabled:
                groups.setdefault(obj.topic, []).append(obj)
        return {topic: tuple(groups[topic]) for topic in sorted(groups)}

    def topics(self, *, include_disabled: bool = False) -> tuple[TopicSpec, ...]:
        """One :class:`TopicSpec` per subscription (load_conf guarantees the objects of a
        topic agree on bronze table, replay and batching)."""
        specs = []
        for topic, objs in self.objects_by_topic(include_disabled=include_disabled).items():
            first = objs[0]
            specs.append(
                TopicSpec(
                    topic=topic,
                    kind=parse_topic(topic).kind,
                    bronze_table=first.tables.bronze,
                    replay=first.replay,
                    batching=first.batching,
                    objects=objs,
                    managed_subscription=first.managed_subscription,
                    num_requested=first.num_requested,
                )
            )
        return tuple(specs)
