"""Reading records for a snapshot: over the REST API, or over the Bulk API 2.0 for large reads.

A bootstrap, and a re-sync after an overflow or a replay gap, reads a whole object; other
re-syncs read the records gold flagged, 200 ids per ``WHERE Id IN (...)`` query. Named records
are always read over REST (a Bulk job per 200 ids would only add latency). A whole object is
read as ``api`` says:

- ``rest``: ``queryAll``, 2,000 records per request;
- ``bulk``: one Bulk API 2.0 query job (``queryAll``), its CSV results read 50,000 records per
  request (:class:`BulkRecords`);
- ``auto`` (the default): ``SELECT COUNT() FROM <Object>`` first (one REST request, deleted
  records included), then Bulk from :data:`BULK_THRESHOLD` records on, REST below. Under that
  size REST needs at most 25 requests and no job has to be queued, polled and cleaned up.

:class:`BulkRecords` shapes each CSV row like the REST API's JSON record, so both paths end in
:func:`pipelines.snapshot_rows.rest_row` and give the same gold rows. The object's describe
says how: a Bulk job cannot return an Address or Location compound field, so its parts are
selected instead (the describe's ``compoundFieldName`` lists them) and nested again under the
compound's name with the REST API's lower-camel keys (``BillingCity`` -> ``BillingAddress.city``);
each value is read by its describe ``type`` (booleans and numbers from their text, everything
else as text; an empty CSV value is null, as Salesforce stores no empty text).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ingest.bulk import BulkQueryClient, typed_value
from ingest.errors import RestError

__all__ = [
    "BULK_THRESHOLD",
    "Api",
    "BulkRecords",
    "RecordReader",
    "SnapshotSource",
    "WholeRead",
]

_log = logging.getLogger(__name__)

Api = Literal["rest", "bulk", "auto"]
# Records from which `auto` reads a whole object with a Bulk API 2.0 job.
BULK_THRESHOLD = 50_000
_SELECT = re.compile(
    r"^\s*SELECT\s+(?P<fields>.+?)\s+FROM\s+(?P<object>[A-Za-z][A-Za-z0-9_]*)"
    r"(?P<rest>\s+.*?)?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_COMPOUND_TYPES = frozenset({"address", "location"})
# Describe types whose CSV text typed_value converts (booleans and numbers).
_TYPED = frozenset({"boolean", "int", "long", "double", "currency", "percent"})


class RecordReader(Protocol):
    """What a snapshot needs of a reader: ``query_all(soql)`` yielding records shaped as the
    REST API's JSON (:class:`ingest.rest.RestClient` is one, :class:`BulkRecords` another)."""

    def query_all(self, soql: str) -> Iterator[dict[str, Any]]:
        """Every record ``soql`` selects, deleted ones included."""
        ...


def _lower_camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _stem(compound: str, part: str) -> str:
    """The prefix a compound field's parts share: ``BillingAddress`` -> ``Billing``,
    ``HQ_Location__c`` -> ``HQ_Location__`` (its parts end in ``__s``), ``Location`` -> ``""``."""
    if compound.endswith("__c"):
        return compound.removesuffix("__c") + "__"
    for suffix in ("Address", "Location"):
        if compound.endswith(suffix):
            return compound.removesuffix(suffix)
    length = 0
    for a, b in zip(compound, part, strict=False):
        if a != b:
            break
        length += 1
    return compound[:length]


@dataclass(frozen=True)
class _Column:
    """One CSV column: where its value goes in the REST-shaped record and how it reads."""

    name: str
    sf_type: str
    compound: str | None
    key: str


class BulkRecords:
    """A :class:`RecordReader` over Bulk API 2.0 query jobs (see the module docstring).

    ``describe(object)`` returns the object's ``sobjects/<Object>/describe`` (a REST client's
    :meth:`~ingest.rest.RestClient.describe`); it is asked once per object.
    """

    def __init__(
        self,
        bulk: BulkQueryClient,
        *,
        describe: Callable[[str], Mapping[str, Any]],
    ) -> None:
        self.bulk = bulk
        self._describe = describe
        self._described: dict[str, dict[str, Mapping[str, Any]]] = {}

    def fields(self, entity: str) -> dict[str, Mapping[str, Any]]:
        """The describe's fields of ``entity`` by lower-case name (SOQL ignores case)."""
        if entity not in self._described:
            body = self._describe(entity)
            fields = body.get("fields")
            if not isinstance(fields, list):
                raise RestError(f"describe of {entity}: expected a 'fields' list")
            self._described[entity] = {
                str(f["name"]).lower(): f for f in fields if isinstance(f, Mapping) and "name" in f
            }
        return self._described[entity]

    def plan(self, soql: str) -> tuple[str, list[_Column]]:
        """The Bulk SOQL for ``soql`` (compound fields replaced by their parts) and its
        columns."""
        match = _SELECT.match(soql)
        if match is None:
            raise ValueError(f"expected SELECT <fields> FROM <object> [...] (got {soql[:80]!r})")
        entity = match.group("object")
        described = self.fields(entity)
        columns: list[_Column] = []
        for name in (n.strip() for n in match.group("fields").split(",")):
            field = described.get(name.lower())
            if field is None:
                raise RestError(
                    f"Bulk read of {entity}: the describe of {entity} has no field {name!r}; the "
                    "event schema names fields the object does not have (check the user's field "
                    "permissions, or read with --api rest)"
                )
            sf_type = str(field.get("type", "string"))
            if sf_type not in _COMPOUND_TYPES:
                columns.append(_Column(str(field["name"]), sf_type, None, str(field["name"])))
                continue
            compound = str(field["name"])
            parts = [f for f in described.values() if f.get("compoundFieldName") == compound]
            if not parts:
                raise RestError(
                    f"Bulk read of {entity}: the describe lists no parts of the compound field "
                    f"{compound} (fields whose compoundFieldName is {compound}); Bulk API 2.0 "
                    "cannot return the compound itself"
                )
            for part in parts:
                name_ = str(part["name"])
                stem = _stem(compound, name_)
                if not name_.startswith(stem):
                    raise RestError(
                        f"Bulk read of {entity}: {name_} does not look like a part of {compound}"
                    )
                child = name_.removeprefix(stem).removesuffix("__s")
                columns.append(
                    _Column(name_, str(part.get("type", "string")), compound, _lower_camel(child))
                )
        names = list(dict.fromkeys(c.name for c in columns))
        rest = match.group("rest") or ""
        return f"SELECT {', '.join(names)} FROM {entity}{rest}", columns

    def query_all(self, soql: str) -> Iterator[dict[str, Any]]:
        bulk_soql, columns = self.plan(soql)
        entity = _SELECT.match(soql).group("object")  # type: ignore[union-attr]
        compounds = list(dict.fromkeys(c.compound for c in columns if c.compound is not None))
        # Text types need no conversion; only the others go through typed_value.
        plain = [c for c in columns if c.compound is None and c.sf_type not in _TYPED]
        typed = [c for c in columns if c.compound is None and c.sf_type in _TYPED]
        parts = [c for c in columns if c.compound is not None]
        for row in self.bulk.query_all(bulk_soql):
            record: dict[str, Any] = {"attributes": {"type": entity}}
            for column in plain:
                record[column.name] = row.get(column.name)
            try:
                for column in typed:
                    record[column.name] = typed_value(
                        row.get(column.name), column.sf_type, where=column.name
                    )
                nested: dict[str, dict[str, Any]] = {c: {} for c in compounds}
                for column in parts:
                    nested[column.compound][column.key] = typed_value(  # type: ignore[index]
                        row.get(column.name), column.sf_type, where=column.name
                    )
            except ValueError as exc:
                raise RestError(
                    f"Bulk value of {entity} record {row.get('Id') or '?'}: {exc}"
                ) from None
            for compound, children in nested.items():
                # The REST API writes a compound whose parts are all empty as null.
                has_value = any(v is not None for v in children.values())
                record[compound] = children if has_value else None
            yield record


@dataclass
class WholeRead:
    """A whole object's records (``records``), the API reading them, and how many there are
    when that is known (``total``)."""

    records: Iterator[dict[str, Any]]
    api: Literal["rest", "bulk"]
    total: int | None


class SnapshotSource:
    """Where a snapshot reads records from (see the module docstring): ``rest`` for named
    records and for whole objects under ``api`` ``rest``; ``bulk`` for whole objects under
    ``bulk``; ``auto`` counts first (``rest`` must then have ``count``, as
    :class:`~ingest.rest.RestClient` does) and picks by ``bulk_threshold``."""

    def __init__(
        self,
        rest: RecordReader,
        *,
        bulk: RecordReader | None = None,
        api: Api = "rest",
        bulk_threshold: int = BULK_THRESHOLD,
        logger: logging.Logger | None = None,
    ) -> None:
        if api not in ("rest", "bulk", "auto"):
            raise ValueError(f"api must be 'rest', 'bulk' or 'auto' (got {api!r})")
        if api != "rest" and bulk is None:
            raise ValueError(f"api {api!r} needs a Bulk API reader (bulk=...)")
        if bulk_threshold < 0:
            raise ValueError(f"bulk_threshold must be >= 0 (got {bulk_threshold})")
        self.rest = rest
        self.bulk = bulk
        self.api = api
        self.bulk_threshold = bulk_threshold
        self._log = logger or _log

    def named(self, soql: str) -> Iterator[dict[str, Any]]:
        """Records a ``WHERE Id IN (...)`` query names, over REST."""
        return self.rest.query_all(soql)

    def count(self, entity: str, *, where: str | None = None) -> int | None:
        """Records of ``entity`` (that satisfy ``where``), deleted ones included (``None``:
        ``rest`` cannot count)."""
        count: Callable[..., int] | None = getattr(self.rest, "count", None)
        if count is None:
            return None
        condition = f" WHERE {where}" if where else ""
        return int(count(f"SELECT COUNT() FROM {entity}{condition}", include_deleted=True))

    def whole(
        self, soql: str, entity: str, *, want_total: bool = False, where: str | None = None
    ) -> WholeRead:
        """Every record of ``entity`` that ``soql`` selects, over the API ``api`` picks;
        ``want_total`` counts them first when the choice did not need to; ``where`` is the
        condition of ``soql`` (the records counted)."""
        total = self.count(entity, where=where) if self.api == "auto" or want_total else None
        if self.api == "bulk" or (
            self.api == "auto" and total is not None and total >= self.bulk_threshold
        ):
            assert self.bulk is not None
            if self.api == "auto":
                self._log.info(
                    "%s: %d records (>= %d): reading them with a Bulk API 2.0 query job",
                    entity,
                    total,
                    self.bulk_threshold,
                )
            return WholeRead(self.bulk.query_all(soql), "bulk", total)
        if self.api == "auto":
            self._log.info(
                "%s: %s records (< %d): reading them over REST", entity, total, self.bulk_threshold
            )
        return WholeRead(self.rest.query_all(soql), "rest", total)
