"""The workload's bookkeeping of the org's records, beside the ground truth: which records are
live and which deleted (:class:`IdSet` per object, for O(1) random picks), what each record was
created as (:class:`Meta`), who references whom (so deletes cascade and nothing live points at
a deleted record) and what a cascade took along (so an undelete brings it back).

:class:`Records` applies each change to the :class:`~ingest.emulator.truth.GroundTruth` and to
this bookkeeping together, one :class:`Item` (a record's part of an event) at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.emulator.ids import key_prefix
from ingest.emulator.textdiff import Newline
from ingest.emulator.truth import GroundTruth
from ingest.emulator.workload_plans import CASCADE, Plan

__all__ = ["IdSet", "Item", "Meta", "Records"]


@dataclass(slots=True)
class Item:
    """One record's part of an event: body, bitmap names, and what the truth must apply."""

    record_id: str
    body: dict[str, Any]
    changed: tuple[str, ...] = ()
    nulled: tuple[str, ...] = ()
    diffed: tuple[str, ...] = ()
    changes: dict[str, Any] = field(default_factory=dict)

    def same_event(self, other: Item) -> bool:
        return (
            self.changed == other.changed
            and self.nulled == other.nulled
            and self.diffed == other.diffed
            and self.body == other.body
        )


@dataclass(slots=True)
class Meta:
    newline: Newline
    person: bool
    order: int
    cascade_root: str | None = None


class IdSet:
    """An ordered set with O(1) add, remove and random pick (deterministic order)."""

    __slots__ = ("_index", "_items")

    def __init__(self) -> None:
        self._items: list[str] = []
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        return item in self._index

    def add(self, item: str) -> None:
        if item not in self._index:
            self._index[item] = len(self._items)
            self._items.append(item)

    def remove(self, item: str) -> None:
        i = self._index.pop(item)
        last = self._items.pop()
        if i < len(self._items):
            self._items[i] = last
            self._index[last] = i

    def pick(self, random_: Callable[[], float]) -> str:
        return self._items[int(random_() * len(self._items))]


class Records:
    """Live and deleted records per object, their metadata and links, kept with the truth.

    ``entities`` are the objects with change events; ``plans`` is the workload's own
    (mutable) mapping of entity -> current :class:`Plan`; ``prefixes`` maps each entity to its
    key prefix; ``random_`` is the seeded generator's ``random``.
    """

    def __init__(
        self,
        truth: GroundTruth,
        entities: list[str],
        *,
        plans: Mapping[str, Plan],
        prefixes: Mapping[str, str],
        random_: Callable[[], float],
        now_ms: Callable[[], int] = lambda: 0,
    ) -> None:
        self._truth = truth
        # The commit time of the transaction being generated: each record it saves gets it
        # as its SystemModstamp.
        self._now = now_ms
        self._plans = plans
        self._prefixes = prefixes
        self._random = random_
        self.live: dict[str, IdSet] = {e: IdSet() for e in entities}
        self.live_total = 0
        self.dead_total = 0
        self.dead: dict[str, IdSet] = {e: IdSet() for e in entities}
        self.meta: dict[str, dict[str, Meta]] = {e: {} for e in entities}
        self._referrers: dict[str, dict[tuple[str, str, str], None]] = {}
        self._cascaded: dict[str, list[tuple[str, str]]] = {}
        self.created = 0

    def record(self, entity: str, record_id: str) -> Mapping[str, Any]:
        return self._truth.record(entity, record_id)

    def new_meta(self, entity: str, record_id: str, *, newline: Newline, person: bool) -> Meta:
        """Register a record being created (its creation order is the next one)."""
        self.created += 1
        meta = self.meta[entity][record_id] = Meta(
            newline=newline, person=person, order=self.created
        )
        return meta

    def below_live_share(self, share: float) -> bool:
        """Whether fewer than ``share`` of the records are live."""
        return share > 0 and self.live_total < share * (self.live_total + self.dead_total)

    # -- links ----------------------------------------------------------------------------------

    def targets(self, plan: Plan, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(lookup field, referenced id) of ``values``' non-null lookups."""
        out = []
        for name, fp in plan.fields.items():
            if fp.category == "lookup" and values.get(name) is not None:
                out.append((name, str(values[name])))
        return out

    def _link(self, plan: Plan, record_id: str, values: Mapping[str, Any]) -> None:
        for name, target in self.targets(plan, values):
            self._referrers.setdefault(target, {})[(plan.entity, record_id, name)] = None

    def _unlink(self, plan: Plan, record_id: str, values: Mapping[str, Any]) -> None:
        for name, target in self.targets(plan, values):
            refs = self._referrers.get(target)
            if refs is not None:
                refs.pop((plan.entity, record_id, name), None)
                if not refs:
                    del self._referrers[target]

    def is_live(self, record_id: str) -> bool:
        prefix = key_prefix(record_id)
        for entity, p in self._prefixes.items():
            if p == prefix:
                return record_id in self.live[entity]
        return False

    def live_pick(
        self, entity: str, *, where: Callable[[str], Any] | None = None, tries: int = 8
    ) -> str | None:
        """A random live record of ``entity`` for which ``where`` holds (``tries`` draws)."""
        live = self.live.get(entity)
        if not live:
            return None
        for _ in range(tries):
            candidate = live.pick(self._random)
            if where is None or where(candidate):
                return candidate
        return None

    # -- operations (apply to the truth and the bookkeeping) ------------------------------------

    def apply_create(self, plan: Plan, item: Item, event_id: str, *, gap: bool) -> None:
        self._truth.create(
            plan.entity,
            item.record_id,
            item.changes,
            event_id=event_id,
            gap=gap,
            owned=True,
            modstamp=self._now(),
        )
        self.live[plan.entity].add(item.record_id)
        self.live_total += 1
        self._link(plan, item.record_id, item.changes)

    def apply_update(self, plan: Plan, item: Item, event_id: str, *, gap: bool) -> None:
        relink = not plan.lookups.isdisjoint(item.changes)
        if relink:
            self._unlink(plan, item.record_id, self.record(plan.entity, item.record_id))
        self._truth.update(
            plan.entity,
            item.record_id,
            item.changes,
            event_id=event_id,
            gap=gap,
            modstamp=self._now(),
        )
        if relink:
            self._link(plan, item.record_id, self.record(plan.entity, item.record_id))

    def apply_delete(self, entity: str, record_id: str, event_id: str, *, gap: bool) -> None:
        plan = self._plans[entity]
        self._truth.delete(entity, record_id, event_id=event_id, gap=gap, modstamp=self._now())
        self.live[entity].remove(record_id)
        self.dead[entity].add(record_id)
        self.dead_total += 1
        self.live_total -= 1
        self._unlink(plan, record_id, self.record(entity, record_id))

    def apply_undelete(self, plan: Plan, item: Item, event_id: str, *, gap: bool) -> None:
        entity = plan.entity
        self._truth.undelete(
            entity,
            item.record_id,
            item.changes,
            event_id=event_id,
            gap=gap,
            owned=True,
            modstamp=self._now(),
        )
        self.dead[entity].remove(item.record_id)
        self.live[entity].add(item.record_id)
        self.dead_total -= 1
        self.live_total += 1
        self.meta[entity][item.record_id].cascade_root = None
        self._cascaded.pop(item.record_id, None)
        self._link(plan, item.record_id, item.changes)

    def hard_delete(self, entity: str, count: int) -> list[str]:
        """Empty up to ``count`` records of ``entity`` from the recycle bin (no event): records
        whose delete cascaded to nothing, so no undelete can want them back later."""
        dead = self.dead[entity]
        chosen: list[str] = []
        for _ in range(count * 5):
            if len(chosen) == count or not len(dead):
                break
            candidate = dead.pick(self._random)
            meta = self.meta[entity].get(candidate)
            if (
                candidate in chosen
                or self._cascaded.get(candidate)
                or (meta is not None and meta.cascade_root is not None)
            ):
                continue
            chosen.append(candidate)
        for record_id in chosen:
            self._truth.hard_delete(entity, record_id)
            dead.remove(record_id)
            self.dead_total -= 1
        return chosen

    def cascaded(self, record_id: str, children: list[tuple[str, str]]) -> None:
        """Remember the children (entity, id) that deleting ``record_id`` deleted with it."""
        for child_entity, child_id in children:
            self.meta[child_entity][child_id].cascade_root = record_id
        self._cascaded[record_id] = children

    # -- what may be deleted or undeleted -------------------------------------------------------

    def deletion_set(self, entity: str, record_id: str) -> list[tuple[str, str]] | None:
        """The records deleting ``record_id`` deletes (itself first, then cascaded children),
        or ``None`` when a live record outside that set still references one of them."""
        members = [(entity, record_id)]
        for child_entity, child_field in CASCADE.get(entity, ()):
            if child_entity not in self._plans:
                continue
            for ref_entity, ref_id, ref_field in self._referrers.get(record_id, {}):
                if ref_entity == child_entity and ref_field == child_field:
                    members.append((ref_entity, ref_id))
        ids = {m[1] for m in members}
        for _, member in members:
            for _, ref_id, _ in self._referrers.get(member, {}):
                if ref_id not in ids:
                    return None
        return members

    def deletable_alone(self, entity: str, count: int) -> list[str]:
        """Up to ``count`` random live records of ``entity`` that nothing references."""
        chosen: list[str] = []
        for _ in range(count * 3):
            candidate = self.live[entity].pick(self._random)
            if candidate not in chosen and not self._referrers.get(candidate):
                chosen.append(candidate)
            if len(chosen) == count:
                break
        return chosen

    def undeletable(self, entity: str, record_id: str, coming_back: set[str]) -> bool:
        """Whether every record ``record_id`` references is live or in ``coming_back``."""
        plan = self._plans[entity]
        record = self.record(entity, record_id)
        return all(
            self.is_live(target) or target in coming_back
            for _, target in self.targets(plan, record)
        )

    def restore_set(self, entity: str, record_id: str) -> list[tuple[str, str]] | None:
        """The records undeleting ``record_id`` brings back (itself first, then the children
        its delete cascaded to that can come back), or ``None`` when it cannot come back."""
        if not self.undeletable(entity, record_id, set()):
            return None
        members = [(entity, record_id)]
        coming_back = {record_id}
        for child_entity, child_id in self._cascaded.get(record_id, ()):
            if child_id in self.dead[child_entity]:
                meta = self.meta[child_entity][child_id]
                if meta.cascade_root == record_id:
                    members.append((child_entity, child_id))
                    coming_back.add(child_id)
        # Children whose other lookups point at records that stay deleted stay in the recycle
        # bin too; dropping one can strand another that points at it, hence the fixpoint.
        dropped = True
        while dropped:
            dropped = False
            for member_entity, member_id in members[1:]:
                if member_id in coming_back and not self.undeletable(
                    member_entity, member_id, coming_back
                ):
                    coming_back.discard(member_id)
                    dropped = True
        return [m for m in members if m[1] in coming_back]
