"""The fields of an emulated object as the REST and Streaming APIs name them.

A change event schema nests compound fields (``BillingAddress`` with ``City``...); the REST
API and PushTopic queries also name their parts as fields of their own (``BillingCity``,
``HQ_Location__Latitude__s``, ``FirstName``). :class:`ObjectFields` lists both, with:

- how to read each one from a ground-truth record, as the REST API shows it (a notification's
  ``sobject``) and normalized for a ``WHERE`` comparison (dates as epoch milliseconds);
- which change event field names (``changedFields`` entries such as ``BillingAddress.City``)
  count as a change of it, following the guide's compound-field rules: a person ``Name``
  changes when any part changes (its parts alone never notify), an Address or Geolocation
  changes only through its constituent fields;
- its ``describe`` entry (type, nillable, compound parent).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ingest.emulator.formulas import Formula
from ingest.emulator.rest import MODSTAMP, rest_readers
from ingest.schema import HEADER_FIELD, EventSchema, FieldInfo

__all__ = ["ObjectField", "ObjectFields", "Reader", "describe_type", "lossy_conversion"]

Reader = Callable[[str, Mapping[str, Any], bool], Any]

_NOT_NILLABLE = frozenset(
    {
        "Id",
        "IsDeleted",
        "Name",
        "OwnerId",
        "CreatedDate",
        "CreatedById",
        "LastModifiedDate",
        "LastModifiedById",
        "IsPersonAccount",
        "SystemModstamp",
    }
)
_READ_ONLY = frozenset({"Id", "IsDeleted", "IsPersonAccount", "SystemModstamp"})
_STRING_TYPES = {
    "Phone": "phone",
    "Email": "email",
    "Url": "url",
    "DynamicEnum": "picklist",
    "StaticEnum": "picklist",
}
_DOUBLE_TYPES = {"Currency": "currency", "Percent": "percent"}
_KIND_TYPES = {
    "long_text": "textarea",
    "multi_picklist": "multipicklist",
    "boolean": "boolean",
    "int": "int",
    "long": "long",
    "date": "date",
    "datetime": "datetime",
    "time": "time",
}
_ADDRESS_TYPES = {"Street": "textarea", "Latitude": "double", "Longitude": "double"}


@dataclass(frozen=True)
class ObjectField:
    """One field (see the module docstring). ``kind`` is the schema's field kind (``id``,
    ``string``, ``date``, ...); ``parent`` names the compound field a part belongs to."""

    name: str
    kind: str
    sf_type: str
    nillable: bool
    parent: str | None
    sources: frozenset[str]
    rest: Reader
    wire: Reader
    # A formula field: computed when read, never written.
    calculated: bool = False
    # The name of the record value ``wire`` returns as it is stored (None: read otherwise).
    stored: str | None = None

    def describe(self) -> dict[str, Any]:
        """The field's entry in ``sobjects/<Object>/describe``."""
        writable = self.name not in _READ_ONLY and not self.calculated
        return {
            "name": self.name,
            "label": self.name.removesuffix("__c").replace("_", " "),
            "type": self.sf_type,
            "nillable": self.nillable,
            "custom": self.name.endswith(("__c", "__s")),
            "calculated": self.calculated,
            "compoundFieldName": self.parent,
            "filterable": self.kind not in ("long_text", "compound"),
            "createable": writable,
            "updateable": writable,
            "referenceTo": [] if self.sf_type != "reference" else ["Unknown"],
        }


# A custom field type conversion that loses data (Salesforce nulls the field on every record and
# publishes one change event with a wildcard record id) and keeps the value's representation:
# to Number, Percent or Currency from another type, to or from Picklist (Multi-Select).
_LOSSY = {
    "percent": "double",
    "currency": "double",
    "double": "percent",
    "multipicklist": "string",
    "string": "multipicklist",
    "picklist": "multipicklist",
    "email": "multipicklist",
    "url": "multipicklist",
    "phone": "multipicklist",
}


def lossy_conversion(current: str) -> str | None:
    """The describe type a field of type ``current`` gets from a lossy conversion the emulator
    models (its values keep their representation), or None when it models none."""
    return _LOSSY.get(current)


def describe_type(info: FieldInfo, retyped: Mapping[str, str] | None = None) -> str:
    """The ``type`` of a schema field in ``sobjects/<Object>/describe``: the type ``retyped``
    gives it (field -> type, after a custom field type conversion), or the schema's."""
    converted = (retyped or {}).get(info.name)
    if converted is not None:
        return converted
    if info.kind == "id":
        return "reference"
    if info.kind == "string":
        return _STRING_TYPES.get(info.sf_type, "string")
    if info.kind == "double":
        return _DOUBLE_TYPES.get(info.sf_type, "double")
    if info.kind in ("compound", "switchable_name"):
        if info.sf_type == "Address":
            return "address"
        if info.sf_type == "Location":
            return "location"
        return "string"
    return _KIND_TYPES.get(info.kind, "anyType")


def _part_name(parent: FieldInfo, child: FieldInfo) -> str:
    """The REST name of a compound part: ``BillingAddress.City`` -> ``BillingCity``,
    ``HQ_Location__c.Latitude`` -> ``HQ_Location__Latitude__s``."""
    if parent.sf_type == "Location":
        if parent.name.endswith("__c"):
            return f"{parent.name.removesuffix('__c')}__{child.name}__s"
        return f"{parent.name.removesuffix('Location')}{child.name}"
    return f"{parent.name.removesuffix('Address')}{child.name}"


def _stored_as_is(info: FieldInfo | None) -> bool:
    # Ids, IsDeleted, person names (as their full name) read as the REST API shows them.
    return info is not None and info.kind not in ("switchable_name", "compound")


def _wire_top(name: str, info: FieldInfo | None, rest: Reader) -> Reader:
    if not _stored_as_is(info):
        return rest

    def read(rid: str, values: Mapping[str, Any], deleted: bool) -> Any:
        return values.get(name)

    return read


def _part_reader(parent: str, child: str) -> Reader:
    def read(rid: str, values: Mapping[str, Any], deleted: bool) -> Any:
        value = values.get(parent)
        return value.get(child) if isinstance(value, Mapping) else None

    return read


class ObjectFields:
    """Every field of one object (``Id`` and ``IsDeleted`` included), looked up ignoring
    case as SOQL does."""

    def __init__(self, entity: str, fields: Mapping[str, ObjectField]) -> None:
        self.entity = entity
        self._fields = dict(fields)
        self._lower = {name.lower(): f for name, f in self._fields.items()}

    @classmethod
    def of_schema(
        cls,
        schema: EventSchema,
        formulas: Sequence[Formula] = (),
        retyped: Mapping[str, str] | None = None,
    ) -> ObjectFields:
        """The fields of the object whose change events ``schema`` describes, and its
        ``formulas`` (computed from the record when read). ``retyped`` gives the describe type
        of fields whose type was converted since (field -> type)."""
        infos = [f for f in schema.fields if f.name != HEADER_FIELD]
        by_name = {f.name: f for f in infos}
        readers = rest_readers(infos)
        out: dict[str, ObjectField] = {}

        def add(
            name: str,
            kind: str,
            sf_type: str,
            *,
            parent: str | None = None,
            sources: frozenset[str] = frozenset(),
            wire: Reader | None = None,
        ) -> None:
            rest = readers.get(name) or _part_reader(parent or "", name)
            info = by_name.get(name)
            out.setdefault(
                name,
                ObjectField(
                    name,
                    kind,
                    sf_type,
                    name not in _NOT_NILLABLE,
                    parent,
                    sources,
                    rest,
                    wire or _wire_top(name, info, rest),
                    stored=name if wire is None and _stored_as_is(info) else None,
                ),
            )

        add("Id", "id", "id")
        add("IsDeleted", "boolean", "boolean")

        def modstamp(rid: str, values: Mapping[str, Any], deleted: bool) -> Any:
            return values.get(MODSTAMP)

        add(MODSTAMP, "datetime", "datetime", wire=modstamp)
        for info in infos:
            parts = {f"{info.name}.{c.name}" for c in info.children}
            if info.kind == "switchable_name" or (
                info.kind == "compound" and info.sf_type == "PersonName"
            ):
                # A name changes through any of its parts; the parts alone never notify.
                add(info.name, "string", "string", sources=frozenset({info.name, *parts}))
                for child in info.children:
                    add(child.name, "string", "string", parent=info.name)
                if info.kind == "switchable_name":
                    add("IsPersonAccount", "boolean", "boolean")
            elif info.children:
                # Address and Geolocation change only through their constituent fields.
                add(info.name, "compound", describe_type(info))
                for child in info.children:
                    part = _part_name(info, child)
                    reader = _part_reader(info.name, child.name)
                    add(
                        part,
                        child.kind,
                        _ADDRESS_TYPES.get(child.name, "string"),
                        parent=info.name,
                        sources=frozenset({f"{info.name}.{child.name}"}),
                        wire=reader,
                    )
                    # The REST value of a part: the nested value, as the parent shows it.
                    out[part] = _with_rest(out[part], _rest_part(readers[info.name], child))
            else:
                sf_type = describe_type(info, retyped)
                add(info.name, info.kind, sf_type, sources=frozenset({info.name}))
        for formula in formulas:

            def compute(
                rid: str, values: Mapping[str, Any], deleted: bool, f: Formula = formula
            ) -> Any:
                return f.value(values)

            out.setdefault(
                formula.name,
                ObjectField(
                    formula.name,
                    formula.kind,
                    formula.sf_type,
                    True,
                    None,
                    frozenset(formula.inputs),
                    compute,
                    compute,
                    calculated=True,
                ),
            )
        return cls(schema.entity_name, out)

    @classmethod
    def plain(cls, entity: str, kinds: Mapping[str, tuple[str, str]]) -> ObjectFields:
        """An object stored as plain dicts (``PushTopic``, ``StreamingChannel``): name ->
        (kind, describe type); values are read from the dict by name."""
        out = {}
        for name, (kind, sf_type) in kinds.items():

            def read(rid: str, values: Mapping[str, Any], deleted: bool, n: str = name) -> Any:
                return values.get(n)

            out[name] = ObjectField(
                name,
                kind,
                sf_type,
                name not in _NOT_NILLABLE,
                None,
                frozenset({name}),
                read,
                read,
                stored=name,
            )
        return cls(entity, out)

    def get(self, name: str) -> ObjectField | None:
        return self._lower.get(name.lower())

    def __iter__(self) -> Any:
        return iter(self._fields.values())

    def describe(self, version: str) -> dict[str, Any]:
        """``GET sobjects/<Object>/describe``: the object and its fields."""
        custom = self.entity.endswith("__c")
        return {
            "name": self.entity,
            "label": self.entity.removesuffix("__c").replace("_", " "),
            "custom": custom,
            "queryable": True,
            "createable": True,
            "updateable": True,
            "urls": {
                "sobject": f"/services/data/{version}/sobjects/{self.entity}",
                "describe": f"/services/data/{version}/sobjects/{self.entity}/describe",
            },
            "fields": [f.describe() for f in self._fields.values()],
        }


def _with_rest(field: ObjectField, rest: Reader) -> ObjectField:
    return replace(field, rest=rest)


def _rest_part(parent_rest: Reader, child: FieldInfo) -> Reader:
    key = child.name[:1].lower() + child.name[1:]

    def read(rid: str, values: Mapping[str, Any], deleted: bool) -> Any:
        nested = parent_rest(rid, values, deleted)
        return nested.get(key) if isinstance(nested, Mapping) else None

    return read
