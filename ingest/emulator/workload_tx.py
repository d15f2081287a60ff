"""The workload's transaction kinds: :class:`Transactions` picks the next kind and object by
the mix, and runs one Salesforce transaction of that kind (create, update, bulk and mass
update, delete with its cascade, mass delete, undelete with what the cascade took, lead
conversion, gap events, an overflow, a wildcard update): it picks records, asks
:class:`~ingest.emulator.workload_values.FieldValues` for values, emits the events through the
:class:`~ingest.emulator.workload_emit.Emitter` and applies them through
:class:`~ingest.emulator.workload_records.Records`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ingest.emulator.cometd.fields import describe_type, lossy_conversion
from ingest.emulator.topics import Catalogue, EmittedEvent
from ingest.emulator.truth import GroundTruth
from ingest.emulator.values import ValueFactory
from ingest.emulator.workload_emit import ChangeTypeName, Emitter, Tx
from ingest.emulator.workload_mix import Choice, TransactionKind, WorkloadMix, entity_weights
from ingest.emulator.workload_plans import Plan
from ingest.emulator.workload_records import Item, Records
from ingest.emulator.workload_values import FieldValues

__all__ = ["Transactions"]

_GAP_TYPES: tuple[ChangeTypeName, ...] = ("GAP_CREATE", "GAP_UPDATE", "GAP_DELETE", "GAP_UNDELETE")


class Transactions:
    """Runs the transactions the mix asks for against the records of ``plans``' objects.

    ``plans`` is the workload's own (mutable) mapping of entity -> current plan;
    ``platform_events`` whether the catalogue has platform event topics (else that kind is
    never picked). Raises ``ValueError`` when ``mix.entity_weights`` names an unknown object.
    """

    def __init__(
        self,
        random_: Callable[[], float],
        values: ValueFactory,
        *,
        plans: Mapping[str, Plan],
        records: Records,
        fields: FieldValues,
        emitter: Emitter,
        truth: GroundTruth,
        catalogue: Catalogue,
        users: tuple[str, ...],
        mix: WorkloadMix,
        platform_events: bool,
    ) -> None:
        self._random = random_
        self._values = values
        self._plans = plans
        self._records = records
        self._fields = fields
        self._emitter = emitter
        self._truth = truth
        self._catalogue = catalogue
        self._users = users
        self._platform_events = platform_events
        self._kind_choices: dict[tuple[bool, bool], Choice] = {}
        self.set_mix(mix)

    def set_mix(self, mix: WorkloadMix) -> None:
        """Pick the next kinds and objects by ``mix`` (unchanged when it names an unknown
        object)."""
        weights = entity_weights(mix, list(self._plans))
        self._mix = mix
        self._entity_weights = weights
        self._entity_choice = Choice(self._entity_weights)
        self._kind_choices.clear()

    # -- picking --------------------------------------------------------------------------------

    def pick_kind(self) -> TransactionKind:
        """The next transaction's kind, among those possible now."""
        if not self._plans:
            return "platform_event"
        live = self._records.live_total > 0
        dead = self._records.dead_total > 0
        choice = self._kind_choices.get((live, dead))
        if choice is None:
            weights: dict[str, float] = {str(k): w for k, w in self._mix.weights().items()}
            if not self._platform_events:
                weights["platform_event"] = 0.0
            if not live:
                for kind in ("update", "bulk_update", "mass_update", "delete", "mass_delete"):
                    weights[kind] = 0.0
                weights["overflow"] = weights["wildcard"] = 0.0
            if not dead:
                weights["undelete"] = 0.0
            if "Account" not in self._plans or "Opportunity" not in self._plans:
                weights["lead_conversion"] = 0.0
            choice = self._kind_choices[(live, dead)] = Choice(weights)
        picked = choice.pick(self._random)
        return "create" if picked is None else picked  # type: ignore[return-value]

    def _pick_entity(self, *, min_live: int = 0, min_dead: int = 0) -> str | None:
        live, dead = self._records.live, self._records.dead
        # Rejection sampling from the full weights gives the same distribution as the filtered
        # weights below, and nearly always succeeds at once.
        for _ in range(4):
            entity = self._entity_choice.pick(self._random)
            if entity is None:
                return None
            if len(live[entity]) >= min_live and len(dead[entity]) >= min_dead:
                return entity
        weights = {
            e: w
            for e, w in self._entity_weights.items()
            if len(live[e]) >= min_live and len(dead[e]) >= min_dead
        }
        return self._weighted(weights)

    def _weighted(self, weights: Mapping[str, float]) -> str | None:
        return Choice(weights).pick(self._random)

    # -- running one ----------------------------------------------------------------------------

    def run(self, kind: TransactionKind) -> list[EmittedEvent]:
        """One transaction of change events of ``kind`` (not ``platform_event``); when that
        kind does not fit right now, an update (while holding a live share) or a create."""
        tx = self._emitter.begin(bulk=kind in ("mass_update", "mass_delete", "overflow"))
        handler: Callable[[Tx], bool] = getattr(self, f"_tx_{kind}")
        if not handler(tx):
            # Handlers give up before emitting anything (nothing fits right now): a CREATE
            # always fits.
            if tx.events:
                raise RuntimeError(f"transaction kind {kind} failed after emitting events")
            if not (self._mix.live_share and self._records.live_total and self._tx_update(tx)):
                self._tx_create(tx)
        return tx.events

    def _tx_create(self, tx: Tx) -> bool:
        entity = self._pick_entity()
        if entity is None:
            entity = next(iter(self._plans))
        plan = self._plans[entity]
        count = 1 if self._random() < 0.8 else self._values.between(2, 4)
        for _ in range(count):
            item = self._fields.new_record(tx, plan)
            event_id = self._emitter.emit(tx, plan, "CREATE", [item.record_id], item)
            self._records.apply_create(plan, item, event_id, gap=False)
        return True

    def _tx_update(self, tx: Tx, *, records: int = 1) -> bool:
        entity = self._pick_entity(min_live=1)
        if entity is None:
            return False
        plan = self._plans[entity]
        live = self._records.live[entity]
        chosen: list[str] = []
        for _ in range(records * 2):
            candidate = live.pick(self._random)
            if candidate not in chosen:
                chosen.append(candidate)
            if len(chosen) == records:
                break
        items = []
        for record_id in chosen:
            changes, diffs = self._fields.changes(
                tx, plan, record_id, count=self._values.pick((1, 1, 1, 2, 2, 3))
            )
            if changes:
                items.append(self._fields.update_item(tx, plan, record_id, changes, diffs))
        if not items:
            return False
        event_ids = self._emitter.emit_grouped(tx, plan, "UPDATE", items)
        for item in items:
            self._records.apply_update(plan, item, event_ids[item.record_id], gap=False)
        return True

    def _tx_bulk_update(self, tx: Tx) -> bool:
        return self._tx_update(tx, records=self._values.between(2, 4))

    def _mass_change(self, tx: Tx, *, low: int, high: int) -> tuple[Plan, list[Item]] | None:
        """The same change of one field to ``low``..``high`` live records of one object."""
        entity = self._pick_entity(min_live=low)
        if entity is None:
            return None
        plan = self._plans[entity]
        if not plan.mass:
            return None
        fp = self._values.pick(plan.mass)
        name = fp.info.name
        if fp.info.kind != "boolean" and not fp.required and self._random() < 0.2:
            value = None
        else:
            value = self._fields.scalar(fp, tx)
        wanted = self._values.between(low, high)
        chosen: list[str] = []
        for _ in range(wanted * 3):
            candidate = self._records.live[entity].pick(self._random)
            if candidate in chosen or self._records.record(entity, candidate).get(name) == value:
                continue
            chosen.append(candidate)
            if len(chosen) == wanted:
                break
        if len(chosen) < low:
            return None
        items = [self._fields.update_item(tx, plan, rid, {name: value}, {}) for rid in chosen]
        return plan, items

    def _tx_mass_update(self, tx: Tx) -> bool:
        found = self._mass_change(tx, low=2, high=self._mix.max_batch)
        if found is None:
            return False
        plan, items = found
        event_ids = self._emitter.emit_grouped(tx, plan, "UPDATE", items)
        for item in items:
            self._records.apply_update(plan, item, event_ids[item.record_id], gap=False)
        return True

    def _tx_delete(self, tx: Tx) -> bool:
        entity = self._pick_entity(min_live=1)
        if entity is None:
            return False
        for _ in range(8):
            record_id = self._records.live[entity].pick(self._random)
            members = self._records.deletion_set(entity, record_id)
            if members is not None:
                break
        else:
            return False
        event_id = self._emitter.emit(tx, self._plans[entity], "DELETE", [record_id], None)
        self._records.apply_delete(entity, record_id, event_id, gap=False)
        children = members[1:]
        by_entity: dict[str, list[str]] = {}
        for child_entity, child_id in children:
            by_entity.setdefault(child_entity, []).append(child_id)
        for child_entity, ids in by_entity.items():
            # The cascade makes the same (empty) change to every child: one event per object.
            event_id = self._emitter.emit(tx, self._plans[child_entity], "DELETE", ids, None)
            for child_id in ids:
                self._records.apply_delete(child_entity, child_id, event_id, gap=False)
        if children:
            self._records.cascaded(record_id, children)
        return True

    def _tx_mass_delete(self, tx: Tx) -> bool:
        entity = self._pick_entity(min_live=2)
        if entity is None:
            return False
        chosen = self._records.deletable_alone(entity, self._values.between(2, self._mix.max_batch))
        if len(chosen) < 2:
            return False
        event_id = self._emitter.emit(tx, self._plans[entity], "DELETE", chosen, None)
        for record_id in chosen:
            self._records.apply_delete(entity, record_id, event_id, gap=False)
        return True

    def _tx_undelete(self, tx: Tx) -> bool:
        entity = self._pick_entity(min_dead=1)
        if entity is None:
            return False
        for _ in range(8):
            record_id = self._records.dead[entity].pick(self._random)
            members = self._records.restore_set(entity, record_id)
            if members is not None:
                break
        else:
            return False
        for member_entity, member_id in members:
            plan = self._plans[member_entity]
            item = self._fields.undelete_item(tx, plan, member_id)
            event_id = self._emitter.emit(tx, plan, "UNDELETE", [member_id], item)
            self._records.apply_undelete(plan, item, event_id, gap=False)
        return True

    def _tx_lead_conversion(self, tx: Tx) -> bool:
        emit, records = self._emitter.emit, self._records
        account_plan = self._plans["Account"]
        opportunity_plan = self._plans["Opportunity"]
        contact_plan = self._plans.get("Contact")
        person = self._random() < self._mix.person_account_ratio
        account = self._fields.new_record(tx, account_plan, person=person)
        event_id = emit(tx, account_plan, "CREATE", [account.record_id], account)
        records.apply_create(account_plan, account, event_id, gap=False)
        contact_id = None
        if contact_plan is not None and not records.meta["Account"][account.record_id].person:
            contact = self._fields.new_record(tx, contact_plan)
            _relink(contact_plan, contact, {"AccountId": account.record_id, "ReportsToId": None})
            event_id = emit(tx, contact_plan, "CREATE", [contact.record_id], contact)
            records.apply_create(contact_plan, contact, event_id, gap=False)
            contact_id = contact.record_id
        opportunity = self._fields.new_record(tx, opportunity_plan)
        _relink(
            opportunity_plan,
            opportunity,
            {"AccountId": account.record_id, "ContactId": contact_id, "LeadSource": "Web"},
        )
        event_id = emit(tx, opportunity_plan, "CREATE", [opportunity.record_id], opportunity)
        records.apply_create(opportunity_plan, opportunity, event_id, gap=False)
        # The converted Lead is updated last; Lead has no change events here, so its sequence
        # number is never seen.
        self._emitter.next_seq(tx)
        return True

    def _tx_gap(self, tx: Tx) -> bool:
        gap_type = self._values.pick(_GAP_TYPES[1:] if self._mix.live_share else _GAP_TYPES)
        count = self._values.between(1, 3)
        emit, records = self._emitter.emit, self._records
        if gap_type == "GAP_CREATE":
            entity = self._pick_entity()
            if entity is None:
                return False
            plan = self._plans[entity]
            items = [self._fields.new_record(tx, plan) for _ in range(count)]
            event_id = emit(tx, plan, gap_type, [i.record_id for i in items], None)
            for item in items:
                records.apply_create(plan, item, event_id, gap=True)
            return True
        if gap_type == "GAP_UPDATE":
            entity = self._pick_entity(min_live=1)
            if entity is None:
                return False
            plan = self._plans[entity]
            items = []
            for record_id in dict.fromkeys(
                records.live[entity].pick(self._random) for _ in range(count)
            ):
                changes, diffs = self._fields.changes(tx, plan, record_id, count=2)
                if changes:
                    items.append(self._fields.update_item(tx, plan, record_id, changes, diffs))
            if not items:
                return False
            event_id = emit(tx, plan, gap_type, [i.record_id for i in items], None)
            for item in items:
                records.apply_update(plan, item, event_id, gap=True)
            return True
        if gap_type == "GAP_DELETE":
            entity = self._pick_entity(min_live=1)
            if entity is None:
                return False
            chosen = records.deletable_alone(entity, count)
            if not chosen:
                return False
            event_id = emit(tx, self._plans[entity], gap_type, chosen, None)
            for record_id in chosen:
                records.apply_delete(entity, record_id, event_id, gap=True)
            return True
        entity = self._pick_entity(min_dead=1)
        if entity is None:
            return False
        plan = self._plans[entity]
        chosen = []
        for record_id in dict.fromkeys(
            records.dead[entity].pick(self._random) for _ in range(count)
        ):
            if records.undeletable(entity, record_id, set()):
                chosen.append(record_id)
        if not chosen:
            return False
        items = [self._fields.undelete_item(tx, plan, record_id) for record_id in chosen]
        event_id = emit(tx, plan, gap_type, chosen, None)
        for item in items:
            records.apply_undelete(plan, item, event_id, gap=True)
        return True

    def _tx_overflow(self, tx: Tx) -> bool:
        found = self._mass_change(tx, low=3, high=self._mix.max_batch * 2)
        if found is None:
            return False
        plan, items = found
        described = items[: max(1, len(items) // 3)]
        silent = items[len(described) :]
        event_ids = self._emitter.emit_grouped(tx, plan, "UPDATE", described)
        for item in described:
            self._records.apply_update(plan, item, event_ids[item.record_id], gap=False)
        silent_ids = [item.record_id for item in silent]
        event_id = self._emitter.emit(tx, plan, "GAP_OVERFLOW", [], None, affected=silent_ids)
        self._truth.overflow(
            plan.entity,
            {item.record_id: item.changes for item in silent},
            event_id=event_id,
            modstamp=tx.timestamp,
        )
        return True

    def _tx_wildcard(self, tx: Tx) -> bool:
        live, dead = self._records.live, self._records.dead
        candidates = {
            e: w
            for e, w in self._entity_weights.items()
            if self._plans[e].wildcard and (len(live[e]) or len(dead[e]))
        }
        entity = self._weighted(candidates)
        if entity is None:
            return False
        plan = self._plans[entity]
        fp = self._values.pick(plan.wildcard)
        name = fp.info.name
        tx.origin = ""
        tx.user = self._users[0]
        item = Item(record_id="", body={}, changed=(name,), nulled=(name,))
        # The field's type is converted (describe shows the new type) and its data lost.
        current = describe_type(fp.info, dict(self._catalogue.retyped_of(entity)))
        converted = lossy_conversion(current)
        assert converted is not None, f"{entity}.{name}: no lossy conversion from {current}"
        self._catalogue.retype_field(entity, name, converted)
        affected = self._truth.null_everywhere(entity, name)
        self._emitter.emit(tx, plan, "UPDATE", [f"{plan.prefix}*"], item, affected=affected)
        return True


def _relink(plan: Plan, item: Item, values: Mapping[str, Any]) -> None:
    """Set lookups (and other fields) of a new record before it is emitted."""
    for name, value in values.items():
        if plan.has(name):
            item.changes[name] = value
            item.body[name] = value
