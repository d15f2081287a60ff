"""Resolution of the nodes of a parsed Avro schema, shared by the generated decoders and
silver's columnar decoder: named-type references looked up, logical types and unknown
constructs refused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["resolve_type"]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def resolve_type(
    t: Any,
    named: dict[str, Any],
    *,
    kinds: frozenset[str],
    unsupported: type[Exception],
) -> Any:
    """A node of a parsed Avro schema with references to ``named`` types resolved: a primitive
    type's name, a union's list of branches, or the definition (a dict) of a type of one of
    ``kinds``. Logical types and anything else raise ``unsupported``."""
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return t
        if t in named:
            return named[t]
        raise unsupported(f"unknown named type {t!r}")
    if isinstance(t, list):
        return t
    if isinstance(t, dict):
        if "logicalType" in t:
            raise unsupported(f"logical type {t['logicalType']!r}")
        kind = t.get("type")
        if kind in _PRIMITIVES:
            return kind
        if kind in kinds:
            return t
    raise unsupported(f"type {t!r}")
