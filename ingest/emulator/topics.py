"""What the emulator serves: topics, their schema versions, and the events it emits.

A :class:`Catalogue` is the emulator's view of one org's event bus: per-object change event
topics (``/data/AccountChangeEvent``), the multi-entity channel ``/data/ChangeEvents`` (which
carries every change event of the org, with the same replay id as on the object's own topic),
and platform event topics (``/event/Order_Shipped__e``). A topic keeps every schema version it
ever served, because stored events keep pointing at the schema they were written with.

It is also the org's metadata the REST and Bulk APIs answer with: an object whose Change Data
Capture is off (:meth:`Catalogue.disable_change_events`; an org selects at most five entities
without the add-on licence) keeps its schema here, so its records are generated, queried and
described as any other's, but it has no topic: GetTopic and Subscribe do not know it, and its
changes publish no event. Formula fields (:meth:`Catalogue.add_formulas`) are computed when a
record is read and are in no change event schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ingest.emulator.formulas import Formula
from ingest.schema import EventSchema

__all__ = ["CHANGE_EVENTS_CHANNEL", "Catalogue", "EmittedEvent", "TopicDef", "TopicKind"]

CHANGE_EVENTS_CHANNEL = "/data/ChangeEvents"

TopicKind = Literal["change_events", "change_event_channel", "platform_event"]


@dataclass(frozen=True)
class TopicDef:
    """One topic. ``schemas`` lists every version, oldest first; the last one is current.

    The multi-entity channel has no schema of its own (GetTopic reports a blank schema id);
    its events carry the schema ids of their objects.
    """

    name: str
    kind: TopicKind
    entity: str | None = None
    schemas: tuple[EventSchema, ...] = ()

    @property
    def current_schema(self) -> EventSchema | None:
        return self.schemas[-1] if self.schemas else None

    @property
    def publishable(self) -> bool:
        """Only (high-volume) platform events can be published; change events cannot."""
        return self.kind == "platform_event"


@dataclass(frozen=True, slots=True)
class EmittedEvent:
    """An event ready to be appended to the emulator's log: Avro payload plus its identity.

    ``topic`` is the event's own topic (the object's change event topic or the platform event
    topic), never the multi-entity channel.
    """

    topic: str
    schema_id: str
    payload: bytes
    event_id: str


@dataclass
class Catalogue:
    """The topics and schemas of one emulated org, changed through :meth:`add_version`,
    :meth:`disable_change_events`, :meth:`add_formulas` and :meth:`retype_field`."""

    topics: dict[str, TopicDef] = field(default_factory=dict)
    # Entities whose Change Data Capture is off: records, but no topic and no events.
    cdc_off: set[str] = field(default_factory=set)
    # Formula fields per entity, computed when a record is read.
    formulas: dict[str, tuple[Formula, ...]] = field(default_factory=dict)
    # Describe types of fields whose type was converted (entity -> field -> type).
    retyped: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, topics: Iterable[TopicDef], *, with_channel: bool = True) -> Catalogue:
        by_name = {t.name: t for t in topics}
        if with_channel and any(t.kind == "change_events" for t in by_name.values()):
            by_name.setdefault(
                CHANGE_EVENTS_CHANNEL, TopicDef(CHANGE_EVENTS_CHANNEL, "change_event_channel")
            )
        return cls(by_name)

    def __iter__(self) -> Iterator[TopicDef]:
        return iter(self.topics.values())

    def __contains__(self, name: object) -> bool:
        return name in self.topics

    def topic(self, name: str) -> TopicDef:
        """The topic called ``name`` (names are case-sensitive, as on Salesforce)."""
        try:
            return self.topics[name]
        except KeyError:
            raise KeyError(name) from None

    def topic_for_entity(self, entity: str) -> TopicDef:
        for t in self.topics.values():
            if t.entity == entity and t.kind != "change_event_channel":
                return t
        raise KeyError(entity)

    @property
    def schemas(self) -> Mapping[str, EventSchema]:
        return {s.schema_id: s for t in self.topics.values() for s in t.schemas}

    def schema(self, schema_id: str) -> EventSchema:
        try:
            return self.schemas[schema_id]
        except KeyError:
            raise KeyError(schema_id) from None

    def channel_members(self, channel: str) -> tuple[str, ...]:
        """Topics whose events a channel carries: every change event topic for
        ``/data/ChangeEvents`` (of entities whose Change Data Capture is on); a topic carries
        only itself."""
        if self.topic(channel).kind == "change_event_channel":
            return tuple(
                t.name
                for t in self.topics.values()
                if t.kind == "change_events" and self.publishes(t.name)
            )
        return (channel,)

    def publishes(self, topic: str) -> bool:
        """Whether events of ``topic`` exist: false for the change event topic of an entity
        whose Change Data Capture is off (and for topics the catalogue does not have)."""
        found = self.topics.get(topic)
        return found is not None and found.entity not in self.cdc_off

    def disable_change_events(self, *entities: str) -> None:
        """Turn Change Data Capture off for ``entities`` (change event entities of this
        catalogue): their topics are no longer served and their changes publish no event,
        while their records are queried and described as before."""
        known = {t.entity for t in self.topics.values() if t.kind == "change_events"}
        unknown = sorted(set(entities) - known)
        if unknown:
            raise KeyError(
                f"no change event entity {', '.join(unknown)} in the catalogue (entities: "
                f"{', '.join(sorted(e for e in known if e))})"
            )
        self.cdc_off.update(entities)

    def add_formulas(self, formulas: Mapping[str, Sequence[Formula]]) -> None:
        """Give entities formula fields (entity -> formulas; an entity's earlier formulas of
        the same name are replaced). A formula's inputs must be fields of the entity's current
        schema and its name none of them."""
        for entity, items in formulas.items():
            topic = self.topic_for_entity(entity)
            schema = topic.current_schema
            names = {f.name for f in schema.fields} if schema is not None else set()
            problems = [
                f"{f.name} reads {sorted(set(f.inputs) - names)}"
                for f in items
                if not set(f.inputs) <= names
            ]
            problems += [f"{f.name} is a stored field" for f in items if f.name in names]
            if problems:
                raise ValueError(f"formulas of {entity}: " + "; ".join(problems))
            kept = {f.name: f for f in self.formulas.get(entity, ())}
            kept.update((f.name, f) for f in items)
            self.formulas[entity] = tuple(kept.values())

    def formulas_of(self, entity: str) -> tuple[Formula, ...]:
        """The formula fields of ``entity`` (none: an empty tuple)."""
        return self.formulas.get(entity, ())

    def retype_field(self, entity: str, name: str, sf_type: str) -> None:
        """Record that ``entity``'s field ``name`` is now of describe type ``sf_type`` (a custom
        field type conversion: ``describe`` shows it; the change event schema is unchanged)."""
        self.retyped.setdefault(entity, {})[name] = sf_type

    def retyped_of(self, entity: str) -> tuple[tuple[str, str], ...]:
        """The converted fields of ``entity`` and their describe types, in name order."""
        return tuple(sorted(self.retyped.get(entity, {}).items()))

    def add_version(self, topic: str, schema: EventSchema) -> TopicDef:
        """Make ``schema`` the topic's current schema (a schema change mid-stream).

        Earlier versions stay resolvable by id so events written with them still decode.
        """
        current = self.topic(topic)
        if any(s.schema_id == schema.schema_id for s in current.schemas):
            return current
        updated = TopicDef(current.name, current.kind, current.entity, (*current.schemas, schema))
        self.topics[topic] = updated
        return updated
