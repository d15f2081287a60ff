"""Reading records for a snapshot: over the REST API, or over the Bulk API 2.0 for large reads.

A bootstrap, and a re-sync after an overflow or a replay gap, reads a whole object; other
re-syncs read the records gold flagged, 200 ids per ``WHERE Id IN (...)`` query. Named records
are always read over REST (a Bulk job per 200 ids would only add latency). A whole object is
read as ``api`` says:

- ``rest``: ``queryAll``, 2,000 records per request;
- ``bulk``: one Bulk API 2.0 query job (``queryAll``), its CSV results read in sets of up to
  50,000 records, one request each (at least four sets for a job of up to 200,000:
  :func:`ingest.bulk.set_size`) (:class:`BulkRecords`);
- ``auto`` (the default): ``SELECT COUNT() FROM <Object>`` first (one REST request, deleted
  records included), then Bulk from :data:`BULK_THRESHOLD` records on, REST below. Under that
  size REST needs at most 25 requests and no job has to be queued, polled and cleaned up.

:class:`BulkRecords` shapes each CSV row like the REST API's JSON record, so both paths end in
:func:`pipelines.snapshot_rows.rest_row` and give the same gold rows. A reader that stores the
records' JSON as it is (a poll) reads :meth:`WholeRead.payloads` instead: Arrow tables of
:data:`PAYLOAD_SCHEMA`, written straight from each CSV result set's columns for a Bulk read
(no record passes through Python one at a time), and from the records for a REST read; a
payload is the same text either way as ``json.dumps(record, separators=(",", ":"),
ensure_ascii=False)`` of the record :meth:`BulkRecords.query_all` yields. The object's describe
says how: a Bulk job cannot return an Address or Location compound field, so its parts are
selected instead (the describe's ``compoundFieldName`` lists them) and nested again under the
compound's name with the REST API's lower-camel keys (``BillingCity`` -> ``BillingAddress.city``);
each value is read by its describe ``type`` (booleans and numbers from their text, everything
else as text; an empty CSV value is null, as Salesforce stores no empty text).
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from ingest.bulk import BulkQueryClient, ResultSet, typed_value
from ingest.errors import RestError

__all__ = [
    "BULK_THRESHOLD",
    "PAYLOAD_SCHEMA",
    "Api",
    "BulkRecords",
    "RecordReader",
    "SnapshotSource",
    "WholeRead",
    "record_payloads",
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
_MODSTAMP = "SystemModstamp"
# Records as a poll stores them: id, SystemModstamp as the API wrote it, IsDeleted (false when
# not selected), and the record's REST-shaped JSON.
PAYLOAD_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("modstamp", pa.string()),
        pa.field("is_deleted", pa.bool_(), nullable=False),
        pa.field("payload", pa.string(), nullable=False),
    ]
)
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# The bytes of UTF-8 text json.dumps writes as they are (all but a quote, a backslash and the
# control characters).
_WRITTEN_AS_IS = bytes(b for b in range(0x100) if b >= 0x20 and b not in b'"\\')
_escaped: Callable[[str], str] = json.encoder.encode_basestring
_T = TypeVar("_T")
_U = TypeVar("_U")
_END: Any = object()
# Records from which the last set of a Bulk read is converted in two halves at once.
_HALVED_FROM = 10_000
# Number texts that json.dumps writes back unchanged once typed_value has read them (a whole
# number; a decimal of at most 15 digits, which is the shortest text of its float, written
# positionally as repr writes floats from 1e-4 to 1e16), and how long such a text may be.
_AS_JSON = {
    "int": (r"^(0|-?[1-9][0-9]*)$", None),
    "double": (r"^-?([1-9][0-9]*\.([0-9]*[1-9]|0)|0\.(0{0,3}[1-9]([0-9]*[1-9])?|0))$", 16),
}
_AS_JSON.update(long=_AS_JSON["int"], currency=_AS_JSON["double"], percent=_AS_JSON["double"])


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


@dataclass(frozen=True)
class _KeyOrder:
    """The columns of a Bulk query in the order a record's keys are set: text fields, typed
    fields (read through :func:`~pipelines.snapshot_rows.typed_value`), then each compound with
    its parts."""

    plain: list[_Column]
    typed: list[_Column]
    compounds: dict[str, list[_Column]]

    @classmethod
    def of(cls, columns: list[_Column]) -> _KeyOrder:
        compounds: dict[str, list[_Column]] = {}
        for c in columns:
            if c.compound is not None:
                compounds.setdefault(c.compound, []).append(c)
        return cls(
            plain=[c for c in columns if c.compound is None and c.sf_type not in _TYPED],
            typed=[c for c in columns if c.compound is None and c.sf_type in _TYPED],
            compounds=compounds,
        )


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
        order = _KeyOrder.of(columns)
        for row in self.bulk.query_all(bulk_soql):
            record: dict[str, Any] = {"attributes": {"type": entity}}
            # Text types need no conversion; only the others go through typed_value.
            for column in order.plain:
                record[column.name] = row.get(column.name)
            try:
                for column in order.typed:
                    record[column.name] = typed_value(
                        row.get(column.name), column.sf_type, where=column.name
                    )
                nested = {
                    compound: {
                        c.key: typed_value(row.get(c.name), c.sf_type, where=c.name) for c in parts
                    }
                    for compound, parts in order.compounds.items()
                }
            except ValueError as exc:
                raise RestError(
                    f"Bulk value of {entity} record {row.get('Id') or '?'}: {exc}"
                ) from None
            for compound, children in nested.items():
                # The REST API writes a compound whose parts are all empty as null.
                has_value = any(v is not None for v in children.values())
                record[compound] = children if has_value else None
            yield record

    def payloads(self, soql: str) -> Iterator[pa.Table]:
        """Every record ``soql`` selects, deleted ones included, as :data:`PAYLOAD_SCHEMA`
        tables, one per set of results: each payload is the JSON of the record
        :meth:`query_all` yields, written column by column."""
        bulk_soql, columns = self.plan(soql)
        entity = _SELECT.match(soql).group("object")  # type: ignore[union-attr]

        def convert(result: ResultSet) -> tuple[ResultSet, pa.Table, pa.Table]:
            table = _csv_table(result)
            rows = table.num_rows
            if not result.last or rows < _HALVED_FROM:
                return result, table, _payload_table(table, entity, columns)
            # Nothing is left to download or convert after the last set: its two halves are
            # converted at once (the records are the same, in the same order).
            half = rows // 2
            second = halves.submit(_payload_table, table.slice(half), entity, columns)
            first = _payload_table(table.slice(0, half), entity, columns)
            return result, table, pa.concat_tables([first, second.result()])

        # The next set downloads while the sets before it are converted, two at a time (Arrow
        # lets go of the GIL while it parses and joins): they come out in order.
        sets = self.bulk.record_sets(bulk_soql, operation="queryAll")
        with ThreadPoolExecutor(1, thread_name_prefix="sfcdc-convert-half") as halves:
            yield from self._checked(_mapped_ahead(sets, convert, workers=2))

    @staticmethod
    def _checked(converted: Iterator[tuple[ResultSet, pa.Table, pa.Table]]) -> Iterator[pa.Table]:
        """The payloads of each converted set, once its columns and size are as expected."""
        header: list[str] | None = None
        for result, table, payloads in converted:
            if header is None:
                header = table.column_names
            elif table.column_names != header:
                raise result.malformed(
                    f"has the columns {table.column_names}, the first set had {header}"
                )
            if result.records is not None and result.records != table.num_rows:
                raise result.cut_short(table.num_rows)
            yield payloads


def _read_ahead(items: Iterator[_T]) -> Generator[_T, None, None]:
    """``items`` in order, each next one read by a worker thread while the caller works on the
    one it was given. A failure to read an item is raised where that item would have been; a
    caller that stops early closes ``items`` once the worker is done with it."""
    with ThreadPoolExecutor(1, thread_name_prefix="sfcdc-read-ahead") as worker:
        pending = worker.submit(next, items, _END)
        try:
            while (item := pending.result()) is not _END:
                pending = worker.submit(next, items, _END)
                yield item
        finally:
            wait([pending])
            close = getattr(items, "close", None)
            if close is not None:
                close()


def _mapped_ahead(
    items: Iterator[_T], convert: Callable[[_T], _U], *, workers: int
) -> Iterator[_U]:
    """``convert`` of each of ``items``, in order: the items are read ahead by one thread
    (:func:`_read_ahead`) and converted by ``workers`` others, up to ``workers`` at a time. A
    failure is raised where its item's result would have been; a caller that stops early
    cancels the conversions not started and closes ``items``."""
    source = _read_ahead(items)
    pending: deque[Future[_U]] = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="sfcdc-convert") as pool:
        try:
            for item in source:
                pending.append(pool.submit(convert, item))
                if len(pending) >= workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
            source.close()


def _csv_table(result: ResultSet) -> pa.Table:
    """A set of results as a table of its columns: every value text, an empty one null (as
    :meth:`~ingest.bulk.BulkQueryClient.results` reads them)."""
    content = result.content
    # The header alone (splitting the content would copy all of it).
    end = content.find(b"\n")
    first_line = (content if end < 0 else content[:end]).rstrip(b"\r")
    if not first_line:
        raise result.malformed("has no header row")
    names = next(csv.reader([first_line.decode("utf-8", errors="replace")]))
    try:
        return pa_csv.read_csv(
            pa.py_buffer(content),
            # One thread: sets are converted two at a time already (BulkRecords.payloads),
            # and Arrow's own threads only add their overhead to that.
            read_options=pa_csv.ReadOptions(use_threads=False),
            parse_options=pa_csv.ParseOptions(delimiter=",", newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.string()),
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise result.malformed(f"cannot be read as CSV ({str(exc)[:300]})") from None


def _payload_table(table: pa.Table, entity: str, columns: list[_Column]) -> pa.Table:
    rows = table.num_rows

    def raw(name: str) -> pa.Array:
        if name not in table.column_names:
            return pa.nulls(rows, pa.string())
        return table.column(name).combine_chunks()

    ids = raw("Id")

    def as_json(column: _Column) -> list[str | pa.Array]:
        """The pieces of a column's JSON values: a null value left null (the join writes it
        as ``null``); text escaped between its quotes, given as text, or for a column with
        nulls as a column of quotes (empty on a null): the text is not copied to quote it."""
        values = raw(column.name)
        if values.null_count == rows:
            return ["null"]
        if column.sf_type in _TYPED:
            return [_json_typed(values, column.sf_type, column.name, entity=entity, ids=ids)]
        if values.null_count == 0:
            return ['"', _escaped_text(values), '"']
        quote = pc.if_else(pc.is_valid(values), '"', "")
        return [quote, _escaped_text(values), quote]

    # The record's keys in the order query_all sets them: attributes, then _KeyOrder's.
    order = _KeyOrder.of(columns)
    pieces: list[str | pa.Array] = ['{"attributes":' + _JSON.encode({"type": entity})]
    for column in order.plain + order.typed:
        pieces += [f",{_JSON.encode(column.name)}:", *as_json(column)]
    for compound, parts in order.compounds.items():
        nested: list[str | pa.Array] = []
        for position, part in enumerate(parts):
            nested += [("{" if position == 0 else ",") + f"{_JSON.encode(part.key)}:"]
            nested += as_json(part)
        every_part_null = pc.is_null(raw(parts[0].name))
        for part in parts[1:]:
            every_part_null = pc.and_(every_part_null, pc.is_null(raw(part.name)))
        # The REST API writes a compound whose parts are all empty as null.
        pieces += [
            f",{_JSON.encode(compound)}:",
            pc.if_else(every_part_null, "null", _joined([*nested, "}"], rows)),
        ]
    pieces.append("}")
    deleted = raw("IsDeleted")
    return pa.Table.from_arrays(
        [
            ids,
            raw(_MODSTAMP),
            pc.fill_null(pc.equal(pc.utf8_lower(deleted), "true"), False),
            _joined(pieces, rows),
        ],
        schema=PAYLOAD_SCHEMA,
    )


def _joined(pieces: list[str | pa.Array], rows: int) -> pa.Array:
    """Row by row, the concatenation of ``pieces`` (text repeated on every row, or arrays; a
    null value is written ``null``)."""
    merged: list[str | pa.Array] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    if not any(isinstance(p, pa.Array) for p in merged):
        merged.insert(0, pa.array([""] * rows, pa.string()))
    joined = pc.binary_join_element_wise(
        *merged, "", null_handling="replace", null_replacement="null"
    )
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _escaped_text(values: pa.Array) -> pa.Array:
    """Text values escaped as ``json.dumps`` escapes them (``ensure_ascii`` off), without
    their quotes; nulls stay null."""
    if values.null_count == len(values):
        return values
    # What needs escaping, read off the column's UTF-8 bytes at once (a multi-byte character
    # has no byte below 0x80, so each such byte is the character it stands for).
    data = values.buffers()[2]
    present = (
        set(memoryview(data).tobytes().translate(None, _WRITTEN_AS_IS).decode())
        if data is not None
        else set()
    )
    # The backslash first: the other escapes add backslashes.
    for char in sorted(present, key=lambda c: c != "\\"):
        values = pc.replace_substring(values, char, _escaped(char)[1:-1])
    return values


def _json_text(values: pa.Array) -> pa.Array:
    """Text values as JSON strings, escaped as ``json.dumps`` escapes them (``ensure_ascii``
    off); nulls stay null."""
    if values.null_count == len(values):
        return values
    return pc.binary_join_element_wise('"', _escaped_text(values), '"', "")


def _json_typed(
    values: pa.Array, sf_type: str, name: str, *, entity: str, ids: pa.Array
) -> pa.Array:
    """Booleans and numbers as JSON, read by :func:`typed_value` (each distinct text once)."""
    if values.null_count == len(values):
        return values.cast(pa.string())
    if sf_type == "boolean":
        lower = pc.utf8_lower(values)
        if pc.all(pc.is_in(lower.drop_null(), pa.array(["true", "false"]))).as_py() is not False:
            return lower
    elif sf_type in _AS_JSON:
        pattern, longest = _AS_JSON[sf_type]
        present = values.drop_null()
        as_is = pc.match_substring_regex(present, pattern)
        if longest is not None:
            as_is = pc.and_(as_is, pc.less_equal(pc.utf8_length(present), longest))
        if pc.all(as_is).as_py() is not False:
            return values
    written: dict[str, str] = {}
    out: list[str | None] = []
    for position, text in enumerate(values.to_pylist()):
        if text is None:
            out.append(None)
            continue
        json_text = written.get(text)
        if json_text is None:
            try:
                json_text = written[text] = _JSON.encode(typed_value(text, sf_type, where=name))
            except ValueError as exc:
                raise RestError(
                    f"Bulk value of {entity} record {ids[position].as_py() or '?'}: {exc}"
                ) from None
        out.append(json_text)
    return pa.array(out, pa.string())


def record_payloads(records: Iterable[Mapping[str, Any]], rows: int = 10_000) -> Iterator[pa.Table]:
    """``records`` (REST-shaped) as :data:`PAYLOAD_SCHEMA` tables of up to ``rows`` rows."""
    ids: list[str | None] = []
    stamps: list[str | None] = []
    deleted: list[bool] = []
    payloads: list[str] = []

    def table() -> pa.Table:
        return pa.Table.from_pydict(
            {"id": ids, "modstamp": stamps, "is_deleted": deleted, "payload": payloads},
            schema=PAYLOAD_SCHEMA,
        )

    for record in records:
        record_id, stamp = record.get("Id"), record.get(_MODSTAMP)
        ids.append(record_id if isinstance(record_id, str) else None)
        stamps.append(None if stamp is None else str(stamp))
        deleted.append(bool(record.get("IsDeleted")))
        payloads.append(_JSON.encode(record))
        if len(ids) >= rows:
            yield table()
            ids, stamps, deleted, payloads = [], [], [], []
    if ids:
        yield table()


@dataclass
class WholeRead:
    """A whole object's records (``records``), the API reading them, and how many there are
    when that is known (``total``)."""

    records: Iterator[dict[str, Any]]
    api: Literal["rest", "bulk"]
    total: int | None
    # A Bulk read's own way to PAYLOAD_SCHEMA tables (None: from the records).
    bulk_payloads: Callable[[], Iterator[pa.Table]] | None = None

    def payloads(self) -> Iterator[pa.Table]:
        """The records as :data:`PAYLOAD_SCHEMA` tables (read these or ``records``, not
        both)."""
        if self.bulk_payloads is not None:
            return self.bulk_payloads()
        return record_payloads(self.records)


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
            bulk = self.bulk
            payloads = (lambda: bulk.payloads(soql)) if isinstance(bulk, BulkRecords) else None
            return WholeRead(bulk.query_all(soql), "bulk", total, payloads)
        if self.api == "auto":
            self._log.info(
                "%s: %s records (< %d): reading them over REST", entity, total, self.bulk_threshold
            )
        return WholeRead(self.rest.query_all(soql), "rest", total)
