"""What a :class:`~ingest.emulator.workload.Workload` generates how often: :class:`WorkloadMix`
(re-exported by :mod:`ingest.emulator.workload`), the per-object weights it resolves to, and
:class:`Choice`, the weighted pick with one random draw that every weighted decision uses.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["Choice", "TransactionKind", "WorkloadMix", "entity_weights"]

TransactionKind = Literal[
    "create",
    "update",
    "bulk_update",
    "mass_update",
    "delete",
    "mass_delete",
    "undelete",
    "lead_conversion",
    "gap",
    "overflow",
    "wildcard",
    "platform_event",
]
_KINDS: tuple[TransactionKind, ...] = (
    "create",
    "update",
    "bulk_update",
    "mass_update",
    "delete",
    "mass_delete",
    "undelete",
    "lead_conversion",
    "gap",
    "overflow",
    "wildcard",
    "platform_event",
)
_DEFAULT_ENTITY_WEIGHTS = {"Account": 3.0, "Contact": 4.0, "Opportunity": 3.0, "Invoice__c": 2.0}


@dataclass(frozen=True)
class WorkloadMix:
    """Relative weights of transaction kinds, and a few shape parameters.

    Weights need not sum to anything; a kind that is impossible at the moment (an UNDELETE
    with nothing deleted) is skipped for that transaction. The defaults follow what a busy org
    sends: mostly single-record updates, a steady share of creates, a few mass operations,
    rare gaps and overflows. ``entity_weights`` picks the object a transaction works on;
    ``None`` means realistic defaults for the shipped objects and 1.0 for any other; an object
    left out of a given mapping gets weight 0 (it still receives cascades and lead
    conversions).
    ``fill_ratio`` is the share of optional fields a new record fills, ``long_text_ratio`` the
    share of long text values of 1,000+ characters, ``long_text_edit_ratio`` how often an
    update prefers a long text field (the source of diffs), ``max_batch`` the records of one
    mass operation.
    ``live_share`` above 0 holds the population: while fewer than that share of the records
    created so far are live, a delete becomes an undelete; a gap never creates a record; and a
    transaction that does not fit changes a live record instead of creating one. With
    ``create`` and ``lead_conversion`` at 0 the number of records then stays where it is, which
    deletes would otherwise drain (and the fallback creates refill) within a few hundred
    thousand events.
    """

    create: float = 15.0
    update: float = 48.0
    bulk_update: float = 4.0
    mass_update: float = 3.0
    delete: float = 3.0
    mass_delete: float = 1.0
    undelete: float = 2.0
    lead_conversion: float = 3.0
    gap: float = 0.4
    overflow: float = 0.02
    wildcard: float = 0.01
    platform_event: float = 8.0
    entity_weights: Mapping[str, float] | None = None
    person_account_ratio: float = 0.3
    crlf_ratio: float = 0.4
    fill_ratio: float = 0.6
    long_text_ratio: float = 0.6
    long_text_edit_ratio: float = 0.2
    max_batch: int = 12
    live_share: float = 0.0

    def __post_init__(self) -> None:
        for kind in _KINDS:
            _check_weight(kind, getattr(self, kind))
        if not any(getattr(self, kind) > 0 for kind in _KINDS):
            raise ValueError(f"WorkloadMix needs a positive weight for one of {', '.join(_KINDS)}")
        if self.entity_weights is not None:
            if not isinstance(self.entity_weights, Mapping):
                raise ValueError(
                    "entity_weights must be a mapping of entity name to weight "
                    f"(got {type(self.entity_weights).__name__})"
                )
            for entity, weight in self.entity_weights.items():
                _check_weight(f"entity_weights[{entity!r}]", weight)
        for name in (
            "person_account_ratio",
            "crlf_ratio",
            "fill_ratio",
            "long_text_ratio",
            "long_text_edit_ratio",
            "live_share",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1] (got {value!r})")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool):
            raise ValueError(f"max_batch must be an int >= 3 (got {self.max_batch!r})")
        if self.max_batch < 3:
            raise ValueError(f"max_batch must be an int >= 3 (got {self.max_batch!r})")

    def weights(self) -> dict[TransactionKind, float]:
        return {kind: float(getattr(self, kind)) for kind in _KINDS}


def _check_weight(name: str, value: object) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"weight {name} must be a finite number >= 0 (got {value!r})")


def entity_weights(mix: WorkloadMix, entities: list[str]) -> dict[str, float]:
    """The weight of each of ``entities`` (the catalogue's change event objects) under ``mix``;
    a ``ValueError`` when ``mix.entity_weights`` names an object the catalogue lacks."""
    given = mix.entity_weights
    if given is None:
        return {e: _DEFAULT_ENTITY_WEIGHTS.get(e, 1.0) for e in entities}
    unknown = sorted(set(given) - set(entities))
    if unknown:
        raise ValueError(
            f"mix.entity_weights names {unknown}, which the catalogue has no change event "
            f"topic for (entities: {', '.join(entities)})"
        )
    return {e: float(given.get(e, 0.0)) for e in entities}


class Choice:
    """A weighted choice among keys with one random draw (keys of weight <= 0 never win)."""

    __slots__ = ("_bounds", "_keys", "_total")

    def __init__(self, weights: Mapping[str, float]) -> None:
        self._keys = [k for k, w in weights.items() if w > 0]
        self._bounds = list(itertools.accumulate(w for w in weights.values() if w > 0))
        self._total = self._bounds[-1] if self._bounds else 0.0

    def pick(self, random_: Callable[[], float]) -> str | None:
        if not self._keys:
            return None
        i = bisect.bisect_right(self._bounds, random_() * self._total)
        return self._keys[min(i, len(self._keys) - 1)]
