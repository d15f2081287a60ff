"""The ground truth: what Salesforce holds after every change event generated so far.

:class:`GroundTruth` is what a correct replica (gold) must contain. It is kept by the workload
generator (:mod:`ingest.emulator.workload`) as it generates each transaction, so after a
transaction's events have been generated the truth already includes all of them.

Record state, per entity, by record id (18-char ids):

* Every record, live or deleted, has a value for every field of the entity's schema (the
  header excluded), in wire form, exactly as a CREATE event would carry it: ``None`` for an
  empty field; strings, ints, floats and bools as Avro decodes them; dates
  (``Data:DateOnly``) as epoch ms at midnight UTC; datetimes as epoch ms (whole seconds);
  times (``Data:TimeOnly``) as ms since midnight; long text always as the full value (never a
  diff). A compound field (Address, Location, PersonName) is a dict with **every** child of its
  record, or ``None`` when every child is ``None`` (an empty compound is null, never a dict of
  nulls). Account ``Name`` is a ``str`` for a business account and a dict of the
  ``Switchable_PersonName`` children for a person account.
* ``deleted(entity)`` lists the records that are in the recycle bin.

What each change does to the truth (and so what gold must do):

* **CREATE**: a new live record whose values are exactly the event body.
* **UPDATE**: for every record id of the event, each field named in ``changedFields`` takes
  the body's value (``None`` when it is in ``nulledFields``; the full reconstructed value when
  it is in ``diffFields``); compound children change one by one (``BillingAddress.City``), the
  other children keep their values, and a compound whose children all become ``None`` becomes
  ``None``. Fields not in ``changedFields`` keep their value. ``LastModifiedDate`` is always in
  ``changedFields``; ``LastModifiedById`` only when the user differs.
* **UPDATE with a wildcard** (``recordIds == ["001*"]``, a lossy field type conversion): the
  nulled field becomes ``None`` on every record of the entity, live **and** deleted, and
  nothing else changes (not even ``LastModifiedDate``: it is a metadata operation, not a
  record save).
* **DELETE**: the record is marked deleted; its values stay as they were before the delete
  (the event carries no values, so the deleter's system fields are not applied).
* **UNDELETE**: the record is live again and its values are exactly the event body: the values
  it had when it was deleted, with ``LastModifiedDate`` and ``LastModifiedById`` set to the
  undelete's commit time and user.
* **GAP_CREATE / GAP_UPDATE / GAP_DELETE / GAP_UNDELETE**: the same change as the non-gap type
  happened (a GAP_DELETE deletes the record keeping its values; a GAP_UNDELETE restores it as an
  UNDELETE would), but the event carries no values, so the record is listed by :meth:`resync`.
* **GAP_OVERFLOW**: the transaction also changed records that no event names; the truth holds
  those changes, the entity needs a full re-sync, and :meth:`resync` lists the records actually
  changed (known only to the emulator, for diagnosis).
* A schema change that adds fields adds them to every record (live and deleted) as ``None``.
* **Emptying the Recycle Bin** (:meth:`GroundTruth.hard_delete`): a deleted record is gone for
  good; no event says so and ``queryAll`` no longer returns it. :meth:`purged` lists such
  records; a replica that keeps deleted rows keeps them deleted.

Every record also has a ``SystemModstamp`` (:meth:`GroundTruth.modstamps`, epoch ms): the
commit time of the last change that saved it (create, update, delete, undelete, a gap change or
a change an overflow hid); a wildcard UPDATE is a metadata operation and leaves it. It is not a
field of the change event schemas (change events do not carry it); the REST and Bulk APIs serve
it, and reconciliation compares it with the replica.

Re-sync rule: a record is listed by :meth:`resync` when a gap event (or an overflow) touched it
after the last event that carried its full image (CREATE or UNDELETE). Later UPDATE or DELETE
events do not clear it, because they describe only part of the record. Every other record is
reproduced exactly by applying the events in order with the rules above.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ingest.emulator.formulas import Formula, formula_values

__all__ = ["TRUTH_FORMAT", "GroundTruth", "ResyncExpectation"]

TRUTH_FORMAT = "sfcdc.ground-truth/1"


@dataclass(frozen=True)
class ResyncExpectation:
    """Which records of one entity events cannot reproduce, and why.

    ``gap_event_ids`` maps each record listed in ``record_ids`` to the ids (``ProducerEvent.id``,
    which do not depend on replay ids) of the gap events that touched it since its last full
    image. ``full_resync`` is true once a GAP_OVERFLOW was emitted for the entity; a subscriber
    cannot tell which records it changed, but the emulator can: ``overflow_record_ids``.
    """

    entity: str
    record_ids: frozenset[str]
    gap_event_ids: Mapping[str, tuple[str, ...]]
    full_resync: bool
    overflow_event_ids: tuple[str, ...]
    overflow_record_ids: frozenset[str]

    @property
    def unknowable(self) -> frozenset[str]:
        """Records whose current values events cannot explain: gap and overflow records."""
        return self.record_ids | self.overflow_record_ids


@dataclass
class _Entity:
    fields: list[str]
    compounds: dict[str, tuple[str, ...]]
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: dict[str, None] = field(default_factory=dict)
    gaps: dict[str, list[str]] = field(default_factory=dict)
    overflow_events: list[str] = field(default_factory=list)
    overflow_records: dict[str, list[str]] = field(default_factory=dict)
    modstamps: dict[str, int] = field(default_factory=dict)
    purged: dict[str, None] = field(default_factory=dict)
    names: frozenset[str] = field(init=False)
    # Records changed since the last drain_changes(): what a journal has to write next.
    touched: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.names = frozenset(self.fields)

    def forget(self, record_id: str) -> None:
        """The record is hard-deleted: nothing of it stays but its id in ``purged``."""
        for table in (self.records, self.deleted, self.gaps, self.overflow_records, self.modstamps):
            table.pop(record_id, None)
        self.purged[record_id] = None


class _RecordsView(Mapping[str, Mapping[str, Any]]):
    """Read-only live view of one entity's records."""

    __slots__ = ("_records",)

    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self._records = records

    def __getitem__(self, key: str) -> Mapping[str, Any]:
        return MappingProxyType(self._records[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


class GroundTruth:
    """Per-entity record state after every generated change (semantics: module docstring).

    The read side (:meth:`records`, :meth:`deleted`, :meth:`resync`, :meth:`to_json`) is for
    tests and oracles. The write side (:meth:`register`, :meth:`create`, :meth:`update`, ...)
    is called by the workload generator as it generates each change.
    """

    def __init__(self, *, org_id: str = "") -> None:
        self._org_id = org_id
        self._entities: dict[str, _Entity] = {}
        self._formulas: Mapping[str, Sequence[Formula]] = {}

    # -- read side -------------------------------------------------------------------------

    @property
    def org_id(self) -> str:
        return self._org_id

    @property
    def entities(self) -> tuple[str, ...]:
        """The entities the truth tracks (every change event entity of the catalogue)."""
        return tuple(self._entities)

    def fields(self, entity: str) -> tuple[str, ...]:
        """The entity's field names, in schema order (fields added later at their place)."""
        return tuple(self._entity(entity).fields)

    def records(self, entity: str) -> Mapping[str, Mapping[str, Any]]:
        """Live and deleted records by id (a read-only live view; :meth:`snapshot` copies)."""
        return _RecordsView(self._entity(entity).records)

    def stored_records(self, entity: str) -> Mapping[str, Mapping[str, Any]]:
        """The same records as :meth:`records`, unwrapped, for the emulator's bulk reads (a
        proxy per record makes each value read a slow call): read them, never change them."""
        return self._entity(entity).records

    def record(self, entity: str, record_id: str) -> Mapping[str, Any]:
        """One record's values (read-only)."""
        state = self._entity(entity)
        try:
            return MappingProxyType(state.records[record_id])
        except KeyError:
            raise KeyError(f"{entity} has no record {record_id!r}") from None

    def deleted(self, entity: str) -> frozenset[str]:
        """Ids of the entity's records that are deleted (in the recycle bin)."""
        return frozenset(self._entity(entity).deleted)

    def is_deleted(self, entity: str, record_id: str) -> bool:
        """Whether one record is deleted, without copying the set :meth:`deleted` returns
        (which grows with the run: per event, that copy made a long run ever slower)."""
        return record_id in self._entity(entity).deleted

    def modstamps(self, entity: str) -> Mapping[str, int]:
        """Each record's ``SystemModstamp`` (epoch ms; records written without one are
        absent), a read-only live view."""
        return MappingProxyType(self._entity(entity).modstamps)

    def use_formulas(self, formulas: Mapping[str, Sequence[Formula]]) -> None:
        """Compute these formula fields (entity -> formulas; a catalogue's live mapping, so
        formulas added to it later count too) in :meth:`formula_values`. Formulas are not
        stored: they are functions of the stored values."""
        self._formulas = formulas

    def formula_values(self, entity: str, record_id: str) -> dict[str, Any]:
        """The values of the entity's formula fields for one record (live or deleted), as
        Salesforce computes them when the record is read."""
        values = self._entity(entity).records[record_id]
        return formula_values(self._formulas.get(entity, ()), values)

    def purged(self, entity: str) -> frozenset[str]:
        """Ids of records hard-deleted from the recycle bin (gone from :meth:`records`)."""
        return frozenset(self._entity(entity).purged)

    def live(self, entity: str) -> frozenset[str]:
        """Ids of the entity's records that are not deleted."""
        state = self._entity(entity)
        return frozenset(r for r in state.records if r not in state.deleted)

    def resync(self, entity: str) -> ResyncExpectation:
        """The records of ``entity`` that events cannot reproduce (see the module docstring)."""
        state = self._entity(entity)
        return ResyncExpectation(
            entity=entity,
            record_ids=frozenset(state.gaps),
            gap_event_ids=MappingProxyType({r: tuple(e) for r, e in state.gaps.items()}),
            full_resync=bool(state.overflow_events),
            overflow_event_ids=tuple(state.overflow_events),
            overflow_record_ids=frozenset(state.overflow_records),
        )

    def snapshot(self) -> GroundTruth:
        """A deep, independent copy: later changes to this truth do not affect it."""
        other = GroundTruth(org_id=self._org_id)
        other._entities = copy.deepcopy(self._entities)
        return other

    def to_json(self) -> str:
        """The whole truth as JSON (stable: keys sorted), readable back by :meth:`from_json`.

        Integers stay exact (``commitNumber``-sized values included) and floats round-trip.
        """
        return json.dumps(self._to_obj(), sort_keys=True, ensure_ascii=False, allow_nan=False)

    def export_json(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path`` (UTF-8) and return the path."""
        target = Path(path)
        target.write_text(self.to_json(), encoding="utf-8")
        return target

    @classmethod
    def from_json(cls, text: str) -> GroundTruth:
        """Read a truth written by :meth:`to_json`."""
        obj = json.loads(text)
        if not isinstance(obj, dict) or obj.get("format") != TRUTH_FORMAT:
            got = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(f"expected a ground truth with format {TRUTH_FORMAT!r} (got {got!r})")
        truth = cls(org_id=obj.get("org_id", ""))
        for name, e in obj["entities"].items():
            truth._entities[name] = _Entity(
                fields=list(e["fields"]),
                compounds={k: tuple(v) for k, v in e["compounds"].items()},
                records={r: dict(v) for r, v in e["records"].items()},
                deleted=dict.fromkeys(e["deleted"]),
                gaps={r: list(v) for r, v in e["gaps"].items()},
                overflow_events=list(e["overflow_event_ids"]),
                overflow_records={r: list(v) for r, v in e["overflow_records"].items()},
                modstamps={r: int(v) for r, v in e.get("modstamps", {}).items()},
                purged=dict.fromkeys(e.get("purged", ())),
            )
        return truth

    @classmethod
    def load_json(cls, path: str | Path) -> GroundTruth:
        """Read a truth file written by :meth:`export_json`."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def drain_changes(self) -> dict[str, Any]:
        """What changed since the last call, as JSON-ready data for :meth:`apply_changes`:
        every entity's fields, compounds and overflow events, and the full state of each
        record a write touched (values, deleted flag, gap and overflow events). A journal
        appends these to rebuild the truth after a restart (:mod:`ingest.emulator.truthlog`).
        Record values are the truth's own dicts: serialize them before the truth changes."""
        out = {}
        for name, e in self._entities.items():
            touched, e.touched = e.touched, set()
            out[name] = self._changes(e, sorted(touched))
        return out

    def all_changes(self) -> dict[str, Any]:
        """:meth:`drain_changes` of every record (what rebuilds the whole truth), without
        forgetting what changed since the last drain."""
        return {
            name: self._changes(e, [*e.records, *e.purged]) for name, e in self._entities.items()
        }

    @staticmethod
    def _changes(e: _Entity, ids: list[str]) -> dict[str, Any]:
        kept = [r for r in ids if r in e.records]
        return {
            "fields": list(e.fields),
            "compounds": {k: list(v) for k, v in e.compounds.items()},
            "overflow_event_ids": list(e.overflow_events),
            "records": {r: e.records[r] for r in kept},
            "deleted": [r for r in kept if r in e.deleted],
            "gaps": {r: e.gaps.get(r) for r in kept},
            "overflow_records": {r: e.overflow_records.get(r) for r in kept},
            "modstamps": {r: e.modstamps[r] for r in kept if r in e.modstamps},
            "purged": [r for r in ids if r in e.purged],
        }

    def apply_changes(self, changes: Mapping[str, Any]) -> None:
        """Apply what :meth:`drain_changes` returned (on another truth, or after a restart)."""
        for name, c in changes.items():
            state = self._entities.get(name)
            if state is None:
                state = self._entities[name] = _Entity(fields=list(c["fields"]), compounds={})
            state.fields = list(c["fields"])
            state.names = frozenset(state.fields)
            state.compounds = {k: tuple(v) for k, v in c["compounds"].items()}
            state.overflow_events = list(c["overflow_event_ids"])
            deleted = set(c["deleted"])
            for record_id, values in c["records"].items():
                state.records[record_id] = copy.deepcopy(dict(values))
                if record_id in deleted:
                    state.deleted[record_id] = None
                else:
                    state.deleted.pop(record_id, None)
            for target, key in ((state.gaps, "gaps"), (state.overflow_records, "overflow_records")):
                for record_id, events in c[key].items():
                    if events:
                        target[record_id] = list(events)
                    else:
                        target.pop(record_id, None)
            state.modstamps.update({r: int(v) for r, v in c.get("modstamps", {}).items()})
            for record_id in c.get("purged", ()):
                state.forget(record_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroundTruth):
            return NotImplemented
        return self._to_obj() == other._to_obj()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        counts = ", ".join(
            f"{n}: {len(e.records)} ({len(e.deleted)} deleted)" for n, e in self._entities.items()
        )
        return f"GroundTruth(org_id={self._org_id!r}, {counts})"

    def _to_obj(self) -> dict[str, Any]:
        return {
            "format": TRUTH_FORMAT,
            "org_id": self._org_id,
            "entities": {
                name: {
                    "fields": e.fields,
                    "compounds": {k: list(v) for k, v in e.compounds.items()},
                    "records": e.records,
                    "deleted": sorted(e.deleted),
                    "gaps": e.gaps,
                    "overflow_event_ids": e.overflow_events,
                    "overflow_records": e.overflow_records,
                    "modstamps": e.modstamps,
                    "purged": sorted(e.purged),
                }
                for name, e in self._entities.items()
            },
        }

    def _entity(self, entity: str) -> _Entity:
        try:
            return self._entities[entity]
        except KeyError:
            known = ", ".join(self._entities) or "none"
            raise KeyError(
                f"the ground truth has no entity {entity!r} (entities: {known})"
            ) from None

    # -- write side (the generator) ------------------------------------------------------------

    def register(
        self, entity: str, fields: Iterable[str], compounds: Mapping[str, Iterable[str]]
    ) -> None:
        """Track ``entity`` with ``fields`` (schema order); ``compounds`` maps each compound
        field to its children. Registering again adds new fields to every record as ``None``
        (a schema change); fields the new list lacks stay, with their last values."""
        names = list(fields)
        state = self._entities.get(entity)
        if state is None:
            self._entities[entity] = _Entity(
                fields=names, compounds={k: tuple(v) for k, v in compounds.items()}
            )
            return
        added = [n for n in names if n not in state.fields]
        state.fields = names + [n for n in state.fields if n not in names]
        state.names = frozenset(state.fields)
        state.compounds.update({k: tuple(v) for k, v in compounds.items()})
        for values in state.records.values():
            for n in added:
                values[n] = None
        if added:
            state.touched.update(state.records)

    def create(
        self,
        entity: str,
        record_id: str,
        values: Mapping[str, Any],
        *,
        event_id: str,
        gap: bool = False,
        owned: bool = False,
        modstamp: int | None = None,
    ) -> None:
        """A new live record with ``values`` (every field; missing ones are ``None``).

        With ``owned=True`` the caller hands ``values`` (and the dicts in it) over and never
        touches them again, so a dict with exactly the entity's fields is kept without a copy.
        """
        state = self._entity(entity)
        if record_id in state.records:
            raise ValueError(f"{entity} {record_id} already exists; a CREATE needs a new id")
        state.records[record_id] = (
            self._adopt(state, values) if owned else self._full(state, values)
        )
        self._after_full_image(state, record_id, event_id, gap=gap)
        self._stamp(state, record_id, modstamp)

    def update(
        self,
        entity: str,
        record_id: str,
        changes: Mapping[str, Any],
        *,
        event_id: str,
        gap: bool = False,
        modstamp: int | None = None,
    ) -> None:
        """Apply ``changes`` (top-level names or ``Parent.Child`` names) to a live record."""
        state = self._entity(entity)
        values = state.records.get(record_id)
        if values is None or record_id in state.deleted:
            self._require_live(state, entity, record_id, "UPDATE")
        self._apply(state, values, changes)  # type: ignore[arg-type]
        if gap:
            state.gaps.setdefault(record_id, []).append(event_id)
        self._stamp(state, record_id, modstamp)

    def delete(
        self,
        entity: str,
        record_id: str,
        *,
        event_id: str,
        gap: bool = False,
        modstamp: int | None = None,
    ) -> None:
        """Move a live record to the recycle bin, keeping its values."""
        state = self._entity(entity)
        self._require_live(state, entity, record_id, "DELETE")
        state.deleted[record_id] = None
        if gap:
            state.gaps.setdefault(record_id, []).append(event_id)
        self._stamp(state, record_id, modstamp)

    def hard_delete(self, entity: str, record_id: str) -> None:
        """Empty one record from the recycle bin: it is gone for good, with no event (as
        Salesforce's ``emptyRecycleBin`` or the bin's own expiry does)."""
        state = self._entity(entity)
        if record_id not in state.deleted:
            raise ValueError(
                f"{entity} {record_id} is not in the recycle bin; only deleted records can be "
                "hard-deleted from it"
            )
        state.forget(record_id)
        state.touched.add(record_id)

    def undelete(
        self,
        entity: str,
        record_id: str,
        values: Mapping[str, Any],
        *,
        event_id: str,
        gap: bool = False,
        owned: bool = False,
        modstamp: int | None = None,
    ) -> None:
        """Restore a deleted record with ``values`` (its full image after the undelete);
        ``owned`` as for :meth:`create`."""
        state = self._entity(entity)
        if record_id not in state.deleted:
            raise ValueError(
                f"{entity} {record_id} is not deleted; UNDELETE needs a deleted record"
            )
        del state.deleted[record_id]
        state.records[record_id] = (
            self._adopt(state, values) if owned else self._full(state, values)
        )
        self._after_full_image(state, record_id, event_id, gap=gap)
        self._stamp(state, record_id, modstamp)

    def overflow(
        self,
        entity: str,
        changes: Mapping[str, Mapping[str, Any]],
        *,
        event_id: str,
        modstamp: int | None = None,
    ) -> None:
        """A GAP_OVERFLOW: ``changes`` (record id -> changes) happened with no event naming them."""
        state = self._entity(entity)
        state.overflow_events.append(event_id)
        for record_id, record_changes in changes.items():
            self._require_live(state, entity, record_id, "overflow change")
            self._apply(state, state.records[record_id], record_changes)
            state.overflow_records.setdefault(record_id, []).append(event_id)
            self._stamp(state, record_id, modstamp)

    def null_everywhere(self, entity: str, field_name: str) -> tuple[str, ...]:
        """A wildcard UPDATE: ``field_name`` becomes ``None`` on every record, live and deleted.
        Returns the ids of the records whose value changed."""
        state = self._entity(entity)
        if field_name not in state.names or field_name in state.compounds:
            raise ValueError(f"{field_name!r} is not a scalar field of {entity}")
        changed = []
        for record_id, values in state.records.items():
            if values.get(field_name) is not None:
                values[field_name] = None
                changed.append(record_id)
        state.touched.update(changed)
        return tuple(changed)

    @staticmethod
    def _stamp(state: _Entity, record_id: str, modstamp: int | None) -> None:
        if modstamp is not None:
            state.modstamps[record_id] = modstamp
        state.touched.add(record_id)

    @staticmethod
    def _require_live(state: _Entity, entity: str, record_id: str, what: str) -> None:
        if record_id not in state.records:
            raise ValueError(f"{what} of unknown {entity} {record_id}")
        if record_id in state.deleted:
            raise ValueError(f"{what} of deleted {entity} {record_id}")

    @staticmethod
    def _after_full_image(state: _Entity, record_id: str, event_id: str, *, gap: bool) -> None:
        state.overflow_records.pop(record_id, None)
        if gap:
            state.gaps[record_id] = [event_id]
        else:
            state.gaps.pop(record_id, None)

    @classmethod
    def _adopt(cls, state: _Entity, values: Mapping[str, Any]) -> dict[str, Any]:
        if values.__class__ is not dict or values.keys() != state.names:
            return cls._full(state, values)
        adopted: dict[str, Any] = values
        for name, children in state.compounds.items():
            value = adopted[name]
            if value is not None and (value.__class__ is dict or isinstance(value, Mapping)):
                adopted[name] = _normal_compound(children, value)
        return adopted

    @staticmethod
    def _full(state: _Entity, values: Mapping[str, Any]) -> dict[str, Any]:
        if values.keys() != state.names:
            unknown = [k for k in values if k not in state.names]
            if unknown:
                raise ValueError(f"unknown fields {unknown} (fields: {', '.join(state.fields)})")
        get = values.get
        out = {name: get(name) for name in state.fields}
        for name, children in state.compounds.items():
            value = out[name]
            if value is not None and (value.__class__ is dict or isinstance(value, Mapping)):
                out[name] = _normal_compound(children, value)
        return out

    @staticmethod
    def _apply(state: _Entity, values: dict[str, Any], changes: Mapping[str, Any]) -> None:
        names = state.names
        compounds = state.compounds
        for name, value in changes.items():
            if name in names and (name not in compounds or not isinstance(value, Mapping)):
                values[name] = value
                continue
            parent, _, child = name.partition(".")
            if parent not in state.names:
                raise ValueError(f"unknown field {name!r} (fields: {', '.join(state.fields)})")
            if not child:
                if parent in state.compounds and isinstance(value, Mapping):
                    values[parent] = _normal_compound(state.compounds[parent], value)
                else:
                    values[parent] = value
                continue
            children = state.compounds.get(parent)
            if children is None or child not in children:
                raise ValueError(f"{name!r} is not a child of a compound field")
            current = values.get(parent)
            merged = dict(current) if isinstance(current, Mapping) else dict.fromkeys(children)
            merged[child] = value
            values[parent] = _normal_compound(children, merged)


def _normal_compound(children: tuple[str, ...], value: Mapping[str, Any]) -> dict[str, Any] | None:
    if len(value) > len(children) or not all(k in children for k in value):
        unknown = [k for k in value if k not in children]
        raise ValueError(f"unknown compound children {unknown} (children: {', '.join(children)})")
    get = value.get
    out = {c: get(c) for c in children}
    for v in out.values():
        if v is not None:
            return out
    return None
