"""PushTopic records: validation as the Streaming API guide states it, and evaluation of record
changes into notifications on ``/topic/<Name>``.

Validation (``FIELD_INTEGRITY_EXCEPTION`` / ``INVALID_FIELD`` / ``REQUIRED_FIELD_MISSING`` /
``STRING_TOO_LONG`` / ``DUPLICATE_VALUE``): ``Name`` required, at most 25 characters of letters,
digits and underscores, unique; ``Query`` required, at most 1,300 characters, in the accepted
SOQL subset (:mod:`ingest.emulator.cometd.soql`), selecting ``Id``, on a supported object
(every custom object; Account, Campaign, Case, Contact, Lead, Opportunity, Task and the pilot
objects) whose fields it names exist; ``ApiVersion`` required, above 20.0; ``NotifyForFields``
one of ``All``, ``Referenced`` (default), ``Select``, ``Where``, with the query shape each
needs; ``Description`` at most 400 characters.

Evaluation of one record change (``NotifyForOperation<Op>`` must be true and the topic active):

- created, undeleted, deleted: the record's values match the ``WHERE`` clause (a deletion is
  matched on the values the record had);
- updated: the ``WHERE`` clause matches and a field that ``NotifyForFields`` watches changed:
  any field (``All``), a field of the ``SELECT`` or ``WHERE`` clause (``Referenced``), of the
  ``SELECT`` clause (``Select``) or of the ``WHERE`` clause (``Where``).

A notification's ``data`` is ``{"event": {"createdDate", "replayId", "type"}, "sobject":
{...}}`` (the guide's "PushTopic Queries"): the selected fields with the record's full current
values (REST API shapes), only ``Id`` for a deletion.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.emulator.cometd.busjson import iso_datetime
from ingest.emulator.cometd.channels import Hub
from ingest.emulator.cometd.fields import ObjectField, ObjectFields
from ingest.emulator.cometd.records import RecordChange
from ingest.emulator.cometd.sobjects import SObjectError, check_body, new_id
from ingest.emulator.cometd.soql import (
    And,
    Compare,
    Condition,
    DateLiteral,
    DateTimeLiteral,
    Includes,
    InList,
    Like,
    Or,
    SoqlError,
    condition_fields,
    evaluate,
    parse_query,
)
from ingest.emulator.managed import salesforce_id_18

__all__ = ["PUSH_TOPIC_FIELDS", "PushTopics", "bind_condition"]

PUSH_TOPIC_FIELDS: dict[str, tuple[str, str]] = {
    "Id": ("id", "id"),
    "Name": ("string", "string"),
    "Query": ("string", "string"),
    "ApiVersion": ("double", "double"),
    "Description": ("string", "string"),
    "IsActive": ("boolean", "boolean"),
    "IsDeleted": ("boolean", "boolean"),
    "NotifyForFields": ("string", "picklist"),
    "NotifyForOperations": ("string", "picklist"),
    "NotifyForOperationCreate": ("boolean", "boolean"),
    "NotifyForOperationUpdate": ("boolean", "boolean"),
    "NotifyForOperationDelete": ("boolean", "boolean"),
    "NotifyForOperationUndelete": ("boolean", "boolean"),
}
_WRITABLE: dict[str, type | tuple[type, ...]] = {
    "Name": str,
    "Query": str,
    "ApiVersion": (int, float),
    "Description": str,
    "IsActive": bool,
    "NotifyForFields": str,
    "NotifyForOperationCreate": bool,
    "NotifyForOperationUpdate": bool,
    "NotifyForOperationDelete": bool,
    "NotifyForOperationUndelete": bool,
}
_STANDARD = frozenset(
    {
        "Account",
        "Campaign",
        "Case",
        "Contact",
        "Lead",
        "Opportunity",
        "Task",
        "ContractLineItem",
        "Entitlement",
        "LiveChatTranscript",
        "Quote",
        "QuoteLineItem",
        "ServiceContract",
    }
)
_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_NOTIFY_FOR_FIELDS = ("All", "Referenced", "Select", "Where")
_OPS = {
    "created": "NotifyForOperationCreate",
    "updated": "NotifyForOperationUpdate",
    "deleted": "NotifyForOperationDelete",
    "undeleted": "NotifyForOperationUndelete",
}
_NUMERIC = ("int", "long", "double")


def _bad(code: str, message: str, *fields: str) -> SObjectError:
    return SObjectError(code, message, fields=fields)


def _literal(field: ObjectField, value: Any) -> Any:
    if value is None:
        return None
    kind = field.kind
    if kind == "date" and isinstance(value, DateLiteral):
        return value
    if kind == "datetime" and isinstance(value, DateTimeLiteral):
        return value
    if kind in _NUMERIC and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "id" and isinstance(value, str):
        if len(value) == 15 and value.isalnum():
            return salesforce_id_18(value)
        return value
    if kind in ("string", "multi_picklist", "time") and isinstance(value, str):
        return value
    expected = {"date": "date", "datetime": "datetime", "boolean": "boolean"}.get(
        kind, "number" if kind in _NUMERIC else "string"
    )
    quoted = "should be enclosed in quotes" if expected == "string" else "should not be quoted"
    raise SoqlError(
        "INVALID_FIELD",
        f"value of filter criterion for field '{field.name}' must be of type {expected} and "
        f"{quoted}",
    )


def bind_condition(cond: Condition | None, fields: ObjectFields) -> Condition | None:
    """``cond`` with canonical field names and literals checked against the field types."""
    if cond is None:
        return None
    if isinstance(cond, And | Or):
        items = tuple(bind_condition(c, fields) for c in cond.items)
        return type(cond)(items)  # type: ignore[arg-type]
    field = fields.get(cond.field)
    if field is None:
        raise SoqlError("INVALID_FIELD", f"Query fields {cond.field} do not exist on the entity")
    if field.kind in ("long_text", "compound"):
        raise SoqlError(
            "INVALID_FIELD", f"field '{field.name}' can not be filtered in a PushTopic query"
        )
    if isinstance(cond, Compare):
        return Compare(field.name, cond.op, _literal(field, cond.value))
    if isinstance(cond, InList):
        return InList(field.name, tuple(_literal(field, v) for v in cond.values), cond.negated)
    if isinstance(cond, Like):
        if field.kind not in ("string", "id"):
            raise SoqlError("INVALID_FIELD", f"LIKE needs a text field ('{field.name}' is not)")
        return Like(field.name, cond.pattern)
    if field.kind != "multi_picklist":
        raise SoqlError(
            "INVALID_FIELD", f"INCLUDES/EXCLUDES need a multi-select picklist ('{field.name}')"
        )
    return Includes(field.name, cond.values, cond.negated)


@dataclass(frozen=True)
class _Compiled:
    """A PushTopic ready to evaluate."""

    entity: str
    select: tuple[ObjectField, ...]
    where: Condition | None
    select_sources: frozenset[str]
    where_sources: frozenset[str]
    lookup: Mapping[str, ObjectField]


def compile_query(
    soql: str, object_fields: Callable[[str], ObjectFields | None], notify_for: str
) -> _Compiled:
    """Parse and check a PushTopic query; :class:`SoqlError` otherwise."""
    if len(soql) > 1300:
        raise SoqlError("STRING_TOO_LONG", f"Query: data value too large: {len(soql)} > 1300")
    query = parse_query(soql)
    fields = object_fields(query.entity)
    if fields is None:
        raise SoqlError(
            "INVALID_TYPE",
            f"sObject type '{query.entity}' is not supported. If you are attempting to use a "
            "custom object, be sure to append the '__c' after the entity name.",
        )
    entity = fields.entity
    if not entity.endswith("__c") and entity not in _STANDARD:
        raise SoqlError("INVALID_TYPE", f"Entity '{entity}' is not supported by PushTopic queries")
    missing = [name for name in query.fields if fields.get(name) is None]
    if missing:
        raise SoqlError(
            "INVALID_FIELD", f"Query fields {', '.join(missing)} do not exist on the topic entity"
        )
    select = tuple(dict.fromkeys(f for f in (fields.get(n) for n in query.fields) if f))
    if not any(f.name == "Id" for f in select):
        raise SoqlError("INVALID_FIELD", "The PushTopic query must select the Id field")
    where = bind_condition(query.where, fields)
    where_fields = [f for f in (fields.get(n) for n in condition_fields(where)) if f]
    non_id_select = [f for f in select if f.name != "Id"]
    non_id_where = [f for f in where_fields if f.name != "Id"]
    need = {
        "Referenced": (non_id_select or non_id_where, "a SELECT or WHERE field other than Id"),
        "Select": (non_id_select, "a SELECT field other than Id"),
        "Where": (non_id_where, "a WHERE clause with a field other than Id"),
    }.get(notify_for)
    if need is not None and not need[0]:
        raise SoqlError(
            "FIELD_INTEGRITY_EXCEPTION",
            f"NotifyForFields={notify_for} needs {need[1]} in the query",
        )
    return _Compiled(
        entity,
        select,
        where,
        frozenset(s for f in select for s in f.sources),
        frozenset(s for f in where_fields for s in f.sources),
        {f.name: f for f in (*select, *where_fields)},
    )


class PushTopics:
    """The org's PushTopic records and their channels (see the module docstring)."""

    def __init__(self, hub: Hub, object_fields: Callable[[str], ObjectFields | None]) -> None:
        self._hub = hub
        self._object_fields = object_fields
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = {}
        self._compiled: dict[str, _Compiled] = {}

    # -- records ---------------------------------------------------------------------------

    def create(self, body: object) -> str:
        values = check_body("PushTopic", body, _WRITABLE)
        record: dict[str, Any] = {
            "Name": None,
            "Query": None,
            "ApiVersion": None,
            "Description": None,
            "IsActive": True,
            "IsDeleted": False,
            "NotifyForFields": "Referenced",
            "NotifyForOperationCreate": True,
            "NotifyForOperationUpdate": True,
            "NotifyForOperationDelete": True,
            "NotifyForOperationUndelete": True,
        }
        record.update({k: v for k, v in values.items() if v is not None or k == "Description"})
        with self._lock:
            record["Id"] = new_id("0IF")
            compiled = self._validate(record, exclude=None)
            self._store(record, compiled)
            self._hub.open(f"/topic/{record['Name']}")
            return str(record["Id"])

    def update(self, record_id: str, body: object) -> None:
        values = check_body("PushTopic", body, _WRITABLE)
        with self._lock:
            current = self._get(record_id)
            record = {**current, **values}
            compiled = self._validate(record, exclude=record_id)
            self._store(record, compiled)
            if record["Name"] != current["Name"]:
                # Live subscriptions keep the old channel; new ones use the new name.
                self._hub.open(f"/topic/{record['Name']}")

    def delete(self, record_id: str) -> None:
        with self._lock:
            record = self._get(record_id)
            del self._records[record["Id"]]
            self._compiled.pop(record["Id"], None)
            self._hub.close(f"/topic/{record['Name']}")

    def get(self, record_id: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._get(record_id))

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._records.values()]

    def _get(self, record_id: str) -> dict[str, Any]:
        key = salesforce_id_18(record_id) if len(record_id) == 15 else record_id
        record = self._records.get(key)
        if record is None:
            raise SObjectError("NOT_FOUND", "The requested resource does not exist", status=404)
        return record

    def _store(self, record: dict[str, Any], compiled: _Compiled) -> None:
        create = record["NotifyForOperationCreate"]
        update = record["NotifyForOperationUpdate"]
        operations = "Create" if create else "Update" if update else "Extended"
        record["NotifyForOperations"] = "All" if create and update else operations
        self._records[record["Id"]] = record
        self._compiled[record["Id"]] = compiled

    def _validate(self, record: dict[str, Any], *, exclude: str | None) -> _Compiled:
        for name in ("Name", "Query", "ApiVersion"):
            if record.get(name) in (None, ""):
                raise _bad("REQUIRED_FIELD_MISSING", f"Required fields are missing: [{name}]", name)
        name = record["Name"]
        if len(name) > 25:
            raise _bad("STRING_TOO_LONG", f"Name: data value too large: {name!r} (max 25)", "Name")
        if not _NAME.match(name):
            raise _bad(
                "FIELD_INTEGRITY_EXCEPTION",
                f"Name must use letters, digits and underscores only (got {name!r})",
                "Name",
            )
        for other in self._records.values():
            if other["Id"] != exclude and other["Name"].lower() == name.lower():
                raise _bad("DUPLICATE_VALUE", f"duplicate value found: Name {name!r}", "Name")
        if float(record["ApiVersion"]) <= 20.0:
            raise _bad(
                "FIELD_INTEGRITY_EXCEPTION",
                f"ApiVersion must be greater than 20.0 (got {record['ApiVersion']})",
                "ApiVersion",
            )
        if record["NotifyForFields"] not in _NOTIFY_FOR_FIELDS:
            raise _bad(
                "INVALID_OR_NULL_FOR_RESTRICTED_PICKLIST",
                f"NotifyForFields: expected one of {', '.join(_NOTIFY_FOR_FIELDS)} (got "
                f"{record['NotifyForFields']!r})",
                "NotifyForFields",
            )
        description = record.get("Description")
        if description is not None and len(description) > 400:
            raise _bad("STRING_TOO_LONG", "Description: data value too large (max 400)")
        try:
            return compile_query(record["Query"], self._object_fields, record["NotifyForFields"])
        except SoqlError as exc:
            raise _bad(exc.code, exc.message, "Query") from exc

    # -- evaluation --------------------------------------------------------------------------

    def evaluate(self, change: RecordChange) -> int:
        """Append a notification to every active topic ``change`` matches; returns how many."""
        with self._lock:
            topics = [
                (dict(self._records[rid]), compiled)
                for rid, compiled in self._compiled.items()
                if compiled.entity == change.entity and self._records[rid]["IsActive"]
            ]
        sent = 0
        for record, compiled in topics:
            if self._matches(record, compiled, change):
                self._notify(record, compiled, change)
                sent += 1
        return sent

    @staticmethod
    def _matches(record: Mapping[str, Any], compiled: _Compiled, change: RecordChange) -> bool:
        if not record[_OPS[change.operation]]:
            return False
        deleted = change.operation == "deleted"
        lookup = compiled.lookup

        def value_of(name: str) -> Any:
            return lookup[name].wire(change.record_id, change.values, deleted)

        if not evaluate(compiled.where, value_of):
            return False
        if change.operation != "updated":
            return True
        mode = record["NotifyForFields"]
        if mode == "All":
            return bool(change.changed)
        watched = {
            "Referenced": compiled.select_sources | compiled.where_sources,
            "Select": compiled.select_sources,
            "Where": compiled.where_sources,
        }[mode]
        return bool(watched & change.changed)

    def _notify(self, record: Mapping[str, Any], compiled: _Compiled, change: RecordChange) -> None:
        deleted = change.operation == "deleted"
        if deleted:
            sobject: dict[str, Any] = {"Id": change.record_id}
        else:
            sobject = {
                f.name: f.rest(change.record_id, change.values, False) for f in compiled.select
            }
        created = iso_datetime(change.commit_ms)

        def build(replay_id: int) -> dict[str, Any]:
            return {
                "event": {"createdDate": created, "replayId": replay_id, "type": change.operation},
                "sobject": sobject,
            }

        channel = f"/topic/{record['Name']}"
        if self._hub.exists(channel):
            self._hub.append(channel, build)
