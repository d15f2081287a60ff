"""Salesforce's Bulk API 2.0 query jobs: large reads in a few requests.

A query job runs a SOQL query on Salesforce's side and keeps its results as CSV for a week:

1. ``POST /services/data/<version>/jobs/query`` with ``{"operation": "query" | "queryAll",
   "query": <SOQL>}`` creates the job (state ``UploadComplete``);
2. ``GET .../jobs/query/<id>`` is polled, with a growing pause, until the state is
   ``JobComplete`` (``Failed`` carries an ``errorMessage``; ``Aborted`` means someone stopped
   it);
3. ``GET .../jobs/query/<id>/results?maxRecords=N`` returns the first set of records, and each
   answer's ``Sforce-Locator`` header names the next one (``locator=...``) until it says
   ``null``; ``Sforce-NumberOfRecords`` counts the records of the set;
4. the job is deleted once every set was read.

:class:`BulkQueryClient` yields the records as dicts of column name to CSV text, ``None`` for an
empty value: Salesforce stores no empty text, so an empty CSV field is a null whether or not it
was quoted. What the values mean (numbers, booleans, dates) is the caller's to decide, from the
object's describe (:func:`typed_value` reads the common types). :meth:`BulkQueryClient.record_sets`
yields the sets as served instead (:class:`ResultSet`), for a caller that parses large ones
column by column.

Requests go through :meth:`ingest.rest.RestClient.send`: the same token, refresh, retries and
TLS verification as every REST call. Failures are :class:`~ingest.errors.BulkJobError` (a job
that failed, was aborted, took too long, or whose results are gone) or the REST errors of a
request Salesforce refused (invalid SOQL is an HTTP 400 ``MALFORMED_QUERY`` / ``INVALID_FIELD``
when the job is created).
"""

from __future__ import annotations

import csv
import io
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ingest.errors import BulkJobError, RestError
from ingest.rest import RestClient

__all__ = [
    "DEFAULT_MAX_RECORDS",
    "BulkQueryClient",
    "Operation",
    "QueryJob",
    "ResultSet",
    "poll_pause",
    "set_size",
    "typed_value",
]

_log = logging.getLogger(__name__)

Operation = Literal["query", "queryAll"]
DEFAULT_MAX_RECORDS = 50_000
# A job is read in at least this many sets (of at least MIN_SET_RECORDS records) when its sets
# may be that small: see set_size.
OVERLAP_SETS = 4
MIN_SET_RECORDS = 10_000
# The shortest pause between two reads of a job's state (a poll_initial_seconds of 0 included).
_SHORTEST_POLL = 0.01
_DONE = ("JobComplete", "Failed", "Aborted")
_BOOLEANS = {"true": True, "false": False}
_INTEGER_TYPES = frozenset({"int", "long"})
_DOUBLE_TYPES = frozenset({"double", "currency", "percent"})
_T = TypeVar("_T")


@dataclass(frozen=True)
class QueryJob:
    """A query job as ``GET jobs/query/<id>`` describes it."""

    id: str
    object: str
    operation: str
    state: str
    records_processed: int | None = None
    error_message: str | None = None
    # totalProcessingTime: milliseconds Salesforce spent running the job.
    processing_ms: int | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> QueryJob:
        job_id, state = body.get("id"), body.get("state")
        if not isinstance(job_id, str) or not job_id or not isinstance(state, str):
            raise RestError(
                f"Bulk API 2.0: expected a query job with an id and a state (got keys "
                f"{sorted(body)})"
            )
        processed = body.get("numberRecordsProcessed")
        message = body.get("errorMessage")
        processing = body.get("totalProcessingTime")
        return cls(
            id=job_id,
            object=str(body.get("object", "")),
            operation=str(body.get("operation", "")),
            state=state,
            records_processed=processed if isinstance(processed, int) else None,
            error_message=str(message) if message else None,
            processing_ms=processing if isinstance(processing, int) else None,
        )


@dataclass(frozen=True)
class ResultSet:
    """One set of a completed job's results as served: ``content`` is its CSV (UTF-8, a header
    row first), ``number`` counts sets from 1, ``records`` is what ``Sforce-NumberOfRecords``
    announced (``None`` when absent), ``last`` whether its ``Sforce-Locator`` said no set
    follows."""

    job: QueryJob
    number: int
    content: bytes
    records: int | None
    last: bool = False

    def cut_short(self, held: int) -> BulkJobError:
        """The error for a set that held ``held`` records, not the ``records`` announced."""
        return BulkJobError(
            f"Bulk query job {self.job.id}: set {self.number} announced {self.records} records "
            f"and held {held}; the download was cut short, run the command again",
            job_id=self.job.id,
            state=self.job.state,
        )

    def malformed(self, problem: str) -> BulkJobError:
        """The error for a set whose CSV cannot be read (``problem`` says why)."""
        return BulkJobError(
            f"Bulk query job {self.job.id}: set {self.number} of its results {problem}",
            job_id=self.job.id,
            state=self.job.state,
        )


def typed_value(text: str | None, sf_type: str, *, where: str = "value") -> Any:
    """A Bulk API 2.0 CSV value as the REST API's JSON would carry it, by the field's describe
    ``type``: booleans and numbers become ``bool`` / ``int`` / ``float``; every other type
    (text, ids, picklists, dates and times in their ISO forms) stays text. ``None`` stays
    ``None``. A value that does not read as its type raises ``ValueError`` naming ``where``."""
    if text is None:
        return None
    if sf_type == "boolean":
        value = _BOOLEANS.get(text.lower())
        if value is None:
            raise ValueError(f"{where}: expected true or false (got {text!r})")
        return value
    try:
        if sf_type in _INTEGER_TYPES:
            # Whole numbers may come written as "23.0".
            number = float(text) if ("." in text or "e" in text.lower()) else int(text)
            if isinstance(number, float):
                if not number.is_integer():
                    raise ValueError
                return int(number)
            return number
        if sf_type in _DOUBLE_TYPES:
            return float(text)
    except ValueError:
        raise ValueError(f"{where}: expected a {sf_type} number (got {text!r})") from None
    return text


def poll_pause(ran: float, initial: float, longest: float, fraction: float) -> float:
    """How long to wait before reading again the state of a job that has run ``ran`` seconds:
    ``fraction`` of that, at least ``initial`` and at most ``longest``. A job that finishes
    between two reads is seen at most ``fraction`` of its run time late (or ``initial``, or
    ``longest``), and the number of reads grows with the logarithm of its run time."""
    return min(longest, max(initial, fraction * ran, _SHORTEST_POLL))


def set_size(records: int | None, max_records: int, min_records: int = MIN_SET_RECORDS) -> int:
    """The ``maxRecords`` to read a completed job of ``records`` records with: at most
    ``max_records``, and small enough for :data:`OVERLAP_SETS` sets, but not below
    ``min_records``. A reader converts one set while the next one downloads
    (:meth:`BulkQueryClient.record_sets`); what overlaps with nothing is the wait for the first
    set and the conversion of the last, so a job of a few sets would spend up to half its time
    on them. A large job keeps sets of ``max_records``, and so as few requests as before."""
    if records is None:
        return max_records
    return min(max_records, max(min_records, -(-records // OVERLAP_SETS)))


class BulkQueryClient:
    """Runs Bulk API 2.0 query jobs (see the module docstring) through ``rest``.

    ``max_records`` asks for sets of at most that many records; a job of fewer than
    ``OVERLAP_SETS * max_records`` records is read in smaller sets, of at least
    ``min_set_records`` (:func:`set_size`). A job's state is first read
    ``poll_initial_seconds`` after it was created (a short pause: a small job's records are
    read soon), then after pauses of ``poll_fraction`` of the time the job has run so far
    (:func:`poll_pause`; with the default a job is seen finished at most a quarter of its run
    time late) up to ``poll_max_seconds`` (a job that runs for minutes is read a few times a
    minute); a job not finished
    ``timeout_seconds`` after creation is aborted. ``clock`` and ``sleep`` are injected so
    tests never wait. ``last_job`` is the latest job, as last read (its ``records_processed``
    is the number of records a completed job returns).
    """

    def __init__(
        self,
        rest: RestClient,
        *,
        max_records: int = DEFAULT_MAX_RECORDS,
        min_set_records: int = MIN_SET_RECORDS,
        poll_initial_seconds: float = 0.1,
        poll_max_seconds: float = 10.0,
        poll_fraction: float = 0.25,
        timeout_seconds: float = 4 * 3600.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        logger: logging.Logger | None = None,
    ) -> None:
        if max_records < 1 or min_set_records < 1:
            raise ValueError(
                f"max_records and min_set_records must be >= 1 (got {max_records}, "
                f"{min_set_records})"
            )
        if poll_initial_seconds < 0 or poll_max_seconds < poll_initial_seconds:
            raise ValueError(
                "poll_initial_seconds must be >= 0 and poll_max_seconds at least as large "
                f"(got {poll_initial_seconds}, {poll_max_seconds})"
            )
        if poll_fraction <= 0 or timeout_seconds <= 0:
            raise ValueError(
                f"poll_fraction and timeout_seconds must be > 0 (got {poll_fraction}, "
                f"{timeout_seconds})"
            )
        self.rest = rest
        self.max_records = max_records
        self.min_set_records = min_set_records
        self._poll = (poll_initial_seconds, poll_max_seconds, poll_fraction)
        self._timeout = timeout_seconds
        self._clock = clock
        self._sleep = sleep
        self._log = logger or _log
        self.last_job: QueryJob | None = None

    @property
    def _base(self) -> str:
        return f"/services/data/{self.rest.api_version}/jobs/query"

    # -- records ---------------------------------------------------------------------------

    def query(self, soql: str) -> Iterator[dict[str, str | None]]:
        """Every live record ``soql`` selects, read through one query job."""
        return self.records(soql, operation="query")

    def query_all(self, soql: str) -> Iterator[dict[str, str | None]]:
        """Every record ``soql`` selects, deleted ones (``IsDeleted``) included."""
        return self.records(soql, operation="queryAll")

    def records(self, soql: str, *, operation: Operation) -> Iterator[dict[str, str | None]]:
        """Create a job, wait for it, yield the records of every set of results, delete it.

        A job left unfinished (an error, or the caller stopping early) is aborted when it was
        still running; a finished one is left for Salesforce to remove after a week.
        """
        return self._job_yielding(soql, operation, self.results)

    def record_sets(self, soql: str, *, operation: Operation = "queryAll") -> Iterator[ResultSet]:
        """As :meth:`records`, yielding each set of results as served (for callers that parse
        the CSV themselves)."""
        return self._job_yielding(soql, operation, self.result_sets)

    def _job_yielding(
        self, soql: str, operation: Operation, read: Callable[[QueryJob], Iterator[_T]]
    ) -> Iterator[_T]:
        job = self.create(soql, operation=operation)
        finished = False
        try:
            job = self.wait(job)
            yield from read(job)
            finished = True
        finally:
            latest = self.last_job if self.last_job is not None else job
            if finished:
                self._quietly(self.delete, latest)
            elif latest.id == job.id and latest.state not in _DONE:
                self._quietly(self.abort, latest)

    def _quietly(self, action: Callable[[QueryJob], None], job: QueryJob) -> None:
        try:
            action(job)
        except RestError as exc:
            self._log.warning("Bulk query job %s: %s failed (%s)", job.id, action.__name__, exc)

    # -- the job ---------------------------------------------------------------------------

    def create(self, soql: str, *, operation: Operation = "queryAll") -> QueryJob:
        """Create a query job for ``soql``."""
        if not isinstance(soql, str) or not soql.strip():
            raise ValueError(f"expected a SOQL query (got {soql!r})")
        if operation not in ("query", "queryAll"):
            raise ValueError(f"operation must be 'query' or 'queryAll' (got {operation!r})")
        body = {
            "operation": operation,
            "query": soql,
            "contentType": "CSV",
            "columnDelimiter": "COMMA",
            "lineEnding": "LF",
        }
        job = QueryJob.from_json(self.rest.json("POST", self._base, body=body))
        self.last_job = job
        self._log.info("Bulk query job %s created on %s (%s)", job.id, job.object, operation)
        return job

    def job(self, job_id: str) -> QueryJob:
        """The job's current state."""
        job = QueryJob.from_json(self.rest.json("GET", f"{self._base}/{job_id}"))
        self.last_job = job
        return job

    def wait(self, job: QueryJob) -> QueryJob:
        """Poll ``job`` until it is finished; returns it completed, or raises
        :class:`~ingest.errors.BulkJobError` when it failed, was aborted or took longer than
        the timeout (it is aborted then)."""
        initial, longest, fraction = self._poll
        started = self._clock()
        pause = initial
        while job.state not in _DONE:
            if self._clock() - started > self._timeout:
                self._quietly(self.abort, job)
                raise BulkJobError(
                    f"Bulk query job {job.id} on {job.object} was still {job.state} after "
                    f"{self._timeout:.0f} s and was aborted; the object may be too large for one "
                    "job in that time: raise the timeout, or read it with --api rest",
                    job_id=job.id,
                    state=job.state,
                )
            self._sleep(pause)
            pause = poll_pause(self._clock() - started, initial, longest, fraction)
            job = self.job(job.id)
        if job.state == "Failed":
            raise BulkJobError(
                f"Bulk query job {job.id} on {job.object} failed: "
                f"{job.error_message or 'Salesforce gave no errorMessage'}",
                job_id=job.id,
                state=job.state,
            )
        if job.state == "Aborted":
            raise BulkJobError(
                f"Bulk query job {job.id} on {job.object} was aborted (by its creator or a user "
                "with the Manage Data Integrations permission) before it completed; run the "
                "command again to start a new job",
                job_id=job.id,
                state=job.state,
            )
        self._log.info(
            "Bulk query job %s completed: %s records (%s ms of processing on Salesforce's side)",
            job.id,
            job.records_processed,
            job.processing_ms,
        )
        return job

    def result_sets(self, job: QueryJob) -> Iterator[ResultSet]:
        """The sets of results of a completed job, in order (following ``Sforce-Locator``)."""
        locator: str | None = None
        number = 0
        size = set_size(job.records_processed, self.max_records, self.min_set_records)
        while True:
            number += 1
            params = {"maxRecords": str(size)}
            if locator is not None:
                params["locator"] = locator
            try:
                response = self.rest.send(
                    "GET", f"{self._base}/{job.id}/results", params=params, accept="text/csv"
                )
            except RestError as exc:
                if exc.status not in (400, 404):
                    raise
                where = (
                    "the first set" if locator is None else f"set {number} (locator {locator!r})"
                )
                raise BulkJobError(
                    f"Bulk query job {job.id} on {job.object}: {where} of its results cannot be "
                    f"read ({exc.error_code or f'HTTP {exc.status}'}: {_message(exc)}). A job's "
                    "results are kept for 7 days and a locator is only valid for the job that "
                    "returned it; run the command again to read the records with a new job",
                    job_id=job.id,
                    state=job.state,
                    status=exc.status,
                    error_code=exc.error_code,
                ) from exc
            announced = response.headers.get("Sforce-NumberOfRecords")
            nxt = response.headers.get("Sforce-Locator", "null")
            last = not nxt or nxt == "null"
            yield ResultSet(
                job,
                number,
                response.content,
                int(announced) if announced is not None and announced.isdigit() else None,
                last,
            )
            if last:
                return
            locator = nxt

    def results(self, job: QueryJob) -> Iterator[dict[str, str | None]]:
        """The records of a completed job, set after set."""
        header: list[str] | None = None
        for result in self.result_sets(job):
            text = result.content.decode("utf-8", errors="replace")
            rows = list(csv.reader(io.StringIO(text, newline="")))
            if not rows:
                raise result.malformed("has no header row")
            if header is None:
                header = rows[0]
            elif rows[0] != header:
                raise result.malformed(f"has the columns {rows[0]}, the first set had {header}")
            records = rows[1:]
            if result.records is not None and result.records != len(records):
                raise result.cut_short(len(records))
            width = len(header)
            for position, row in enumerate(records, start=1):
                if len(row) != width:
                    raise result.malformed(
                        f"has {len(row)} values in record {position} for {width} columns"
                    )
                yield {name: value or None for name, value in zip(header, row, strict=True)}
            self._log.debug(
                "Bulk query job %s: set %d, %d records", job.id, result.number, len(records)
            )

    def abort(self, job: QueryJob) -> None:
        """Ask Salesforce to stop a running job."""
        self.rest.json("PATCH", f"{self._base}/{job.id}", body={"state": "Aborted"})
        self._log.info("Bulk query job %s aborted", job.id)

    def delete(self, job: QueryJob) -> None:
        """Delete a finished job and its results."""
        self.rest.send("DELETE", f"{self._base}/{job.id}")

    def __repr__(self) -> str:
        return f"BulkQueryClient({self.rest!r}, max_records={self.max_records})"


def _message(exc: RestError) -> str:
    text = str(exc)
    return text.split(": ", 2)[-1] if ": " in text else text
