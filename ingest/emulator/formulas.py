"""Formula fields of the emulated org: values computed from a record's other fields when read.

A formula field is not stored: Salesforce computes it whenever the record is read (a REST query,
a Bulk API job), so its value changes when its inputs change, without a save of its own and
without an event of its own. Change Data Capture does not support formula fields: they are not
in change event schemas, and so not in change events. ``describe`` lists them with
``"calculated": true`` (neither createable nor updateable).

A :class:`Formula` is a field name, its describe type, and a function of the record's stored
values (as the ground truth keeps them: dates as epoch milliseconds, compound fields as nested
mappings). :data:`DEFAULT_FORMULAS` gives each shipped change event object one or two formulas
over fields its schema has; :meth:`~ingest.emulator.topics.Catalogue.add_formulas` puts them
(or others) in a catalogue, where the REST, Bulk and describe answers find them, and the ground
truth computes them (:meth:`~ingest.emulator.truth.GroundTruth.formula_values`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["DEFAULT_FORMULAS", "Formula", "FormulaKind", "formula_values"]

# The value kinds a formula returns, named as the emulator's field kinds are.
FormulaKind = Literal["double", "string", "boolean"]
_DESCRIBE_TYPES: Mapping[str, frozenset[str]] = {
    "double": frozenset({"double", "currency", "percent"}),
    "string": frozenset({"string"}),
    "boolean": frozenset({"boolean"}),
}


@dataclass(frozen=True)
class Formula:
    """One formula field: ``name`` (custom, ``__c``), ``kind`` of its value, ``sf_type`` (the
    describe ``type``: ``currency``, ``double``, ``percent``, ``string`` or ``boolean``), the
    stored fields it reads (``inputs``) and ``compute``, a function of the record's values."""

    name: str
    kind: FormulaKind
    sf_type: str
    inputs: tuple[str, ...]
    compute: Callable[[Mapping[str, Any]], Any]

    def __post_init__(self) -> None:
        if not self.name.endswith("__c"):
            raise ValueError(f"a formula field is a custom field ending in __c (got {self.name!r})")
        if self.sf_type not in _DESCRIBE_TYPES.get(self.kind, frozenset()):
            raise ValueError(
                f"formula {self.name}: a {self.kind} value has describe type one of "
                f"{sorted(_DESCRIBE_TYPES.get(self.kind, ()))} (got {self.sf_type!r})"
            )

    def value(self, values: Mapping[str, Any]) -> Any:
        """The formula's value for a record with stored ``values``."""
        return self.compute(values)


def formula_values(formulas: Sequence[Formula], values: Mapping[str, Any]) -> dict[str, Any]:
    """Every formula's value for a record with stored ``values``, by field name."""
    return {f.name: f.value(values) for f in formulas}


def _money(value: float | None) -> float | None:
    # A currency formula has two decimal places, as Salesforce rounds it.
    return None if value is None else round(value, 2)


def _ratio(values: Mapping[str, Any], top: str, bottom: str) -> float | None:
    a, b = values.get(top), values.get(bottom)
    if a is None or not b:
        return None
    return _money(float(a) / float(b))


def _weighted(values: Mapping[str, Any]) -> float | None:
    amount, probability = values.get("Amount"), values.get("Probability")
    if amount is None or probability is None:
        return None
    return _money(float(amount) * float(probability) / 100.0)


def _big(values: Mapping[str, Any]) -> bool:
    # A checkbox formula is never null: a blank input reads as zero.
    return float(values.get("Amount") or 0.0) >= 100_000.0


def _city(values: Mapping[str, Any]) -> str | None:
    address = values.get("MailingAddress")
    city = address.get("City") if isinstance(address, Mapping) else None
    return city.upper() if isinstance(city, str) and city else None


def _total(values: Mapping[str, Any]) -> float | None:
    amount = values.get("Amount__c")
    if amount is None:
        return None
    rate = values.get("Tax_Rate__c") or 0.0
    return _money(float(amount) * (1.0 + float(rate) / 100.0))


DEFAULT_FORMULAS: Mapping[str, tuple[Formula, ...]] = {
    "Account": (
        Formula(
            "Revenue_Per_Employee__c",
            "double",
            "currency",
            ("AnnualRevenue", "NumberOfEmployees"),
            lambda v: _ratio(v, "AnnualRevenue", "NumberOfEmployees"),
        ),
    ),
    "Contact": (Formula("Mailing_City_Upper__c", "string", "string", ("MailingAddress",), _city),),
    "Opportunity": (
        Formula("Weighted_Amount__c", "double", "currency", ("Amount", "Probability"), _weighted),
        Formula("Is_Big_Deal__c", "boolean", "boolean", ("Amount",), _big),
    ),
    "Invoice__c": (
        Formula("Total__c", "double", "currency", ("Amount__c", "Tax_Rate__c"), _total),
    ),
}
