"""What the workload knows about the objects it generates: the shipped objects' rules (lookups,
cascades, required and read-only fields, opportunity stages) and :class:`Plan`, one object's
current schema resolved once into what generating its records needs (field categories, value
makers, writers, bitmap encoder). :func:`build_plan` makes one; a schema change makes a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ingest.emulator.avrowriter import AvroWriter, HeaderEncoder
from ingest.emulator.bitmaps import BitmapEncoder
from ingest.emulator.cometd.fields import describe_type, lossy_conversion
from ingest.emulator.topics import TopicDef
from ingest.emulator.values import ValueFactory
from ingest.schema import EventSchema, FieldInfo

__all__ = [
    "CASCADE",
    "REQUIRED_CHILDREN",
    "STAGES",
    "Category",
    "FieldPlan",
    "Plan",
    "build_plan",
    "entity_of",
]

# -- per-object knowledge of the shipped objects ------------------------------------------------

_SYSTEM = frozenset({"CreatedDate", "CreatedById", "LastModifiedDate", "LastModifiedById"})
_USER_FIELDS = frozenset({"OwnerId"})
_LOOKUPS: dict[str, dict[str, str]] = {
    "Account": {"ParentId": "Account"},
    "Contact": {"AccountId": "Account", "ReportsToId": "Contact"},
    "Opportunity": {"AccountId": "Account", "ContactId": "Contact"},
    "Invoice__c": {"Account__c": "Account", "Contact__c": "Contact"},
}
# Deleting an Account deletes its Contacts and Opportunities in the same transaction.
CASCADE: dict[str, tuple[tuple[str, str], ...]] = {
    "Account": (("Contact", "AccountId"), ("Opportunity", "AccountId")),
}
_REQUIRED: dict[str, frozenset[str]] = {
    "Account": frozenset({"Name", "OwnerId"}),
    "Contact": frozenset({"Name", "OwnerId"}),
    "Opportunity": frozenset({"Name", "StageName", "CloseDate", "OwnerId"}),
    "Invoice__c": frozenset({"Name", "OwnerId"}),
}
REQUIRED_CHILDREN = frozenset({"LastName"})
_READ_ONLY: dict[str, frozenset[str]] = {
    "Opportunity": frozenset({"ExpectedRevenue", "IsClosed", "IsWon", "LastStageChangeDate"}),
    "Invoice__c": frozenset({"Name"}),  # an auto-number
}
# Opportunity stage -> (Probability, IsClosed, IsWon).
STAGES: dict[str, tuple[float, bool, bool]] = {
    "Prospecting": (10.0, False, False),
    "Qualification": (10.0, False, False),
    "Needs Analysis": (20.0, False, False),
    "Value Proposition": (50.0, False, False),
    "Id. Decision Makers": (60.0, False, False),
    "Perception Analysis": (70.0, False, False),
    "Proposal/Price Quote": (75.0, False, False),
    "Negotiation/Review": (90.0, False, False),
    "Closed Won": (100.0, True, True),
    "Closed Lost": (0.0, True, False),
}
_PRODUCT_NAMES = ("Renewal", "Expansion", "Pilot", "Platform Licence", "Support Upgrade")

Category = Literal[
    "system", "read_only", "lookup", "user", "record_type", "unknown_id", "long_text",
    "compound", "name", "scalar", "other",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class FieldPlan:
    info: FieldInfo
    category: Category
    required: bool
    target: str | None = None
    person_only: bool = False
    business_only: bool = False
    maker: Callable[[int], Any] | None = None
    always: bool = False  # present in every CREATE (required, or a checkbox: never null)


@dataclass
class Plan:
    """Everything about one object's current schema that generation needs, resolved once."""

    entity: str
    topic: str
    prefix: str
    schema: EventSchema
    writer: AvroWriter
    body_writer: AvroWriter
    header: HeaderEncoder | None
    entity_bytes: bytes
    encoder: BitmapEncoder
    fields: dict[str, FieldPlan]
    order: dict[str, tuple[int, int]]
    compounds: dict[str, tuple[str, ...]]
    editable: tuple[FieldPlan, ...]
    mass: tuple[FieldPlan, ...]
    wildcard: tuple[FieldPlan, ...]
    lookups: frozenset[str]
    _editable: dict[bool, tuple[FieldPlan, ...]] = field(default_factory=dict)
    _texts: dict[bool, tuple[FieldPlan, ...]] = field(default_factory=dict)
    _bitmaps: dict[tuple[str, ...], bytes] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.fields

    def bitmap_bytes(self, names: tuple[str, ...]) -> bytes:
        """The Avro encoding of the bitmap array for ``names`` (memoized: combinations repeat)."""
        encoded = self._bitmaps.get(names)
        if encoded is None:
            if len(self._bitmaps) >= 20_000:
                self._bitmaps.clear()
            encoded = self._bitmaps[names] = HeaderEncoder.strings(self.encoder.encode(names))
        return encoded

    def texts_for(self, person: bool) -> tuple[FieldPlan, ...]:
        """The long text fields among :meth:`editable_for`."""
        cached = self._texts.get(person)
        if cached is None:
            cached = self._texts[person] = tuple(
                fp for fp in self.editable_for(person) if fp.category == "long_text"
            )
        return cached

    def editable_for(self, person: bool) -> tuple[FieldPlan, ...]:
        """Editable fields of a person (or business) account; of any record elsewhere."""
        cached = self._editable.get(person)
        if cached is None:
            cached = self._editable[person] = tuple(
                fp
                for fp in self.editable
                if not (fp.person_only and not person) and not (fp.business_only and person)
            )
        return cached


def entity_of(topic: TopicDef) -> str:
    """The object a change event topic carries the changes of."""
    if topic.entity:
        return topic.entity
    schema = topic.current_schema
    if schema is None:
        raise ValueError(f"topic {topic.name} has no schema")
    return schema.entity_name


def build_plan(
    topic: TopicDef,
    *,
    prefix: str,
    writer_for: Callable[[EventSchema], AvroWriter],
    values: ValueFactory,
) -> Plan:
    """The plan of ``topic``'s object under the topic's current schema; ``prefix`` is the
    object's key prefix, ``writer_for`` the (shared) full-event writer of a schema and
    ``values`` makes the scalar fields' value makers."""
    entity = entity_of(topic)
    schema = topic.current_schema
    if schema is None or not schema.is_change_event:
        raise ValueError(f"topic {topic.name} has no change event schema")
    plans: dict[str, FieldPlan] = {}
    order: dict[str, tuple[int, int]] = {}
    compounds: dict[str, tuple[str, ...]] = {}
    required = _REQUIRED.get(entity, frozenset({"Name", "OwnerId"}))
    read_only = _READ_ONLY.get(entity, frozenset())
    lookups = _LOOKUPS.get(entity, {})
    for info in schema.fields[1:]:
        order[info.name] = (info.index, -1)
        if info.is_compound:
            compounds[info.name] = tuple(c.name for c in info.children)
            for c in info.children:
                order[f"{info.name}.{c.name}"] = (info.index, c.index)
        category = _category(info, read_only, lookups)
        plans[info.name] = FieldPlan(
            info=info,
            category=category,
            required=info.name in required,
            target=lookups.get(info.name),
            person_only=entity == "Account" and info.name.startswith("Person"),
            business_only=entity == "Account" and info.name == "ParentId",
            maker=_maker(values, entity, info) if category == "scalar" else None,
            always=info.name in required or info.kind == "boolean",
        )
    editable = tuple(
        p
        for p in plans.values()
        if p.category
        in ("lookup", "user", "record_type", "long_text", "compound", "name", "scalar")
    )
    mass = tuple(
        p
        for p in editable
        if p.category == "scalar"
        and not p.person_only
        and (p.info.sf_type in {"DynamicEnum", "StaticEnum"} or p.info.kind == "boolean")
        and not (entity == "Opportunity" and p.info.name == "StageName")
    )
    wildcard = tuple(
        p
        for p in editable
        if p.category == "scalar"
        and p.info.name.endswith("__c")
        and p.info.kind != "boolean"
        and not p.required
        and lossy_conversion(describe_type(p.info)) is not None
    )
    return Plan(
        entity=entity,
        topic=topic.name,
        prefix=prefix,
        schema=schema,
        writer=writer_for(schema),
        body_writer=AvroWriter(schema, first_field=1),
        header=HeaderEncoder.for_schema(schema),
        entity_bytes=HeaderEncoder.string(entity),
        encoder=BitmapEncoder(schema),
        fields=plans,
        order=order,
        compounds=compounds,
        editable=editable,
        mass=mass,
        wildcard=wildcard,
        lookups=frozenset(n for n, p in plans.items() if p.category == "lookup"),
    )


def _category(info: FieldInfo, read_only: frozenset[str], lookups: Mapping[str, str]) -> Category:
    name = info.name
    if name in _SYSTEM:
        return "system"
    if name in read_only:
        return "read_only"
    if info.kind == "switchable_name":
        return "name"
    if info.kind == "compound":
        return "compound"
    if info.kind == "long_text":
        return "long_text"
    if info.kind == "id":
        if name in lookups:
            return "lookup"
        if name in _USER_FIELDS:
            return "user"
        if name == "RecordTypeId":
            return "record_type"
        return "unknown_id"
    if info.kind in ("record", "other"):
        return "other"
    return "scalar"


def _maker(values: ValueFactory, entity: str, info: FieldInfo) -> Callable[[int], Any]:
    if entity == "Opportunity" and info.name == "Name":
        return lambda now: f"{values.company_name()} - {values.pick(_PRODUCT_NAMES)}"
    if entity == "Opportunity" and info.name == "StageName":
        stages = tuple(STAGES)
        return lambda now: values.pick(stages)
    return values.maker(entity, info)
