"""changedFields / nulledFields / diffFields bitmaps expanded into field names.

A change event carries each bitmap as an array of strings. ``0x<hex>`` is one big-endian
integer over the event's top-level fields: bit *i* (``(value >> i) & 1``) stands for field *i*
of the writer schema, field 0 being ``ChangeEventHeader`` itself. ``<p>-0x<hex>`` (``p``
decimal) is a bitmap over the children of the compound field at top-level index ``p``
(Address, Location, PersonName, Account's switchable name); its bits name
``Parent.Child`` using the Avro field names (``BillingAddress.City``).

Salesforce's own utilities differ on details that matter here (one reads only the first
element when it starts with ``0x`` and only the last for nested bits, one handles only
upper-case digits, one mutates its input). This module reads every element on its own, so
order and case do not matter, and never touches the caller's list.

Order of the result: top-level fields in schema order; a compound field's children follow at
the compound's own position (after the compound's name, if its top-level bit is set too),
children in their schema order. The order depends only on the set of bits, never on the
order of the elements, so equal bitmaps always expand to equal tuples.

Expansion is memoized per schema and bitmap: a stream repeats a handful of bitmaps
(``['0x400002']`` for "Name changed") millions of times.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ingest.errors import BitmapError
from ingest.schema import EventSchema, FieldInfo

__all__ = ["BitmapExpander", "expander_for", "field_names"]

# The parent index is decimal; nine digits are far beyond any schema and keep int() cheap.
_ELEMENT = re.compile(r"(?:([0-9]{1,9})-)?0[xX]([0-9a-fA-F]+)\Z")
_SHOWN = 200  # characters of a bad bitmap quoted in an error message


class BitmapExpander:
    """Expands the bitmaps of one schema into field names, remembering every answer.

    ``memo_size`` bounds the memo: when full it is emptied and refilled, which costs one
    recomputation per distinct bitmap and keeps memory flat on pathological streams.
    """

    __slots__ = ("_children", "_memo", "_memo_size", "_names", "_nfields", "schema")

    def __init__(self, schema: EventSchema, *, memo_size: int = 4096) -> None:
        self.schema = schema
        self._names = tuple(f.name for f in schema.fields)
        self._nfields = len(self._names)
        self._children: dict[int, tuple[str, ...]] = {
            f.index: tuple(f"{f.name}.{c.name}" for c in f.children)
            for f in schema.fields
            if _can_be_parent(f)
        }
        self._memo: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._memo_size = memo_size

    @property
    def memo(self) -> dict[tuple[str, ...], tuple[str, ...]]:
        """The memo, keyed by the bitmap as a tuple (read it, do not write it)."""
        return self._memo

    def expand(self, bitmap: Sequence[str] | None) -> tuple[str, ...]:
        """Field names whose bits are set, in schema order (see the module docstring).

        None (a schema whose bitmap field is nullable, which Salesforce's are not) names
        nothing, like an empty bitmap.
        """
        if type(bitmap) is tuple:
            key = bitmap
        elif type(bitmap) is list:
            key = tuple(bitmap)
        elif bitmap is None:
            return ()
        elif isinstance(bitmap, (str, bytes)) or not isinstance(bitmap, Sequence):
            raise BitmapError(
                f"a bitmap must be a list of strings such as ['0x0402'] (got "
                f"{type(bitmap).__name__} {repr(bitmap)[:_SHOWN]}) for schema "
                f"{self.schema.name} ({self.schema.schema_id})"
            )
        else:
            key = tuple(bitmap)
        try:
            return self._memo[key]
        except KeyError:
            pass
        except TypeError:
            raise self._error(key, "elements must be strings") from None
        names = self._compute(key)
        if len(self._memo) >= self._memo_size:
            self._memo.clear()
        self._memo[key] = names
        return names

    def _compute(self, key: tuple[str, ...]) -> tuple[str, ...]:
        top = 0
        nested: dict[int, int] = {}
        for element in key:
            if not isinstance(element, str):
                raise self._error(key, f"element {element!r} is a {type(element).__name__}")
            match = _ELEMENT.match(element)
            if match is None:
                raise self._error(
                    key, f"malformed element {element[:_SHOWN]!r} (expected 0x<hex> or <n>-0x<hex>)"
                )
            parent, digits = match.groups()
            value = int(digits, 16)
            if parent is None:
                top |= value
                continue
            p = int(parent)
            if p not in self._children:
                raise self._error(key, f"element {element!r}: {self._describe(p)}")
            # Repeated elements for one parent are read as one bitmap (their union).
            nested[p] = nested.get(p, 0) | value
        if top >> self._nfields:
            raise self._error(key, f"bit {top.bit_length() - 1} is past the last field")
        for p, value in nested.items():
            children = self._children[p]
            if value >> len(children):
                raise self._error(
                    key,
                    f"bit {value.bit_length() - 1} of element {p} is past the last child of "
                    f"{self._names[p]} ({len(children)} children)",
                )
        names: list[str] = []
        for i in range(self._nfields):
            if top >> i & 1:
                names.append(self._names[i])
            value = nested.get(i, 0)
            if value:
                children = self._children[i]
                names.extend(children[j] for j in range(len(children)) if value >> j & 1)
        return tuple(names)

    def _describe(self, p: int) -> str:
        if p >= self._nfields:
            return f"parent index {p} is past the last field"
        return f"parent index {p} is {self._names[p]}, not a compound field"

    def _error(self, key: tuple[object, ...], problem: str) -> BitmapError:
        shown = repr(list(key))
        if len(shown) > _SHOWN:
            shown = shown[:_SHOWN] + "...]"
        return BitmapError(
            f"bitmap {shown} does not fit schema {self.schema.name} ({self.schema.schema_id}, "
            f"{self._nfields} top-level fields): {problem}"
        )


def _can_be_parent(f: FieldInfo) -> bool:
    # Any nested record other than the header can carry a P-0x.. element; Salesforce uses it
    # for Address, Location, PersonName and the switchable name.
    return bool(f.children) and f.kind != "header"


_EXPANDERS: dict[str, BitmapExpander] = {}
_MAX_SCHEMAS = 1024


def expander_for(schema: EventSchema) -> BitmapExpander:
    """The shared, memoizing expander of ``schema`` (one per schema id)."""
    expander = _EXPANDERS.get(schema.schema_id)
    if expander is not None and (expander.schema is schema or expander.schema.json == schema.json):
        return expander
    expander = BitmapExpander(schema)
    if len(_EXPANDERS) >= _MAX_SCHEMAS:
        _EXPANDERS.clear()
    _EXPANDERS[schema.schema_id] = expander
    return expander


def field_names(bitmap: Sequence[str] | None, schema: EventSchema) -> tuple[str, ...]:
    """Expand one bitmap (``changedFields``, ``nulledFields`` or ``diffFields``) to names.

    With the Account order of Salesforce's documentation (0 header, 1 Name, ..., 4
    BillingAddress, ..., 22 LastModifiedDate), ``["0x400002", "4-0x02"]`` expands to
    ``("Name", "BillingAddress.City", "LastModifiedDate")``.

    Upper- and lower-case hex and odd digit counts are accepted; elements may come in any
    order; the input is never modified. Raises :class:`~ingest.errors.BitmapError` for a bit
    past the last field (or child), a parent index that is not a compound field, or a
    malformed element; the message quotes the bitmap, the schema id and the field count.
    """
    return expander_for(schema).expand(bitmap)
