"""A decoded change event: its header, expanded bitmaps and field values."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ingest.decoding.bitmap import BitmapExpander, expander_for
from ingest.errors import DecodeError
from ingest.schema import HEADER_FIELD, EventSchema

__all__ = ["BITMAP_FIELDS", "HEADER_VALUE_FIELDS", "ChangeEvent", "event_factory"]

# ChangeEventHeader fields in the order ChangeEvent takes them.
HEADER_VALUE_FIELDS = (
    "entityName",
    "recordIds",
    "changeType",
    "changeOrigin",
    "transactionKey",
    "sequenceNumber",
    "commitTimestamp",
    "commitNumber",
    "commitUser",
)
BITMAP_FIELDS = ("changedFields", "nulledFields", "diffFields")


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change event, decoded with its writer schema.

    ``changed`` / ``nulled`` / ``diffed`` are the expanded bitmaps (compound children as
    ``Parent.Child``). ``values`` holds every body field (all but the header) as decoded;
    in an UPDATE an unchanged field and a field set to null are both None and only
    ``changed`` / ``nulled`` tell them apart, and a ``diffed`` field holds the diff, not the
    text. ``commit_timestamp`` is epoch milliseconds (UTC); ``commit_number`` an exact int
    (it can exceed 2**53). ``values`` is left out of the repr: it carries record data.
    """

    schema_id: str
    entity: str
    record_ids: tuple[str, ...]
    change_type: str
    change_origin: str
    transaction_key: str
    sequence_number: int
    commit_timestamp: int
    commit_number: int
    commit_user: str
    changed: tuple[str, ...]
    nulled: tuple[str, ...]
    diffed: tuple[str, ...]
    values: Mapping[str, Any] = field(hash=False, repr=False)

    @property
    def is_gap(self) -> bool:
        """GAP_* and GAP_OVERFLOW events: the change happened, its values are not in it."""
        return self.change_type.startswith("GAP_")

    @classmethod
    def from_record(
        cls,
        record: Mapping[str, Any],
        schema: EventSchema,
        *,
        expander: BitmapExpander | None = None,
    ) -> ChangeEvent:
        """Build the view from a decoded record (as ``EventDecoder.decode`` returns it)."""
        header = record.get(HEADER_FIELD)
        if not isinstance(header, Mapping):
            raise DecodeError(
                f"{schema.name} ({schema.schema_id}) is not a change event: expected a "
                f"{HEADER_FIELD} record as field 0"
            )
        missing = [n for n in (*HEADER_VALUE_FIELDS, *BITMAP_FIELDS) if n not in header]
        if missing:
            raise DecodeError(
                f"{schema.name} ({schema.schema_id}): {HEADER_FIELD} lacks {', '.join(missing)}"
            )
        expander = expander or expander_for(schema)
        return cls(
            schema.schema_id,
            header["entityName"],
            tuple(header["recordIds"]),
            header["changeType"],
            header["changeOrigin"],
            header["transactionKey"],
            header["sequenceNumber"],
            header["commitTimestamp"],
            header["commitNumber"],
            header["commitUser"],
            expander.expand(header["changedFields"]),
            expander.expand(header["nulledFields"]),
            expander.expand(header["diffFields"]),
            {k: v for k, v in record.items() if k != HEADER_FIELD},
        )


def event_factory() -> Callable[..., ChangeEvent]:
    """A constructor taking :class:`ChangeEvent`'s fields positionally, twice as fast.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, which
    costs more than decoding an UPDATE's null fields; the decoders build one event per
    payload, so they fill the slots directly. The result is an ordinary ``ChangeEvent``.
    """
    names = [f.name for f in fields(ChangeEvent)]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": ChangeEvent}
    lines = [f"def make({', '.join(names)}):", "    event = _new(_cls)"]
    for i, name in enumerate(names):
        namespace[f"_set{i}"] = getattr(ChangeEvent, name).__set__
        lines.append(f"    _set{i}(event, {name})")
    lines.append("    return event")
    exec("\n".join(lines), namespace)
    make: Callable[..., ChangeEvent] = namespace["make"]
    return make
