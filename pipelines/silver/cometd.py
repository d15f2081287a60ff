"""Decoding Streaming API messages: the pure batch functions silver runs over a channel's
bronze rows (in this process, or on Spark executors).

:func:`stream_plan` builds a channel's :class:`StreamPlan` from the object's describes and the
PushTopic's queries (``bronze.sfcdc_describes``, stored by landing, so silver never calls
Salesforce); :class:`CometdRows` turns bronze rows into silver rows of that plan, plus the
error columns the quarantine split reads (:class:`~pipelines.silver.quarantine.SilverPart`,
:class:`~pipelines.silver.quarantine.QuarantinePart`).

What a row becomes, by channel:

- ``/topic/`` (PushTopic): one row per notification, shaped like a change event row of the
  Pub/Sub silver (``Id``, the ``_cdc_*`` header, the fields typed from the describe): ``created``,
  ``updated``, ``deleted``, ``undeleted`` become ``CREATE``, ``UPDATE``, ``DELETE``,
  ``UNDELETE`` (the word is kept in ``_cdc_event_type``), ``createdDate`` is the commit
  timestamp, ``_cdc_changed_fields`` lists the fields the notification carries (every field of
  the query: a PushTopic sends their full values) and ``_cdc_nulled_fields`` those that are
  null. Columns are the query's fields (of every query the channel had).
- ``/data/<Object>ChangeEvent``: the change event's JSON, fanned out per record id, with its
  ``ChangeEventHeader`` as the ``_cdc_*`` header; columns are the object's fields.
- ``/event/<Name>__e``: the event's fields, its ``EventUuid`` as ``_cdc_event_id``.
- ``/u/<name>``: the payload as text (``payload``), with ``createdDate`` and the replay id.

Every row also carries ``_cdc_channel``, ``_cdc_replay_number`` (the integer replay id, what
gold orders a PushTopic's notifications by), ``_cdc_event_type``, ``_cdc_created_date`` and
``_cdc_received_at``; ``_cdc_replay_id`` holds the replay id's decimal digits as bytes, as
everywhere else.

What cannot be a silver row is quarantined with a reason kind (:data:`StreamErrorKind`): a
malformed message (landing said so), text that is not JSON, a notification without a record
id, a field the describe does not list, a value that does not fit its type, an unknown event
type, or an object without a stored describe.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import types as T

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.silver.columns import (
    CDC_COLUMNS,
    EVENT_COLUMNS,
    ID_COLUMN,
    FieldLayout,
    LeafKind,
    LeafLayout,
    SilverLayout,
    widen,
)
from pipelines.silver.quarantine import ERROR_COLUMNS
from pipelines.spec.cometd import ChannelKind, query_parts

__all__ = [
    "STREAM_BRONZE_COLUMNS",
    "STREAM_COLUMNS",
    "CometdRows",
    "StreamErrorKind",
    "StreamPlan",
    "describe_layout",
    "stream_plan",
]

StreamErrorKind = Literal[
    "malformed_message",
    "not_json",
    "missing_id",
    "unknown_field",
    "bad_value",
    "bad_event_type",
    "no_describe",
]

# The bronze columns the decoder reads.
STREAM_BRONZE_COLUMNS = (
    "replay_id",
    "channel",
    "event_type",
    "created_date",
    "event_uuid",
    "raw",
    "malformed",
    "received_at",
    "batch_id",
    "batch_seq",
)
# What every Streaming API silver row carries besides the source's own columns.
STREAM_COLUMNS: tuple[tuple[str, T.DataType], ...] = (
    ("_cdc_channel", T.StringType()),
    ("_cdc_replay_number", T.LongType()),
    ("_cdc_event_type", T.StringType()),
    ("_cdc_created_date", T.TimestampType()),
    ("_cdc_received_at", T.TimestampType()),
)
_GENERIC_COLUMNS: tuple[tuple[str, T.DataType], ...] = (
    ("_cdc_replay_id", T.BinaryType()),
    ("_cdc_bronze_batch_id", T.LongType()),
    ("_cdc_bronze_batch_seq", T.IntegerType()),
    ("payload", T.StringType()),
)
# Columns the quarantine split reads that a channel's silver rows may not have.
_QUARANTINE_INPUTS: tuple[tuple[str, T.DataType], ...] = (
    ("_cdc_bronze_batch_id", T.LongType()),
    ("_cdc_bronze_batch_seq", T.IntegerType()),
    ("_cdc_replay_id", T.BinaryType()),
    ("_cdc_event_id", T.StringType()),
    ("_cdc_schema_id", T.StringType()),
)
_CHANGE_TYPES = {
    "created": "CREATE",
    "updated": "UPDATE",
    "deleted": "DELETE",
    "undeleted": "UNDELETE",
}
_DESCRIBE_KINDS: Mapping[str, LeafKind] = {
    "boolean": "boolean",
    "int": "int",
    "long": "long",
    "double": "double",
    "currency": "double",
    "percent": "double",
    "date": "date",
    "datetime": "timestamp",
    "time": "time",
}
_COMPOUND_TYPES = ("address", "location")
_SKIPPED = frozenset({"id", "isdeleted"})
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


# ---------------------------------------------------------------------------------- layout


def _child_name(parent: str, part: str) -> str:
    """A compound part's child name as change events name it: ``BillingCity`` of
    ``BillingAddress`` -> ``City``, ``HQ_Location__Latitude__s`` -> ``Latitude``."""
    if parent.endswith("__c"):
        base = parent.removesuffix("__c") + "__"
        if part.startswith(base):
            return part[len(base) :].removesuffix("__s")
    for suffix in ("Address", "Location"):
        base = parent.removesuffix(suffix)
        if parent.endswith(suffix) and part.startswith(base) and len(part) > len(base):
            return part[len(base) :]
    return part


def _leaf_kind(sf_type: str) -> LeafKind:
    return _DESCRIBE_KINDS.get(sf_type, "string")


def describe_layout(
    describe: Mapping[str, Any], selected: Sequence[str] | None
) -> dict[str, FieldLayout]:
    """The silver fields one describe gives: ``selected`` fields (a PushTopic's query, in its
    order) or every field that is not a compound's part (``Id`` and ``IsDeleted`` left out).
    Address and Location fields become structs of their parts; a name with parts (a person
    name) a struct, or Account's switchable name when the object has ``IsPersonAccount``."""
    fields = [f for f in describe.get("fields", []) if isinstance(f, Mapping)]
    by_lower = {str(f.get("name", "")).lower(): f for f in fields}
    parts: dict[str, list[Mapping[str, Any]]] = {}
    for f in fields:
        parent = f.get("compoundFieldName")
        if isinstance(parent, str) and parent:
            parts.setdefault(parent, []).append(f)
    persons = "ispersonaccount" in by_lower
    if selected is None:
        names = [
            str(f["name"])
            for f in fields
            if not f.get("compoundFieldName") and str(f.get("name", "")).lower() not in _SKIPPED
        ]
    else:
        names = [str(by_lower[n.lower()]["name"]) for n in selected if n.lower() in by_lower]
    out: dict[str, FieldLayout] = {}
    for name in names:
        f = by_lower[name.lower()]
        sf_type = str(f.get("type", "string"))
        children = tuple(
            LeafLayout(_child_name(name, str(p["name"])), _leaf_kind(str(p.get("type", ""))))
            for p in parts.get(name, ())
        )
        if sf_type in _COMPOUND_TYPES and children:
            out[name] = FieldLayout(name, "struct", "string", children)
        elif children and selected is None:
            # A name: the REST API and PushTopics send it as text; change events as a record.
            shape: Literal["struct", "switchable"] = "switchable" if persons else "struct"
            out[name] = FieldLayout(name, shape, "string", children)
        else:
            out[name] = FieldLayout(name, "leaf", _leaf_kind(sf_type))
    return out


def _merge(old: FieldLayout, new: FieldLayout) -> FieldLayout:
    if old.shape == new.shape == "leaf":
        return FieldLayout(old.name, "leaf", widen(old.kind, new.kind))
    if old.shape == new.shape:
        merged = {c.name: c for c in old.children}
        for c in new.children:
            prior = merged.get(c.name)
            merged[c.name] = c if prior is None else LeafLayout(c.name, widen(prior.kind, c.kind))
        return FieldLayout(old.name, old.shape, old.kind, tuple(merged.values()))
    return new


# ------------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class StreamPlan:
    """What the decoder of one channel needs (small and picklable).

    ``layout``: the typed fields (``None`` for a generic channel, or when the object has no
    stored describe: ``missing`` then says why every row is quarantined). ``schema``: the
    silver columns.
    """

    key: str
    channel: str
    kind: ChannelKind
    entity: str | None
    layout: SilverLayout | None
    schema: T.StructType
    missing: str | None = None

    @property
    def names(self) -> list[str]:
        return list(self.schema.names)

    def decoded_schema(self) -> T.StructType:
        """The silver columns, then what the quarantine split needs, then the error columns."""
        fields = list(self.schema.fields)
        have = set(self.schema.names)
        fields += [T.StructField(n, t) for n, t in _QUARANTINE_INPUTS if n not in have]
        fields += [
            T.StructField("_cdc_error", T.StringType()),
            T.StructField("_cdc_error_kind", T.StringType()),
            T.StructField("_cdc_payload", T.BinaryType()),
        ]
        assert tuple(f.name for f in fields[-3:]) == ERROR_COLUMNS
        return T.StructType(fields)


def _columns(layout: SilverLayout, head: Sequence[tuple[str, T.DataType]]) -> T.StructType:
    return T.StructType(
        [T.StructField(n, t) for n, t in (*head, *STREAM_COLUMNS, *layout.field_columns())]
    )


def stream_plan(
    *,
    key: str,
    channel: str,
    kind: ChannelKind,
    entity: str | None,
    describes: Sequence[tuple[Mapping[str, Any] | None, str | None]],
    compounds: Literal["struct", "flattened"] = "struct",
) -> StreamPlan:
    """The plan of a channel from its registry rows, oldest first: ``(describe, query)``
    pairs. A PushTopic's columns are the fields of every query it had (in order of first
    appearance), typed by the newest describe that lists them."""
    if kind == "generic":
        schema = T.StructType(
            [T.StructField(n, t) for n, t in (*STREAM_COLUMNS, *_GENERIC_COLUMNS)]
        )
        return StreamPlan(key, channel, kind, None, None, schema)
    merged: dict[str, FieldLayout] = {}
    for describe, query in describes:
        if describe is None:
            continue
        selected = None
        if kind == "pushtopic":
            if query is None:
                continue
            selected = query_parts(query)[0]
        for name, found in describe_layout(describe, selected).items():
            old = merged.get(name)
            merged[name] = found if old is None else _merge(old, found)
    entity_name = entity or key
    records = kind != "platform_event"
    head = ((ID_COLUMN, T.StringType()), *CDC_COLUMNS) if records else EVENT_COLUMNS
    if not merged and not describes:
        layout = SilverLayout(key, kind != "platform_event", (), compounds)
        return StreamPlan(
            key,
            channel,
            kind,
            entity,
            None,
            _columns(layout, head),
            missing=f"no describe of {entity_name} is stored in bronze.sfcdc_describes for "
            f"{channel}: run the landing (it stores one before subscribing)",
        )
    layout = SilverLayout(key, kind != "platform_event", tuple(merged.values()), compounds)
    return StreamPlan(key, channel, kind, entity, layout, _columns(layout, head))


# ---------------------------------------------------------------------------------- values


class _BadValue(Exception):
    def __init__(self, kind: StreamErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _timestamp(text: str) -> datetime:
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    elif len(value) > 5 and value[-5] in "+-" and value[-4:].isdigit():
        value = f"{value[:-2]}:{value[-2:]}"  # +0000 -> +00:00
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def _value(kind: LeafKind, value: Any, where: str) -> Any:
    if value is None:
        return None
    try:
        if kind in ("string", "json", "binary"):
            if isinstance(value, (dict, list)):
                return json.dumps(value, separators=(",", ":"))
            return value if isinstance(value, str) else json.dumps(value)
        if kind == "boolean":
            if isinstance(value, bool):
                return value
        elif kind in ("int", "long"):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and float(value).is_integer():
                return int(value)
        elif kind == "double":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif kind == "date":
            if isinstance(value, str):
                return date.fromisoformat(value[:10])
        elif kind == "timestamp":
            if isinstance(value, str):
                return _timestamp(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return _EPOCH + timedelta(milliseconds=value)
        elif kind == "time" and isinstance(value, str):
            return value.removesuffix("Z")
    except (TypeError, ValueError, OverflowError):
        pass
    raise _BadValue(
        "bad_value", f"{where}: expected a {kind} value as Salesforce sends it (got {value!r:.80})"
    )


def _nested(value: Mapping[str, Any], child: str) -> Any:
    if child in value:
        return value[child]
    return value.get(child[:1].lower() + child[1:])


def _struct(f: FieldLayout, value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _BadValue("bad_value", f"{where}: expected an object of {f.child_names()}")
    known = {c.name.lower() for c in f.children}
    extra = [k for k in value if k.lower() not in known]
    if extra:
        raise _BadValue(
            "unknown_field", f"{where}: {extra} are not parts of {f.name} in the describe"
        )
    out = {c.name: _value(c.kind, _nested(value, c.name), f"{where}.{c.name}") for c in f.children}
    return out if any(v is not None for v in out.values()) else None


def _body(
    layout: SilverLayout, values: Mapping[str, Any], skip: frozenset[str], where: str
) -> tuple[dict[str, Any], list[str], list[str], list[str]]:
    """Typed silver columns of ``values`` (a PushTopic's ``sobject`` or an event's
    ``payload``), and the field names it carries, those it carries as null and those it
    carries as a diff (a long text field of a change event over CometD:
    ``{"diff": "--- \\n+++ <sha256>\\n..."}``, kept as the diff text, which gold applies)."""
    by_lower = {f.name.lower(): f for f in layout.fields}
    flat = layout.compounds == "flattened"
    row: dict[str, Any] = {}
    carried: list[str] = []
    nulls: list[str] = []
    diffs: list[str] = []
    for key, value in values.items():
        if key in skip:
            continue
        f = by_lower.get(key.lower())
        if f is None:
            raise _BadValue(
                "unknown_field",
                f"{where}: field {key!r} is not in the describe of {layout.entity} (or not in "
                "the PushTopic's query)",
            )
        carried.append(f.name)
        if value is None:
            nulls.append(f.name)
        if f.shape == "leaf" and isinstance(value, Mapping) and set(value) == {"diff"}:
            diffs.append(f.name)
            row[f.name] = _value(f.kind, value["diff"], f"{where}.{f.name}.diff")
            continue
        if f.shape == "leaf":
            row[f.name] = _value(f.kind, value, f"{where}.{f.name}")
            continue
        if f.shape == "switchable" and not isinstance(value, Mapping):
            row[f.name] = _value(f.kind, value, f"{where}.{f.name}")
            continue
        struct = _struct(f, value, f"{where}.{f.name}")
        column = f.name if f.shape == "struct" else f.person_column
        if flat:
            for c in f.child_names():
                row[layout.column_for(f"{f.name}.{c}")] = struct.get(c) if struct else None
        else:
            row[column] = struct
    return row, carried, nulls, diffs


def _nulled(changed: Sequence[str], payload: Mapping[str, Any]) -> list[str]:
    """The changed fields a change event over CometD sets to null: its header has no
    ``nulledFields``, and a field updated to null comes as ``null`` or not at all (a
    compound part, ``BillingAddress.City``, as a null or missing part of its parent)."""
    out = []
    for name in changed:
        top, _, part = name.partition(".")
        value = payload.get(top)
        if part and isinstance(value, Mapping):
            value = _nested(value, part)
        if value is None:
            out.append(name)
    return out


# --------------------------------------------------------------------------------- decoder


class CometdRows:
    """Bronze rows of one channel (:data:`STREAM_BRONZE_COLUMNS`) -> rows of
    ``plan.decoded_schema()``: silver columns, with ``_cdc_error`` / ``_cdc_error_kind`` /
    ``_cdc_payload`` set (and the rest null) on the rows to quarantine."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_schema_to_arrow(self.plan.decoded_schema())
        for batch in batches:
            rows: list[dict[str, Any]] = []
            for bronze in batch.to_pylist():
                rows.extend(self._rows(bronze))
            yield pa.RecordBatch.from_pylist(rows, schema=target)

    def _rows(self, bronze: Mapping[str, Any]) -> list[dict[str, Any]]:
        plan = self.plan
        replay = bronze.get("replay_id")
        common: dict[str, Any] = {
            "_cdc_channel": bronze.get("channel"),
            "_cdc_replay_number": replay,
            "_cdc_event_type": bronze.get("event_type"),
            "_cdc_received_at": bronze.get("received_at"),
            "_cdc_replay_id": str(replay).encode() if replay is not None else None,
            "_cdc_event_id": bronze.get("event_uuid"),
            "_cdc_bronze_batch_id": bronze.get("batch_id"),
            "_cdc_bronze_batch_seq": bronze.get("batch_seq"),
        }
        raw = str(bronze.get("raw") or "")

        def bad(kind: StreamErrorKind, reason: str) -> list[dict[str, Any]]:
            return [
                {
                    **common,
                    "_cdc_error": reason,
                    "_cdc_error_kind": kind,
                    "_cdc_payload": raw.encode("utf-8", "replace"),
                }
            ]

        malformed = bronze.get("malformed")
        try:
            message = json.loads(raw)
        except ValueError as exc:
            return bad("not_json", f"{malformed or 'the message'}: not JSON ({exc})")
        if malformed:
            return bad("malformed_message", str(malformed))
        data = message.get("data") if isinstance(message, Mapping) else None
        if not isinstance(data, Mapping):
            return bad("malformed_message", "the message has no data object")
        where = f"{plan.channel} replay id {replay}"
        try:
            common["_cdc_created_date"] = _created(data)
            if plan.kind == "generic":
                return [self._generic(common, data)]
            if plan.layout is None:
                return bad("no_describe", plan.missing or f"no describe for {plan.channel}")
            if plan.kind == "pushtopic":
                return [self._pushtopic(common, data, bronze.get("event_type"), where)]
            if plan.kind == "platform_event":
                return [self._platform_event(common, data, where)]
            return self._change_event(common, data, where)
        except _BadValue as exc:
            return bad(exc.kind, str(exc))

    def _generic(self, common: dict[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
        payload = data.get("payload")
        if payload is not None and not isinstance(payload, str):
            payload = json.dumps(payload, separators=(",", ":"))
        return {**common, "payload": payload}

    def _pushtopic(
        self, common: dict[str, Any], data: Mapping[str, Any], event_type: Any, where: str
    ) -> dict[str, Any]:
        layout = self.plan.layout
        assert layout is not None
        change = _CHANGE_TYPES.get(str(event_type))
        if change is None:
            raise _BadValue(
                "bad_event_type",
                f"{where}: expected event type created, updated, deleted or undeleted (got "
                f"{event_type!r})",
            )
        # Salesforce puts the record under data.sobject (the guide's "PushTopic Queries").
        record = data.get("sobject")
        if not isinstance(record, Mapping):
            raise _BadValue(
                "malformed_message", f"{where}: expected the record as data.sobject (got none)"
            )
        record_id = record.get("Id")
        if not isinstance(record_id, str) or not record_id:
            raise _BadValue("missing_id", f"{where}: data.sobject has no Id")
        body, carried, nulls, _ = _body(layout, record, frozenset({"Id"}), where)
        return {
            **common,
            **body,
            ID_COLUMN: record_id,
            "_cdc_change_type": change,
            "_cdc_entity": self.plan.entity,
            "_cdc_commit_timestamp": common["_cdc_created_date"],
            "_cdc_changed_fields": [] if change == "DELETE" else carried,
            "_cdc_nulled_fields": [] if change == "DELETE" else nulls,
            "_cdc_diff_fields": [],
            "_cdc_record_count": 1,
            "_cdc_is_wildcard": False,
        }

    def _platform_event(
        self, common: dict[str, Any], data: Mapping[str, Any], where: str
    ) -> dict[str, Any]:
        layout = self.plan.layout
        assert layout is not None
        payload = data.get("payload")
        if not isinstance(payload, Mapping):
            raise _BadValue("malformed_message", f"{where}: the event has no payload object")
        event = data.get("event")
        uuid = event.get("EventUuid") if isinstance(event, Mapping) else None
        body, _, _, _ = _body(layout, payload, frozenset(), where)
        schema = data.get("schema")
        return {
            **common,
            **body,
            "_cdc_event_id": uuid if isinstance(uuid, str) else common["_cdc_event_id"],
            "_cdc_schema_id": schema if isinstance(schema, str) else None,
        }

    def _change_event(
        self, common: dict[str, Any], data: Mapping[str, Any], where: str
    ) -> list[dict[str, Any]]:
        layout = self.plan.layout
        assert layout is not None
        payload = data.get("payload")
        header = payload.get("ChangeEventHeader") if isinstance(payload, Mapping) else None
        if not isinstance(payload, Mapping) or not isinstance(header, Mapping):
            raise _BadValue(
                "malformed_message", f"{where}: expected data.payload.ChangeEventHeader"
            )
        ids = header.get("recordIds")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise _BadValue("missing_id", f"{where}: the header has no recordIds")
        body, _, _, diffs = _body(layout, payload, frozenset({"ChangeEventHeader"}), where)

        def names(key: str) -> list[str] | None:
            value = header.get(key)
            return [str(v) for v in value] if isinstance(value, list) else None

        # Over CometD the header has changedFields but neither nulledFields nor diffFields
        # (Pub/Sub's Avro header has all three): a nulled field is a changed one that comes
        # as null or not at all, a diffed one comes as {"diff": ...}.
        changed = names("changedFields") or []
        nulled = names("nulledFields")
        if nulled is None:
            nulled = _nulled(changed, payload) if header.get("changeType") == "UPDATE" else []
        diffed = names("diffFields")
        committed = header.get("commitTimestamp")
        schema = data.get("schema")
        head = {
            **common,
            **body,
            "_cdc_change_type": header.get("changeType"),
            "_cdc_entity": header.get("entityName") or self.plan.entity,
            "_cdc_commit_timestamp": _value("timestamp", committed, f"{where}.commitTimestamp"),
            "_cdc_commit_number": _int(header.get("commitNumber")),
            "_cdc_transaction_key": header.get("transactionKey"),
            "_cdc_sequence_number": _int(header.get("sequenceNumber")),
            "_cdc_commit_user": header.get("commitUser"),
            "_cdc_change_origin": header.get("changeOrigin"),
            "_cdc_schema_id": schema if isinstance(schema, str) else None,
            "_cdc_changed_fields": changed,
            "_cdc_nulled_fields": nulled,
            "_cdc_diff_fields": diffs if diffed is None else diffed,
            "_cdc_record_count": len(ids),
            "_cdc_is_wildcard": any(i.endswith("*") for i in ids),
        }
        return [{**head, ID_COLUMN: record_id} for record_id in ids]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _created(data: Mapping[str, Any]) -> datetime | None:
    event = data.get("event")
    created = event.get("createdDate") if isinstance(event, Mapping) else None
    if created is None:
        return None
    return _value("timestamp", created, "data.event.createdDate")  # type: ignore[no-any-return]
