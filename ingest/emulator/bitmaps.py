"""Encoding field names into the bitmaps of a change event header.

``changedFields``, ``nulledFields`` and ``diffFields`` are Avro ``array<string>``. Salesforce
writes them as:

* element 0: ``0x`` + a hex bitmap over the top-level fields of the event's own schema, where
  bit *i* (of the hex read as one big-endian unsigned integer) is field *i* and field 0 is
  ``ChangeEventHeader``;
* then, for each compound field with changed children, ``<parent index>-0x<hex>``: the parent's
  decimal top-level index and a bitmap over the children of its record (bit 0 = first child).

The hex is upper-case and byte-aligned (an even number of digits, leading zeros kept), as in
every sample seen from real orgs (``0x410000``, ``4-0x08``).

Choices where Salesforce's behaviour is not documented (kept identical everywhere):

* a compound parent's own top-level bit is set only when the caller names the parent itself
  (the generator names children, ``BillingAddress.City``, so the parent bit stays clear, as the
  decoded samples show);
* when only compound children are named, element 0 is omitted and the array holds only
  ``P-0x..`` elements; an empty name set gives an empty array.

This module only encodes. Decoding lives on the subscriber side and is written independently.
"""

from __future__ import annotations

from collections.abc import Iterable

from ingest.schema import EventSchema

__all__ = ["BitmapEncoder", "bitmap_hex", "encode_field_names"]


def bitmap_hex(indexes: Iterable[int]) -> str:
    """``0x`` + the upper-case, byte-aligned big-endian hex of the bitmap with ``indexes`` set.

    An empty set gives ``0x00`` (one zero byte).
    """
    value = 0
    for i in indexes:
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise ValueError(f"bitmap indexes must be non-negative ints (got {i!r})")
        value |= 1 << i
    width = max(1, (value.bit_length() + 7) // 8)
    return "0x" + value.to_bytes(width, "big").hex().upper()


class BitmapEncoder:
    """Encodes field names into bitmap arrays for one event schema (positions resolved once).

    Names are top-level field names (``Amount``) or ``Parent.Child`` for a child of a compound
    field (``BillingAddress.City``, ``Name.LastName``).
    """

    def __init__(self, schema: EventSchema) -> None:
        if not schema.is_change_event:
            raise ValueError(
                f"bitmaps exist only in change events; {schema.name} has no ChangeEventHeader"
            )
        self._schema = schema
        self._top: dict[str, int] = {}
        self._nested: dict[str, tuple[int, int]] = {}
        for f in schema.fields[1:]:
            self._top[f.name] = f.index
            if f.is_compound:
                for c in f.children:
                    self._nested[f"{f.name}.{c.name}"] = (f.index, c.index)

    @property
    def schema(self) -> EventSchema:
        return self._schema

    def encode(self, names: Iterable[str]) -> list[str]:
        """The bitmap array for ``names`` (see the module docstring for its exact shape)."""
        top: list[int] = []
        nested: dict[int, list[int]] = {}
        for name in names:
            index = self._top.get(name)
            if index is not None:
                top.append(index)
                continue
            pair = self._nested.get(name)
            if pair is None:
                raise ValueError(self._unknown(name))
            nested.setdefault(pair[0], []).append(pair[1])
        out = [bitmap_hex(top)] if top else []
        out.extend(
            f"{parent}-{bitmap_hex(children)}" for parent, children in sorted(nested.items())
        )
        return out

    def _unknown(self, name: str) -> str:
        schema = self._schema
        if not isinstance(name, str):
            return f"field names must be str (got {name!r}, a {type(name).__name__})"
        parent, _, child = name.partition(".")
        if child and parent in self._top:
            f = schema.field(parent)
            if not f.is_compound:
                return (
                    f"{name!r}: {parent} of {schema.name} ({schema.schema_id}) is not a compound "
                    f"field, so it has no child {child!r}"
                )
            known = ", ".join(c.name for c in f.children)
            return f"{name!r}: compound field {parent} has no child {child!r} (children: {known})"
        return (
            f"{name!r} is not a field of {schema.name} ({schema.schema_id}); expected a "
            f"top-level field or Parent.Child of a compound field (fields: {', '.join(self._top)})"
        )


def encode_field_names(schema: EventSchema, names: Iterable[str]) -> list[str]:
    """One-off form of :meth:`BitmapEncoder.encode` (build a :class:`BitmapEncoder` to reuse)."""
    return BitmapEncoder(schema).encode(names)
