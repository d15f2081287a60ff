"""The emulated org's records, rebuilt from the change events on its bus.

PushTopics are evaluated against record changes. The emulator learns them from the same change
events its gRPC side serves: each event appended to a change event topic is decoded with its
writer schema and applied to a :class:`~ingest.emulator.truth.GroundTruth` (the rules of
:mod:`ingest.emulator.truth`), so the full current values of a changed record are known, not
only the fields the event carries. Each applied event yields one :class:`RecordChange` per
record it names.

Events that carry no values cannot be evaluated and yield no change: ``GAP_*`` events (the
record's existence and deletion are still tracked), ``GAP_OVERFLOW`` and wildcard updates
(``recordIds == ["001*"]``, a metadata operation that nulls a field everywhere). A record the
emulator has not seen created (an event from before a restart) is tracked from the first event
naming it, with unknown fields as null.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ingest.decoding.cache import DecoderCache
from ingest.decoding.diff import apply_diff
from ingest.decoding.event import ChangeEvent
from ingest.emulator.eventlog import LoggedEvent
from ingest.emulator.topics import Catalogue
from ingest.emulator.truth import GroundTruth
from ingest.errors import DecodeError
from ingest.schema import HEADER_FIELD, EventSchema

__all__ = ["Operation", "RecordChange", "RecordState"]

logger = logging.getLogger(__name__)

Operation = Literal["created", "updated", "deleted", "undeleted"]
_OPERATIONS: dict[str, Operation] = {
    "CREATE": "created",
    "UPDATE": "updated",
    "DELETE": "deleted",
    "UNDELETE": "undeleted",
}


@dataclass(frozen=True)
class RecordChange:
    """One record's change: ``changed`` holds the event's changedFields names
    (``BillingAddress.City`` for compound parts); ``values`` the record after the change (for
    a delete, as it was when deleted). ``commit_ms`` is the commit time (epoch ms)."""

    entity: str
    record_id: str
    operation: Operation
    changed: frozenset[str]
    values: Mapping[str, Any]
    commit_ms: int
    schema: EventSchema


class RecordState:
    """Applies change events to the record state (see the module docstring)."""

    def __init__(self, catalogue: Catalogue) -> None:
        self._catalogue = catalogue
        self._decoders = DecoderCache(lambda sid: catalogue.schema(sid).json)
        self.truth = GroundTruth()
        self._registered: dict[str, str] = {}
        # Diffs the state could not apply (its record lacked the value the diff was made
        # against): the field then keeps its previous value. Counted and logged at DEBUG: the
        # state only serves PushTopic notifications, and a user of the emulator cannot act on
        # it (it is no warning about sfcdc).
        self.unapplied_diffs = 0

    def apply(self, event: LoggedEvent) -> list[RecordChange]:
        """The record changes one logged change event makes (none for events without
        values); the state is updated either way."""
        try:
            schema, decoder = self._decoders.get(event.schema_id)
            record = decoder.decode(event.payload)
            change = ChangeEvent.from_record(record, schema)
        except (KeyError, DecodeError, ValueError) as exc:
            logger.warning(
                "%s event %s cannot be decoded for PushTopics: %s",
                event.topic,
                event.event_id,
                exc,
            )
            return []
        entity = change.entity
        self._register(entity, schema)
        kind = change.change_type
        if kind.startswith("GAP_"):
            self._gap(entity, change)
            return []
        if any(rid.endswith("*") for rid in change.record_ids):
            for name in change.nulled:
                if "." not in name:
                    self.truth.null_everywhere(entity, name)
            return []
        operation = _OPERATIONS.get(kind)
        if operation is None:
            return []
        out = []
        for record_id in change.record_ids:
            values = self._apply_one(entity, record_id, operation, change)
            if values is None:
                continue
            out.append(
                RecordChange(
                    entity,
                    record_id,
                    operation,
                    frozenset(change.changed),
                    values,
                    change.commit_timestamp,
                    schema,
                )
            )
        return out

    def _register(self, entity: str, schema: EventSchema) -> None:
        if self._registered.get(entity) == schema.schema_id:
            return
        body = [f for f in schema.fields if f.name != HEADER_FIELD]
        compounds = {f.name: [c.name for c in f.children] for f in body if f.is_compound}
        self.truth.register(entity, [f.name for f in body], compounds)
        self._registered[entity] = schema.schema_id

    def _ensure(self, entity: str, record_id: str, *, live: bool) -> None:
        records = self.truth.records(entity)
        if record_id not in records:
            self.truth.create(entity, record_id, {}, event_id="")
        deleted = self.truth.is_deleted(entity, record_id)
        if live and deleted:
            self.truth.undelete(entity, record_id, dict(records[record_id]), event_id="")
        elif not live and not deleted:
            self.truth.delete(entity, record_id, event_id="")

    def _apply_one(
        self, entity: str, record_id: str, operation: Operation, change: ChangeEvent
    ) -> Mapping[str, Any] | None:
        truth = self.truth
        names = set(truth.fields(entity))
        body = {k: v for k, v in change.values.items() if k in names}
        if operation in ("created", "undeleted"):
            if record_id in truth.records(entity):
                self._ensure(entity, record_id, live=False)
                truth.undelete(entity, record_id, body, event_id="")
            else:
                truth.create(entity, record_id, body, event_id="")
        elif operation == "deleted":
            self._ensure(entity, record_id, live=True)
            truth.delete(entity, record_id, event_id="")
        else:
            self._ensure(entity, record_id, live=True)
            previous = truth.record(entity, record_id)
            changes: dict[str, Any] = {}
            nulled = set(change.nulled)
            for name in change.changed:
                parent, _, child = name.partition(".")
                value = change.values.get(parent)
                if child:
                    value = value.get(child) if isinstance(value, Mapping) else None
                if name in nulled:
                    value = None
                elif name in change.diffed and isinstance(value, str):
                    try:
                        value = apply_diff(previous.get(name), value)
                    except DecodeError as exc:
                        self.unapplied_diffs += 1
                        logger.debug("%s %s: diff not applied: %s", entity, record_id, exc)
                        continue
                changes[name] = value
            truth.update(entity, record_id, changes, event_id="")
        return dict(truth.record(entity, record_id))

    def _gap(self, entity: str, change: ChangeEvent) -> None:
        for record_id in change.record_ids:
            if record_id.endswith("*"):
                continue
            if change.change_type in ("GAP_CREATE", "GAP_UPDATE", "GAP_UNDELETE"):
                self._ensure(entity, record_id, live=True)
            elif change.change_type == "GAP_DELETE":
                self._ensure(entity, record_id, live=False)
