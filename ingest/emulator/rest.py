"""The emulator's REST query endpoint, answered from the workload's ground truth.

``GET /services/data/vXX.X/query?q=<SOQL>`` (and ``/queryAll``, which also returns records in
the recycle bin with ``IsDeleted = true``) serve the records of
:class:`~ingest.emulator.truth.GroundTruth` as Salesforce's REST API does, so an initial load
or a re-sync can be tested end to end against the same org whose change events the emulator
streams.

Accepted SOQL (the shape ``sfcdc bootstrap`` and ``sfcdc resync`` emit)::

    SELECT <field>, <field>, ... FROM <Object> [WHERE Id IN ('<id>', ...) | WHERE Id = '<id>'
                                               | WHERE SystemModstamp >= <dateTime>]
    SELECT COUNT() FROM <Object> [WHERE ...]     (totalSize counts, no records)

``SystemModstamp >`` works as ``>=``; a dateTime literal is unquoted, ``2024-05-01T10:00:00Z``
or with an offset (``+02:00``), as SOQL writes it (incremental reads of objects without change
events filter on it).

Anything else (other functions, sub-queries, ``ORDER BY``, ``LIMIT``, other filters) is
answered with HTTP 400 and ``MALFORMED_QUERY``; an unknown object with ``INVALID_TYPE``, an
unknown field with ``INVALID_FIELD``; every error body is Salesforce's list of
``{"message", "errorCode"}``. :func:`parse_select` is that grammar, shared with the Bulk API
2.0 query jobs of :mod:`ingest.emulator.bulk`.

Records look like the REST API's: ``attributes`` (``type``, ``url``), dates ``YYYY-MM-DD``,
datetimes ``YYYY-MM-DDThh:mm:ss.000+0000``, times ``hh:mm:ss.000Z``; Address and Location
compound fields as nested objects with lower-camel keys (``{"city": ..., "postalCode": ...}``).
A person name (``Contact.Name``, and Account's ``Name`` for person accounts) is the full name
as text, its parts are fields of their own (``FirstName``, ``LastName``, ...), and
``Account.IsPersonAccount`` tells the two kinds of account apart.

Paging: at most ``page_size`` records per response (2,000 by default, as Salesforce; the
``Sforce-Query-Options: batchSize=N`` header asks for fewer); while ``done`` is false,
``nextRecordsUrl`` (``/services/data/vXX.X/query/<cursor>-<offset>``) gives the next page.
A query's records are fixed when it runs, like a Salesforce query cursor.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ingest.emulator.formulas import Formula
from ingest.emulator.topics import Catalogue
from ingest.emulator.truth import GroundTruth
from ingest.schema import HEADER_FIELD, FieldInfo

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MODSTAMP",
    "RestApi",
    "RestResponse",
    "Select",
    "SoqlProblem",
    "invalid_field",
    "invalid_type",
    "parse_select",
    "rest_readers",
    "stamped",
]

DEFAULT_PAGE_SIZE = 2000
# Not a field of change event schemas: the truth keeps it beside each record's values.
MODSTAMP = "SystemModstamp"
_MAX_CURSORS = 64
_VERSION = re.compile(r"^/services/data/v(\d{2}\.\d)(/.*)?$")
_QUERY = re.compile(
    r"^\s*SELECT\s+(?P<fields>.+?)\s+FROM\s+(?P<object>\S+)(?:\s+(?P<rest>.*?))?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_ID = r"'[A-Za-z0-9]{15,18}'"
_WHERE_IN = re.compile(rf"^WHERE\s+Id\s+IN\s*\(\s*({_ID}(?:\s*,\s*{_ID})*)\s*\)$", re.IGNORECASE)
_WHERE_EQ = re.compile(rf"^WHERE\s+Id\s*=\s*({_ID})$", re.IGNORECASE)
# SOQL dateTime literals: no quotes, a UTC 'Z' or an offset (fractions of seconds accepted).
_WHERE_STAMP = re.compile(
    r"^WHERE\s+SystemModstamp\s*(>=|>)\s*"
    r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,3})?(?:Z|[+-]\d{2}:?\d{2}))$",
    re.IGNORECASE,
)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_BATCH_SIZE = re.compile(r"batchSize\s*=\s*(\d+)", re.IGNORECASE)
_COUNT = re.compile(r"^COUNT\(\s*\)$", re.IGNORECASE)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Salesforce versions the REST API answers; older ones are retired.
_MIN_VERSION, _MAX_VERSION = 31.0, 66.0
_NAME_PARTS_ORDER = ("FirstName", "MiddleName", "LastName", "Suffix")


@dataclass(frozen=True)
class RestResponse:
    """An HTTP status and the JSON body to send."""

    status: int
    body: Any


def _error(status: int, code: str, message: str) -> RestResponse:
    return RestResponse(status, [{"message": message, "errorCode": code}])


def _malformed_message(soql: str, problem: str) -> str:
    return f"\n{soql.strip()[:200]}\nERROR: {problem}"


def _malformed(soql: str, problem: str) -> RestResponse:
    return _error(400, "MALFORMED_QUERY", _malformed_message(soql, problem))


class SoqlProblem(Exception):
    """A query the emulator refuses: ``code`` is Salesforce's ``errorCode``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Select:
    """A parsed query: ``fields`` as written (empty for ``COUNT()``), ``ids`` of a
    ``WHERE Id IN`` / ``Id =`` filter (``None``: every record), ``since`` of a ``WHERE
    SystemModstamp >= | > <dateTime>`` filter (the operator and epoch milliseconds)."""

    soql: str
    entity: str
    fields: tuple[str, ...]
    ids: tuple[str, ...] | None
    count: bool
    since: tuple[str, int] | None = None

    def wanted(self, stamp: int | None) -> bool:
        """Whether a record saved at ``stamp`` (epoch ms) passes the ``since`` filter."""
        if self.since is None:
            return True
        if stamp is None:
            return False
        op, bound = self.since
        return stamp >= bound if op == ">=" else stamp > bound


def parse_select(soql: str) -> Select:
    """Parse the accepted grammar (module docstring); :class:`SoqlProblem` otherwise, with
    ``MALFORMED_QUERY`` and Salesforce's message shape."""
    match = _QUERY.match(soql)
    if match is None:
        raise SoqlProblem(
            "MALFORMED_QUERY",
            _malformed_message(soql, "expected SELECT <fields> FROM <object>"),
        )
    names = [n.strip() for n in match.group("fields").split(",")]
    count = len(names) == 1 and _COUNT.fullmatch(names[0]) is not None
    bad = [n for n in names if _NAME.fullmatch(n) is None] if not count else []
    if bad:
        raise SoqlProblem(
            "MALFORMED_QUERY",
            _malformed_message(
                soql, f"unexpected token: {bad[0]!r} (this endpoint accepts plain field names only)"
            ),
        )
    rest = (match.group("rest") or "").strip()
    ids: tuple[str, ...] | None = None
    since: tuple[str, int] | None = None
    if rest:
        stamp = _WHERE_STAMP.match(rest)
        where = _WHERE_IN.match(rest) or _WHERE_EQ.match(rest)
        if stamp is not None:
            since = (stamp.group(1), _epoch_ms(stamp.group(2)))
        elif where is None:
            token = rest.split()[0]
            raise SoqlProblem(
                "MALFORMED_QUERY",
                _malformed_message(
                    soql,
                    f"unexpected token: {token!r} (expected nothing, WHERE Id IN ('<id>', ...) "
                    "or WHERE SystemModstamp >= <dateTime>)",
                ),
            )
        else:
            ids = tuple(i.strip().strip("'") for i in where.group(1).split(","))
    return Select(soql, match.group("object"), () if count else tuple(names), ids, count, since)


def _epoch_ms(literal: str) -> int:
    text = literal.upper().replace("Z", "+00:00")
    if len(text) >= 5 and text[-5] in "+-" and text[-3] != ":":
        text = text[:-2] + ":" + text[-2:]
    moment = datetime.fromisoformat(text)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def invalid_type(soql: str, name: str) -> str:
    """Salesforce's message for an unknown object."""
    return (
        f"\n{soql.strip()[:200]}\nERROR: sObject type '{name}' is not supported. If you are "
        "attempting to use a custom object, be sure to append the '__c' after the entity name."
    )


def invalid_field(soql: str, name: str, entity: str) -> str:
    """Salesforce's message for an unknown field."""
    return (
        f"\n{soql.strip()[:200]}\nERROR: No such column '{name}' on entity '{entity}'. If you "
        "are attempting to use a custom field, be sure to append the '__c' after the custom "
        "field name."
    )


def _lower_camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _date(ms: int) -> str:
    return (_EPOCH + timedelta(milliseconds=ms)).strftime("%Y-%m-%d")


def _datetime(ms: int) -> str:
    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}+0000"


def _time(ms: int) -> str:
    h, rest = divmod(int(ms), 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, milli = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{milli:03d}Z"


def _scalar(info: FieldInfo, value: Any) -> Any:
    if value is None:
        return None
    if info.kind == "date":
        return _date(value)
    if info.kind == "datetime":
        return _datetime(value)
    if info.kind == "time":
        return _time(value)
    return value


def _full_name(parts: Mapping[str, Any] | None) -> str | None:
    if not parts:
        return None
    words = [str(parts[p]) for p in _NAME_PARTS_ORDER if parts.get(p)]
    return " ".join(words) or None


class _Stamped(Mapping[str, Any]):
    """A record's values with its ``SystemModstamp`` (epoch ms) added, without a copy."""

    __slots__ = ("_stamp", "_values")

    def __init__(self, values: Mapping[str, Any], stamp: int | None) -> None:
        self._values = values
        self._stamp = stamp

    def __getitem__(self, key: str) -> Any:
        if key == MODSTAMP:
            return self._stamp
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        if key == MODSTAMP:
            return self._stamp
        return self._values.get(key, default)

    def __iter__(self) -> Iterator[str]:
        yield from self._values
        yield MODSTAMP

    def __len__(self) -> int:
        return len(self._values) + 1


def stamped(values: Mapping[str, Any], stamp: int | None) -> Mapping[str, Any]:
    """``values`` with ``SystemModstamp`` readable (what the field readers expect)."""
    return _Stamped(values, stamp)


@dataclass(frozen=True)
class _Column:
    """How one SOQL field is read from a truth record."""

    name: str
    read: Callable[[str, Mapping[str, Any], bool], Any]


def _modstamp(rid: str, rec: Mapping[str, Any], deleted: bool) -> Any:
    stamp = rec.get(MODSTAMP)
    return None if stamp is None else _datetime(stamp)


def _columns(
    entity: str, fields: Sequence[FieldInfo], formulas: Sequence[Formula] = ()
) -> dict[str, _Column]:
    cols: dict[str, _Column] = {
        "Id": _Column("Id", lambda rid, rec, deleted: rid),
        "IsDeleted": _Column("IsDeleted", lambda rid, rec, deleted: deleted),
        MODSTAMP: _Column(MODSTAMP, _modstamp),
    }

    def add(name: str, read: Callable[[str, Mapping[str, Any], bool], Any]) -> None:
        cols.setdefault(name, _Column(name, read))

    for info in fields:
        if info.name == HEADER_FIELD:
            continue
        name = info.name
        if info.kind == "switchable_name" or (
            info.kind == "compound" and info.sf_type == "PersonName"
        ):
            # A person name is text in the REST API; its parts are fields of their own.
            def full(rid: str, rec: Mapping[str, Any], deleted: bool, n: str = name) -> Any:
                value = rec.get(n)
                return _full_name(value) if isinstance(value, Mapping) else value

            add(name, full)
            for child in info.children:

                def part(
                    rid: str,
                    rec: Mapping[str, Any],
                    deleted: bool,
                    n: str = name,
                    c: FieldInfo = child,
                ) -> Any:
                    value = rec.get(n)
                    return _scalar(c, value.get(c.name)) if isinstance(value, Mapping) else None

                add(child.name, part)
            if info.kind == "switchable_name":

                def person(rid: str, rec: Mapping[str, Any], deleted: bool, n: str = name) -> Any:
                    return isinstance(rec.get(n), Mapping)

                add("IsPersonAccount", person)
        elif info.children:

            def nested(rid: str, rec: Mapping[str, Any], deleted: bool, f: FieldInfo = info) -> Any:
                value = rec.get(f.name)
                if not isinstance(value, Mapping):
                    return None
                return {_lower_camel(c.name): _scalar(c, value.get(c.name)) for c in f.children}

            add(name, nested)
        else:

            def leaf(rid: str, rec: Mapping[str, Any], deleted: bool, f: FieldInfo = info) -> Any:
                return _scalar(f, rec.get(f.name))

            add(name, leaf)
    for formula in formulas:
        # Computed when the record is read: a formula has no stored value.

        def compute(rid: str, rec: Mapping[str, Any], deleted: bool, f: Formula = formula) -> Any:
            return f.value(rec)

        add(formula.name, compute)
    return cols


def rest_readers(
    fields: Sequence[FieldInfo],
) -> dict[str, Callable[[str, Mapping[str, Any], bool], Any]]:
    """Field name -> reader of that field's REST API value from a ground-truth record
    (``read(record_id, values, deleted)``): ``Id``, ``IsDeleted``, every schema field, person
    name parts and ``IsPersonAccount``, as the query endpoint answers them."""
    return {name: col.read for name, col in _columns("", fields).items()}


class RestApi:
    """The query side of the emulator's REST API (see the module docstring).

    Serves nothing until :meth:`attach` gives it the ground truth to read; ``page_size``
    bounds every page (tests set it small to exercise paging).
    """

    def __init__(self, catalogue: Catalogue, *, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1 (got {page_size})")
        self._catalogue = catalogue
        self.page_size = page_size
        self._truth: GroundTruth | None = None
        self._lock = threading.Lock()
        self._cursors: OrderedDict[str, tuple[str, list[dict[str, Any]]]] = OrderedDict()
        self.queries = 0
        self.pages = 0

    def attach(self, truth: GroundTruth | None) -> None:
        """Answer queries from ``truth`` (``None``: stop answering)."""
        self._truth = truth

    def get(self, path: str, params: Mapping[str, str], headers: Mapping[str, str]) -> RestResponse:
        """Answer ``GET path?params`` (the caller has already checked the access token)."""
        match = _VERSION.fullmatch(path)
        if match is None or not _MIN_VERSION <= float(match.group(1)) <= _MAX_VERSION:
            return _error(404, "NOT_FOUND", "The requested resource does not exist")
        version = f"v{match.group(1)}"
        rest = (match.group(2) or "").rstrip("/")
        size = self._page_size(headers)
        for kind in ("query", "queryAll"):
            if rest == f"/{kind}":
                soql = params.get("q")
                if not soql:
                    return _malformed("", "expected a SOQL query in the q parameter")
                return self._query(soql, version, kind, size)
            if rest.startswith(f"/{kind}/"):
                return self._page(rest.removeprefix(f"/{kind}/"), version, kind, size)
        return _error(404, "NOT_FOUND", "The requested resource does not exist")

    def _page_size(self, headers: Mapping[str, str]) -> int:
        options = next((v for k, v in headers.items() if k.lower() == "sforce-query-options"), "")
        asked = _BATCH_SIZE.search(options)
        if asked is None:
            return self.page_size
        # Salesforce treats the batch size as a hint between 200 and 2,000.
        return min(self.page_size, max(200, min(int(asked.group(1)), DEFAULT_PAGE_SIZE)))

    def _query(self, soql: str, version: str, kind: str, size: int) -> RestResponse:
        try:
            select = parse_select(soql)
        except SoqlProblem as exc:
            return _error(400, exc.code, exc.message)
        truth = self._truth
        if truth is None:
            return _error(
                400,
                "API_DISABLED_FOR_ORG",
                "The REST API is not enabled for this organization: the emulator has no ground "
                "truth attached (it answers queries only for a workload generated in this "
                "process, or one restored from its state directory)",
            )
        entity = self._entity(select.entity, truth)
        if entity is None:
            return _error(400, "INVALID_TYPE", invalid_type(soql, select.entity))
        schema = self._catalogue.topic_for_entity(entity).current_schema
        columns = _columns(
            entity,
            schema.fields if schema is not None else (),
            self._catalogue.formulas_of(entity),
        )
        by_lower = {name.lower(): col for name, col in columns.items()}
        chosen = []
        for name in select.fields:
            col = by_lower.get(name.lower())
            if col is None:
                return _error(400, "INVALID_FIELD", invalid_field(soql, name, entity))
            chosen.append(col)
        for attempt in range(5):
            try:
                records = self._records(
                    truth,
                    entity,
                    version,
                    chosen,
                    select.ids,
                    all_rows=kind == "queryAll",
                    select=select,
                )
                break
            except RuntimeError:
                # The workload may be generating into the truth right now (a dict changed
                # size while it was read): read again, as a real org would serve a consistent
                # view.
                if attempt == 4:
                    raise
        self.queries += 1
        if select.count:
            self.pages += 1
            return RestResponse(200, {"totalSize": len(records), "done": True, "records": []})
        cursor = "01g" + secrets.token_hex(8).upper()[:15]
        with self._lock:
            self._cursors[cursor] = (kind, records)
            while len(self._cursors) > _MAX_CURSORS:
                self._cursors.popitem(last=False)
        return self._slice(cursor, records=records, offset=0, version=version, kind=kind, size=size)

    @property
    def truth(self) -> GroundTruth | None:
        """The ground truth queries are answered from (``None``: none attached)."""
        return self._truth

    def _entity(self, name: str, truth: GroundTruth) -> str | None:
        known = {e.lower(): e for e in truth.entities}
        return known.get(name.lower())

    @staticmethod
    def _records(
        truth: GroundTruth,
        entity: str,
        version: str,
        columns: Sequence[_Column],
        ids: Sequence[str] | None,
        *,
        all_rows: bool,
        select: Select | None = None,
    ) -> list[dict[str, Any]]:
        records = truth.records(entity)
        deleted = truth.deleted(entity)
        since = select is not None and select.since is not None
        wants = since or any(c.name == MODSTAMP for c in columns)
        stamps = truth.modstamps(entity) if wants else None
        if ids is None:
            wanted: list[str] = list(records)
        else:
            by_15 = {r[:15]: r for r in records} if any(len(i) == 15 for i in ids) else {}
            wanted = list(dict.fromkeys(by_15.get(i, i) for i in ids))
        out = []
        for record_id in wanted:
            values = records.get(record_id)
            if values is None:
                continue
            is_deleted = record_id in deleted
            if is_deleted and not all_rows:
                continue
            if stamps is not None:
                stamp = stamps.get(record_id)
                if since and select is not None and not select.wanted(stamp):
                    continue
                values = _Stamped(values, stamp)
            row: dict[str, Any] = {
                "attributes": {
                    "type": entity,
                    "url": f"/services/data/{version}/sobjects/{entity}/{record_id}",
                }
            }
            for col in columns:
                row[col.name] = col.read(record_id, values, is_deleted)
            out.append(row)
        return out

    def _page(self, locator: str, version: str, kind: str, size: int) -> RestResponse:
        cursor, _, offset = locator.rpartition("-")
        with self._lock:
            found = self._cursors.get(cursor)
        if found is None or found[0] != kind or not offset.isdigit():
            return _error(
                400,
                "INVALID_QUERY_LOCATOR",
                f"invalid query locator {locator!r}: expected the nextRecordsUrl of a query "
                "that is still open",
            )
        return self._slice(
            cursor, records=found[1], offset=int(offset), version=version, kind=kind, size=size
        )

    def _slice(
        self,
        cursor: str,
        *,
        records: list[dict[str, Any]],
        offset: int,
        version: str,
        kind: str,
        size: int,
    ) -> RestResponse:
        page = records[offset : offset + size]
        end = offset + len(page)
        body: dict[str, Any] = {"totalSize": len(records), "done": end >= len(records)}
        if not body["done"]:
            body["nextRecordsUrl"] = f"/services/data/{version}/{kind}/{cursor}-{end}"
        else:
            with self._lock:
                self._cursors.pop(cursor, None)
        body["records"] = page
        self.pages += 1
        return RestResponse(200, body)
