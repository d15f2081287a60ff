"""A polled object's columns, from the describes its polls stored.

An object without change events has no event schema: its silver and gold columns come from its
``describe``, as a Streaming API channel's do (:func:`pipelines.silver.cometd.describe_layout`:
Address and Location fields become structs of their parts, a name with parts a struct, or
Account's switchable name). Two kinds of field are left out, so that the tables have the
columns a change event object's tables have:

- ``SystemModstamp``: change events do not carry it; a polled row's commit time is its
  ``SystemModstamp`` (gold's ``_cdc_last_commit_ts``);
- formula fields (``calculated``): change events do not carry them either; gold gets them from
  the scheduled refresh (:mod:`pipelines.formulas`) when ``formulas.refresh_every`` is set.

Every describe a table stored counts (oldest first, fields a later one adds at the end, types
widened as silver widens them), so rows read before a field was added still fit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ingest.schema import FieldInfo
from pipelines.polled.tables import stored_describes
from pipelines.silver.columns import FieldLayout, LeafLayout, SilverLayout, widen
from pipelines.silver.cometd import describe_layout
from pipelines.spec import ObjectSpec

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine

__all__ = [
    "MODSTAMP",
    "calculated_fields",
    "describe_fingerprint",
    "layout_of_describes",
    "polled_layout",
    "record_infos_of",
]

MODSTAMP = "SystemModstamp"
_COMPOUND_TYPES = ("address", "location")


def _fields(describe: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [f for f in describe.get("fields", []) if isinstance(f, Mapping) and "name" in f]


def describe_fingerprint(describe: Mapping[str, Any]) -> str:
    """What identifies a describe's fields (names, types, compound parents, formulas): equal
    for two describes that give the same columns."""
    shape = sorted(
        (
            str(f["name"]),
            str(f.get("type", "")),
            str(f.get("compoundFieldName") or ""),
            bool(f.get("calculated")),
        )
        for f in _fields(describe)
    )
    text = json.dumps(shape, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def calculated_fields(describe: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The describe's formula fields (``calculated`` and not a compound's part), in order."""
    return [f for f in _fields(describe) if f.get("calculated") and not f.get("compoundFieldName")]


def _stored(describe: Mapping[str, Any]) -> dict[str, Any]:
    kept = [f for f in _fields(describe) if not f.get("calculated") and str(f["name"]) != MODSTAMP]
    return {**describe, "fields": kept}


def _union(old: FieldLayout, new: FieldLayout) -> FieldLayout:
    if old.shape != new.shape:
        return new
    if old.shape == "leaf":
        return FieldLayout(old.name, "leaf", widen(old.kind, new.kind))
    children = {c.name: c for c in old.children}
    for c in new.children:
        known = children.get(c.name)
        children[c.name] = c if known is None else LeafLayout(c.name, widen(known.kind, c.kind))
    return FieldLayout(old.name, old.shape, widen(old.kind, new.kind), tuple(children.values()))


def layout_of_describes(obj: ObjectSpec, describes: Sequence[Mapping[str, Any]]) -> SilverLayout:
    """The silver layout of ``obj`` from its describes, oldest first (see the module
    docstring): the columns of a change event object's silver table, ``Id`` and the ``_cdc_*``
    header included."""
    merged: dict[str, FieldLayout] = {}
    for describe in describes:
        for name, layout in describe_layout(_stored(describe), None).items():
            known = merged.get(name)
            merged[name] = layout if known is None else _union(known, layout)
    return SilverLayout(
        entity=obj.api_name,
        change_events=True,
        fields=tuple(merged.values()),
        compounds=obj.silver.compound_fields,
    )


def record_infos_of(describes: Sequence[Mapping[str, Any]]) -> dict[str, FieldInfo]:
    """What reading a REST record needs to know of the fields beyond their layout: which name
    fields come as text with their parts as fields of their own (``FirstName``...), as
    :func:`pipelines.snapshot_rows.rest_row` reads them."""
    infos: dict[str, FieldInfo] = {}
    for describe in describes:
        fields = _fields(describe)
        parents = {str(f.get("compoundFieldName")) for f in fields if f.get("compoundFieldName")}
        for f in fields:
            name = str(f["name"])
            if name in parents and str(f.get("type")) not in _COMPOUND_TYPES:
                infos[name] = FieldInfo(name, 0, "string", sf_type="PersonName")
    return infos


def polled_layout(
    engine: LakeEngine, obj: ObjectSpec
) -> tuple[SilverLayout, dict[str, FieldInfo]] | None:
    """``obj``'s layout and record infos from the describes its table stored (``None``: it
    has not been polled yet)."""
    describes = [d.describe for d in stored_describes(engine, obj)]
    if not describes:
        return None
    return layout_of_describes(obj, describes), record_infos_of(describes)
