"""The emulator's Bulk API 2.0 query jobs, answered from the REST query endpoint's ground truth.

=========================================================  ====================================
``POST   /services/data/vXX.X/jobs/query``                  create a job (``{"operation":
                                                            "query" | "queryAll", "query":
                                                            <SOQL>}``); state UploadComplete
``GET    .../jobs/query/<id>``                              the job: InProgress while it runs,
                                                            then JobComplete or Failed
``GET    .../jobs/query/<id>/results[?locator=&maxRecords=]``  one set of results as CSV, with
                                                            ``Sforce-Locator`` (the next set, or
                                                            ``null``) and
                                                            ``Sforce-NumberOfRecords``
``PATCH  .../jobs/query/<id>`` ``{"state": "Aborted"}``     abort a job that is not finished
``DELETE .../jobs/query/<id>``                              delete a finished job and its results
``GET    .../jobs/query``                                   every job
=========================================================  ====================================

The SOQL grammar is the REST endpoint's (:func:`~ingest.emulator.rest.parse_select`), minus
``COUNT()``, which Bulk API 2.0 does not run. Fields are the object's REST fields, compound
parts included (``BillingCity``, ``HQ_Location__Latitude__s``, ``FirstName``); a compound
Address or Location field itself is accepted when the job is created and makes it fail, as
Bulk API 2.0 cannot write one to CSV.

Results are CSV: a header row of the field names as the query wrote them, then one row per
record, every value quoted and a null an empty field; dates ``YYYY-MM-DD``, datetimes
``YYYY-MM-DDThh:mm:ss.000Z``, times ``hh:mm:ss.000Z``, booleans ``true`` / ``false``.

A job runs as Salesforce runs one: from its creation on, in the background (a thread of its
own), while the client polls its state. It reads the records' values when it starts (a
consistent view: a record saved later does not change its results) and keeps them; its
``totalProcessingTime`` is the time that took. Each set of results is written as CSV when it
is asked for, from those values, so the client reads one set while the next is written. A
status read answers ``InProgress`` while the job runs, and at least ``polls_in_progress``
times (:class:`BulkSettings`) before it shows the outcome.

Errors a client can meet, each as Salesforce's list of ``{"errorCode", "message"}``:
invalid SOQL (400 ``MALFORMED_QUERY``, ``INVALID_FIELD``, ``INVALID_TYPE``), a job that fails
(state ``Failed`` with ``errorMessage``: a compound field, or one injected with
:meth:`BulkQueryApi.fail_next`), an aborted job, results of a job that is not complete (400),
a locator this job never issued (400 ``INVALID_QUERY_LOCATOR``), and a job whose results are
no longer kept (404 ``NOT_FOUND``: after ``results_ttl`` seconds, seven days as on
Salesforce, or at once with :meth:`BulkQueryApi.expire`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from ingest.emulator.managed import salesforce_id_18
from ingest.emulator.oauth import GrantInfo, TokenStore
from ingest.emulator.rest import (
    MODSTAMP,
    RestApi,
    SoqlProblem,
    invalid_field,
    invalid_type,
    parse_select,
    stamped,
)
from ingest.emulator.routes import HttpAnswer, HttpRequest, json_answer

if TYPE_CHECKING:
    from ingest.emulator.cometd.fields import ObjectField, ObjectFields
    from ingest.emulator.truth import GroundTruth

__all__ = ["DEFAULT_MAX_RECORDS", "BulkQueryApi", "BulkSettings"]

DEFAULT_MAX_RECORDS = 50_000
_PATH = re.compile(
    r"^/services/data/v(\d{2}\.\d)/jobs/query(?:/(?P<id>[^/]+)(?P<results>/results)?)?/?$"
)
# Bulk API 2.0 query jobs exist from API version 47.0.
_MIN_VERSION, _MAX_VERSION = 47.0, 66.0
_DELIMITERS = {
    "COMMA": ",",
    "TAB": "\t",
    "PIPE": "|",
    "SEMICOLON": ";",
    "CARET": "^",
    "BACKQUOTE": "`",
}
_LINE_ENDINGS = {"LF": "\n", "CRLF": "\r\n"}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_RUNNING = ("UploadComplete", "InProgress")


@dataclass
class BulkSettings:
    """Knobs of the emulated Bulk API: at least ``polls_in_progress`` status reads answer
    InProgress before a job shows its outcome (a job runs in the background from its creation
    and may finish sooner); ``max_records`` bounds a set of results (a smaller ``maxRecords``
    asked by the client wins); ``results_ttl`` (seconds) is how long a job and its results
    are kept."""

    polls_in_progress: int = 1
    max_records: int = DEFAULT_MAX_RECORDS
    results_ttl: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        if self.polls_in_progress < 0:
            raise ValueError(f"polls_in_progress must be >= 0 (got {self.polls_in_progress})")
        if self.max_records < 1:
            raise ValueError(f"max_records must be >= 1 (got {self.max_records})")
        if self.results_ttl <= 0:
            raise ValueError(f"results_ttl must be > 0 seconds (got {self.results_ttl})")


@dataclass
class _Job:
    id: str
    operation: str
    entity: str
    version: str
    created_at: float
    created_by: str
    delimiter: str
    line_ending: str
    names: tuple[str, ...]
    columns: tuple[ObjectField, ...]
    ids: tuple[str, ...] | None
    since: tuple[str, int] | None = None
    state: str = "UploadComplete"
    polls: int = 0
    error: str | None = None
    expired: bool = False
    # The values of the records the job read, a sequence per column, and how many records.
    values: list[Sequence[Any]] = field(default_factory=list, repr=False)
    # The text of each boolean, date and datetime value written so far (per field kind).
    written: dict[str, dict[Any, str]] = field(default_factory=dict, repr=False)
    processed: int = 0
    processing_ms: int = 0
    # What the job's work ended in (JobComplete or Failed; None while it runs), shown by the
    # status read that sees it, and the thread doing that work.
    outcome: str | None = None

    def info(self) -> dict[str, Any]:
        created = _stamp(self.created_at)
        body: dict[str, Any] = {
            "id": self.id,
            "operation": self.operation,
            "object": self.entity,
            "createdById": self.created_by,
            "createdDate": created,
            "systemModstamp": created,
            "state": self.state,
            "concurrencyMode": "Parallel",
            "contentType": "CSV",
            "apiVersion": float(self.version),
            "jobType": "V2Query",
            "lineEnding": next(k for k, v in _LINE_ENDINGS.items() if v == self.line_ending),
            "columnDelimiter": next(k for k, v in _DELIMITERS.items() if v == self.delimiter),
            "numberRecordsProcessed": self.processed,
            "retries": 0,
            "totalProcessingTime": self.processing_ms,
        }
        if self.error is not None:
            body["errorMessage"] = self.error
        return body


def _stamp(epoch: float) -> str:
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}+0000"


def _error(status: int, code: str, message: str) -> HttpAnswer:
    return json_answer(status, [{"errorCode": code, "message": message}])


def _text_cell(value: Any) -> str:
    """A value as Bulk API 2.0 writes it in a CSV cell: quoted, embedded quotes doubled; a null
    is an empty field."""
    if value is None:
        return ""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    return '"' + text.replace('"', '""') + '"'


def _boolean_text(value: Any) -> str:
    return "true" if value else "false"


def _date_text(value: Any) -> str:
    return _day(value // 86_400_000)


def _datetime_text(value: Any) -> str:
    day, milli = divmod(value, 86_400_000)
    second, milli = divmod(milli, 1000)
    minute, second = divmod(second, 60)
    hour, minute = divmod(minute, 60)
    return f"{_day(day)}T{hour:02d}:{minute:02d}:{second:02d}.{milli:03d}Z"


@lru_cache(maxsize=1 << 12)
def _day(day: int) -> str:
    # Most of a datetime's cost, and records share days.
    return (_EPOCH + timedelta(days=day)).date().isoformat()


def _time_text(value: Any) -> str:
    h, rest = divmod(int(value), 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, milli = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{milli:03d}Z"


# How a non-null value of each field kind is written, unquoted (any other kind: _text_cell).
_TEXTS: dict[str, Callable[[Any], str]] = {
    "boolean": _boolean_text,
    "date": _date_text,
    "datetime": _datetime_text,
    "time": _time_text,
}


def _column_values(
    column: ObjectField,
    chosen: list[tuple[str, Mapping[str, Any], bool, int | None]],
    stored: Mapping[str, Sequence[Any]],
) -> Sequence[Any]:
    """One column's values for the records ``chosen`` (id, values, deleted, SystemModstamp);
    ``stored`` holds the values of the columns read as stored (name -> a value per record)."""
    # The system fields are what ``chosen`` holds (their readers read it the same way).
    if column.name == "Id":
        return [rid for rid, _, _, _ in chosen]
    if column.name == "IsDeleted":
        return [gone for _, _, gone, _ in chosen]
    if column.name == MODSTAMP:
        return [stamp for _, _, _, stamp in chosen]
    if column.stored is not None:
        return stored.get(column.stored) or [None] * len(chosen)
    read = column.wire
    return [read(rid, stamped(v, stamp), gone) for rid, v, gone, stamp in chosen]


def _column_cells(
    kind: str, values: Sequence[Any], written: dict[str, dict[Any, str]]
) -> list[str]:
    """A column's values (of field kind ``kind``) as CSV cells; ``written`` keeps, per field
    kind, the cell of each value already written."""
    text = _TEXTS.get(kind)
    if kind == "double":
        # Floats written as repr writes them, as _text_cell does, without a call per value.
        return [
            f'"{v!r}"' if type(v) is float else "" if v is None else _text_cell(v) for v in values
        ]
    if text is None:
        # Text, the common case, and nulls are written here without a call per value (as
        # _text_cell writes them); anything else goes through _text_cell.
        return [
            ('"' + v + '"' if '"' not in v else '"' + v.replace('"', '""') + '"')
            if type(v) is str
            else ""
            if v is None
            else _text_cell(v)
            for v in values
        ]
    # Booleans, dates and datetimes repeat across records and columns (a transaction stamps
    # all it touches alike, CreatedDate is LastModifiedDate until an update): each distinct
    # value is written once per job.
    seen = written.setdefault(kind, {None: ""})
    return [seen[v] if v in seen else seen.setdefault(v, f'"{text(v)}"') for v in values]


def _no_stamp(record_id: str) -> None:
    return None


def _since(since: tuple[str, int], stamp: int | None) -> bool:
    op, bound = since
    return stamp is not None and (stamp >= bound if op == ">=" else stamp > bound)


class BulkQueryApi:
    """Bulk API 2.0 query jobs (see the module docstring), over the records ``rest`` answers
    from (:meth:`RestApi.attach`). ``object_fields(entity)`` lists an object's fields as the
    REST API names them; ``clock`` (epoch seconds) stamps jobs and ages their results."""

    def __init__(
        self,
        rest: RestApi,
        *,
        tokens: TokenStore,
        object_fields: Callable[[str], ObjectFields | None],
        clock: Callable[[], float],
        settings: BulkSettings | None = None,
    ) -> None:
        self._rest = rest
        self._tokens = tokens
        self._fields = object_fields
        self._clock = clock
        self.settings = settings or BulkSettings()
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._failures: list[str] = []
        self.result_sets = 0

    # -- knobs for tests and demos ---------------------------------------------------------

    def fail_next(self, message: str) -> None:
        """The next job to run ends ``Failed`` with ``message`` as its ``errorMessage`` (as a
        query that times out on Salesforce does)."""
        with self._lock:
            self._failures.append(message)

    def expire(self, job_id: str | None = None) -> int:
        """Drop the results of one job (every job when ``job_id`` is ``None``), as Salesforce
        does once they are older than its retention; returns how many jobs expired."""
        with self._lock:
            jobs = [self._jobs[job_id]] if job_id in self._jobs else []
            if job_id is None:
                jobs = list(self._jobs.values())
            for job in jobs:
                job.expired = True
                job.values = []
        return len(jobs)

    def jobs(self) -> list[dict[str, Any]]:
        """Every job the API knows, as ``GET jobs/query/<id>`` shows it."""
        with self._lock:
            return [j.info() for j in self._jobs.values() if not self._gone(j)]

    # -- the route -------------------------------------------------------------------------

    def answer(self, request: HttpRequest) -> HttpAnswer | None:
        match = _PATH.match(request.path)
        if match is None:
            return None
        version = match.group(1)
        if not _MIN_VERSION <= float(version) <= _MAX_VERSION:
            return _error(404, "NOT_FOUND", "The requested resource does not exist")
        grant = self._grant(request)
        if grant is None:
            return _error(401, "INVALID_SESSION_ID", "Session expired or invalid")
        job_id = match.group("id")
        method = request.method
        if job_id is None:
            if method == "POST":
                return self._create(request, version, grant)
            if method == "GET":
                records = self.jobs()
                return json_answer(200, {"done": True, "records": records, "nextRecordsUrl": None})
            return _error(405, "METHOD_NOT_ALLOWED", f"HTTP method '{method}' not allowed here")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or self._gone(job):
                return _error(
                    404,
                    "NOT_FOUND",
                    f"The requested resource does not exist: no query job {job_id} (jobs and "
                    "their results are kept for 7 days after they were created)",
                )
            if match.group("results"):
                if method != "GET":
                    return _error(405, "METHOD_NOT_ALLOWED", f"HTTP method '{method}' not allowed")
                return self._results(job, request.query)
            if method == "GET":
                self._advance(job)
                return json_answer(200, job.info())
            if method == "PATCH":
                return self._patch(job, request.body)
            if method == "DELETE":
                if job.state == "InProgress":
                    return _error(
                        400, "INVALIDJOBSTATE", f"Job {job.id} is InProgress: abort it first"
                    )
                del self._jobs[job.id]
                return HttpAnswer(204)
        return _error(405, "METHOD_NOT_ALLOWED", f"HTTP method '{method}' not allowed here")

    def _grant(self, request: HttpRequest) -> GrantInfo | None:
        scheme, _, token = request.header("authorization").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self._tokens.check(token.strip())

    def _gone(self, job: _Job) -> bool:
        return job.expired or self._clock() - job.created_at > self.settings.results_ttl

    # -- create ----------------------------------------------------------------------------

    def _create(self, request: HttpRequest, version: str, grant: GrantInfo) -> HttpAnswer:
        try:
            body = json.loads(request.body or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, "JSON_PARSER_ERROR", f"The request body is not JSON: {exc}")
        if not isinstance(body, Mapping):
            return _error(400, "JSON_PARSER_ERROR", "Expected a JSON object describing the job")
        operation = body.get("operation")
        if operation not in ("query", "queryAll"):
            return _error(
                400,
                "INVALIDJOB",
                f"InvalidJob : Invalid job operation {operation!r}: a query job takes 'query' "
                "or 'queryAll'",
            )
        soql = body.get("query")
        if not isinstance(soql, str) or not soql.strip():
            return _error(400, "INVALIDJOB", "InvalidJob : A query job needs a 'query' (SOQL)")
        content = body.get("contentType", "CSV")
        delimiter = _DELIMITERS.get(str(body.get("columnDelimiter", "COMMA")))
        ending = _LINE_ENDINGS.get(str(body.get("lineEnding", "LF")))
        if content != "CSV" or delimiter is None or ending is None:
            return _error(
                400,
                "INVALIDJOB",
                f"InvalidJob : contentType must be CSV, columnDelimiter one of "
                f"{', '.join(_DELIMITERS)}, lineEnding LF or CRLF (got {content!r}, "
                f"{body.get('columnDelimiter')!r}, {body.get('lineEnding')!r})",
            )
        try:
            select = parse_select(soql)
        except SoqlProblem as exc:
            return _error(400, exc.code, exc.message)
        if select.count:
            return _error(
                400,
                "MALFORMED_QUERY",
                f"\n{soql.strip()[:200]}\nERROR: Bulk API 2.0 query jobs do not run aggregate "
                "functions such as COUNT(); use the REST query endpoint",
            )
        truth = self._rest.truth
        if truth is None:
            return _error(
                400,
                "API_DISABLED_FOR_ORG",
                "The Bulk API is not enabled for this organization: the emulator has no ground "
                "truth attached",
            )
        entity = next((e for e in truth.entities if e.lower() == select.entity.lower()), None)
        fields = self._fields(entity) if entity is not None else None
        if entity is None or fields is None:
            return _error(400, "INVALID_TYPE", invalid_type(soql, select.entity))
        columns = []
        for name in select.fields:
            column = fields.get(name)
            if column is None:
                return _error(400, "INVALID_FIELD", invalid_field(soql, name, entity))
            columns.append(column)
        job = _Job(
            id=salesforce_id_18("750" + secrets.token_hex(6).upper()),
            operation=operation,
            entity=entity,
            version=version,
            created_at=self._clock(),
            created_by=grant.user_id,
            delimiter=delimiter,
            line_ending=ending,
            names=select.fields,
            columns=tuple(columns),
            ids=select.ids,
            since=select.since,
        )
        with self._lock:
            self._jobs[job.id] = job
            created = job.info()
        self._start(job)
        return json_answer(200, created)

    # -- run -------------------------------------------------------------------------------

    def _start(self, job: _Job) -> None:
        """Run ``job`` in a thread of its own from now on, as Salesforce processes a query job
        once it is created while the client polls its state."""
        with self._lock:
            failure = self._failures.pop(0) if self._failures else None
        thread = threading.Thread(
            target=self._run, args=(job, failure), name=f"bulk-query-{job.id}", daemon=True
        )
        thread.start()

    def _advance(self, job: _Job) -> None:
        """A status read of a running job (called with the lock held): it answers InProgress
        until the job's work is done and at least ``polls_in_progress`` reads answered so."""
        if job.state not in _RUNNING:
            return
        job.state = "InProgress"
        job.polls += 1
        if job.outcome is not None and job.polls > self.settings.polls_in_progress:
            job.state = job.outcome

    def _run(self, job: _Job, failure: str | None) -> None:
        """The job's work (in its thread): run the query, keep the values it read."""
        started = time.perf_counter()
        with self._lock:
            if job.state == "UploadComplete":
                job.state = "InProgress"
        values: list[Sequence[Any]] = []
        error = failure
        compound = next((c for c in job.columns if c.kind == "compound"), None)
        truth = self._rest.truth
        if error is not None:
            pass
        elif compound is not None:
            error = (
                f"FeatureNotEnabled : Cannot serialize value for '{compound.name}' in CSV format"
            )
        elif truth is None:
            error = "InternalServerError : the org's records are gone"
        else:
            try:
                values = self._read(truth, job)
            except Exception as exc:
                # A job that cannot be run fails, as on Salesforce (the client sees why).
                error = f"InternalServerError : {type(exc).__name__}: {exc}"
        with self._lock:
            if job.state not in _RUNNING or job.expired:
                # Aborted (or its results dropped) while it ran: nothing to keep.
                return
            if error is not None:
                job.error = error
                job.outcome = "Failed"
                return
            job.values = values
            job.processed = len(values[0]) if values else 0
            job.processing_ms = round((time.perf_counter() - started) * 1000)
            job.outcome = "JobComplete"

    def _read(self, truth: GroundTruth, job: _Job) -> list[Sequence[Any]]:
        for _ in range(4):
            try:
                return self._values(truth, job)
            except RuntimeError:
                # The workload is generating into the truth right now (a dict changed size
                # while it was read): read again, as Salesforce serves a consistent view.
                continue
        return self._values(truth, job)

    @staticmethod
    def _values(truth: GroundTruth, job: _Job) -> list[Sequence[Any]]:
        """The values of the records the job selects, a sequence per column."""
        records = truth.stored_records(job.entity)
        deleted = truth.deleted(job.entity)
        if job.ids is None:
            wanted: Sequence[str] = list(records)
        else:
            by_15 = {r[:15]: r for r in records} if any(len(i) == 15 for i in job.ids) else {}
            wanted = list(dict.fromkeys(by_15.get(i, i) for i in job.ids))
        wants_stamp = job.since is not None or any(c.name == MODSTAMP for c in job.columns)
        stamps = truth.modstamps(job.entity) if wants_stamp else None
        every = job.operation == "queryAll"
        get = stamps.get if stamps is not None else _no_stamp
        chosen = [
            (record_id, values, record_id in deleted, get(record_id))
            for record_id, values in zip(wanted, map(records.get, wanted), strict=True)
            if values is not None and (every or record_id not in deleted)
        ]
        if job.since is not None:
            since = job.since
            chosen = [c for c in chosen if _since(since, c[3])]
        # Written column by column: most columns are a stored value as it is, read and written
        # without a call per value. Those values are read record by record (each record's
        # values are read while they are in the CPU's cache: several times faster than a
        # column at a time across every record) and then turned into columns.
        names = list(
            dict.fromkeys(
                c.stored for c in job.columns if c.stored is not None and c.name != MODSTAMP
            )
        )
        # A record lacks the values of fields added after it was last written.
        getter = itemgetter(*names) if len(names) > 1 else None
        try:
            by_record = [getter(v) for _, v, _, _ in chosen] if getter is not None else None
        except KeyError:
            by_record = None
        if by_record is None:
            by_record = [tuple(map(v.get, names)) for _, v, _, _ in chosen]
        # No record chosen: no columns of values (a column's cells are then empty as well).
        stored = dict(zip(names, zip(*by_record, strict=True), strict=False))
        return [_column_values(c, chosen, stored) for c in job.columns]

    @staticmethod
    def _rows(job: _Job, start: int, end: int) -> list[str]:
        """The CSV rows of the job's records ``start`` to ``end`` (called with the lock
        held)."""
        written = job.written
        cells = [
            _column_cells(c.kind, values[start:end], written)
            for c, values in zip(job.columns, job.values, strict=True)
        ]
        return list(map(job.delimiter.join, zip(*cells, strict=True)))

    # -- results, abort --------------------------------------------------------------------

    def _results(self, job: _Job, query: Mapping[str, str]) -> HttpAnswer:
        if job.state != "JobComplete":
            return _error(
                400,
                "INVALIDJOBSTATE",
                f"Job {job.id} has no results in state {job.state}"
                + (f" ({job.error})" if job.error else ""),
            )
        size = self.settings.max_records
        asked = query.get("maxRecords")
        if asked is not None:
            if not asked.isdigit() or int(asked) < 1:
                return _error(
                    400,
                    "INVALIDPARAMETER",
                    f"maxRecords must be a positive whole number (got {asked!r})",
                )
            # The server bounds a set too (Salesforce by its size): whichever is smaller.
            size = min(size, int(asked))
        locator = query.get("locator")
        offset: int | None = 0
        if locator:
            offset = _offset(locator)
            if offset is None or not 0 < offset < job.processed:
                return _error(
                    400,
                    "INVALID_QUERY_LOCATOR",
                    f"Invalid locator {locator!r} for job {job.id}: use a Sforce-Locator value "
                    "this job's results returned",
                )
        start = offset or 0
        end = min(start + size, job.processed)
        page = self._rows(job, start, end)
        ending = job.line_ending
        header = job.delimiter.join(_text_cell(n) for n in job.names)
        text = ending.join([header, *page, ""])
        self.result_sets += 1
        return HttpAnswer(
            200,
            text,
            content_type="text/csv",
            headers=(
                ("Sforce-Locator", _locator(end) if end < job.processed else "null"),
                ("Sforce-NumberOfRecords", str(len(page))),
            ),
        )

    def _patch(self, job: _Job, raw: bytes) -> HttpAnswer:
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, "JSON_PARSER_ERROR", f"The request body is not JSON: {exc}")
        state = body.get("state") if isinstance(body, Mapping) else None
        if state != "Aborted":
            return _error(
                400, "INVALIDJOBSTATE", f"A query job can only be set to Aborted (got {state!r})"
            )
        if job.state not in _RUNNING:
            return _error(
                400, "INVALIDJOBSTATE", f"Job {job.id} is {job.state} and cannot be aborted"
            )
        job.state = "Aborted"
        return json_answer(200, job.info())


def _locator(offset: int) -> str:
    # Salesforce's locators look like base64 of a number ("MTAwMDA" is "10000").
    return base64.b64encode(str(offset).encode("ascii")).decode("ascii").rstrip("=")


def _offset(locator: str) -> int | None:
    try:
        text = base64.b64decode(locator + "=" * (-len(locator) % 4), validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return int(text) if text.isdigit() else None
