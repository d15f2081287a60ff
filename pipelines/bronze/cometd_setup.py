"""Before a Streaming API landing subscribes: PushTopics made (or checked) as the object files
say, and each channel's describe and query stored in ``bronze.sfcdc_describes``.

:func:`prepare_streams` runs once per landing, before the subscription:

- a ``/topic/`` channel with ``pushtopic.manage: create_or_update`` gets its PushTopic created,
  or updated where it differs from the file (settings the file leaves null take Salesforce's
  defaults: ``NotifyForFields: Referenced`` and every operation notifying); one with
  ``manage: existing`` is read and compared with the settings the file states, never written;
- the describe of every channel's object is read (``sobjects/<Object>/describe``);
- a registry row (channel, object, describe JSON, the PushTopic's query) is appended when the
  describe or the query differs from the channel's latest row, so silver types the fields of
  every notification without calling Salesforce, and a query changed later still finds the
  columns it needs.

:func:`read_describes` reads the registry back for silver.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest.cometd.setup import (
    PushTopicOutcome,
    RestApi,
    check_push_topic,
    describe,
    ensure_push_topic,
)
from ingest.errors import ConfigError
from pipelines.bronze.cometd_tables import DESCRIBES_SCHEMA, DESCRIBES_TABLE, CometdTables
from pipelines.engines.base import TableRef

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine
    from pipelines.spec.cometd import CometdObjectSpec

__all__ = [
    "DESCRIBES",
    "DescribeEntry",
    "StreamSetup",
    "prepare_streams",
    "push_topic_settings",
    "read_describes",
]

_log = logging.getLogger(__name__)

DESCRIBES = TableRef("bronze", DESCRIBES_TABLE)

# What Salesforce gives a PushTopic field the create request leaves out.
_SALESFORCE_DEFAULTS: Mapping[str, Any] = {
    "NotifyForFields": "Referenced",
    "NotifyForOperationCreate": True,
    "NotifyForOperationUpdate": True,
    "NotifyForOperationDelete": True,
    "NotifyForOperationUndelete": True,
}


@dataclass(frozen=True)
class DescribeEntry:
    """One registry row: a channel's object describe and PushTopic query at ``fetched_at``."""

    stream: str
    object: str | None
    describe: Mapping[str, Any] | None
    query: str | None
    fingerprint: str
    fetched_at: datetime | None


@dataclass(frozen=True)
class StreamSetup:
    """What :func:`prepare_streams` did for one channel: the PushTopic ``action``
    (``created``, ``updated``, ``unchanged``, ``checked``, or ``None`` on other channels),
    the query in force, and whether a registry row was written."""

    stream: str
    action: str | None
    query: str | None
    fields: int
    registered: bool


def push_topic_settings(spec: CometdObjectSpec) -> dict[str, Any]:
    """The PushTopic fields ``spec`` sets (``create_or_update``: defaults filled in) or
    checks (``existing``: only those the file states)."""
    assert spec.pushtopic is not None
    stated = spec.pushtopic.settings()
    if spec.pushtopic.manage == "existing":
        # The API version only matters to the one who saves the PushTopic.
        stated.pop("ApiVersion", None)
        return stated
    return {**_SALESFORCE_DEFAULTS, **stated}


def _fingerprint(describe_json: str | None, query: str | None) -> str:
    digest = hashlib.sha256()
    digest.update((describe_json or "").encode())
    digest.update(b"\0")
    digest.update((query or "").encode())
    return digest.hexdigest()


def read_describes(
    engine: LakeEngine, table: TableRef = DESCRIBES
) -> dict[str, list[DescribeEntry]]:
    """The registry, per stream key, oldest row first."""
    if not engine.exists(table):
        return {}
    rows = engine.read_arrow(table).to_pylist()
    rows.sort(key=lambda r: (r["fetched_at"] is None, r["fetched_at"] or datetime.min))
    out: dict[str, list[DescribeEntry]] = {}
    for r in rows:
        text = r["describe_json"]
        out.setdefault(r["stream"], []).append(
            DescribeEntry(
                stream=r["stream"],
                object=r["object"],
                describe=json.loads(text) if text else None,
                query=r["query"],
                fingerprint=r["fingerprint"],
                fetched_at=r["fetched_at"],
            )
        )
    return out


def _push_topic(rest: RestApi, spec: CometdObjectSpec, log: logging.Logger) -> PushTopicOutcome:
    assert spec.pushtopic is not None and spec.push_topic_name is not None
    settings = push_topic_settings(spec)
    if spec.pushtopic.manage == "existing":
        return check_push_topic(rest, spec.push_topic_name, settings)
    return ensure_push_topic(rest, spec.push_topic_name, settings, logger=log)


def prepare_streams(
    engine: LakeEngine,
    tables: CometdTables,
    streams: Sequence[CometdObjectSpec],
    rest: RestApi,
    *,
    clock: Callable[[], float] = time.time,
    logger: logging.Logger | None = None,
) -> list[StreamSetup]:
    """Make or check the PushTopics and store describes (see the module docstring)."""
    log = logger or _log
    latest = {key: entries[-1] for key, entries in read_describes(engine, tables.describes).items()}
    rows: list[dict[str, Any]] = []
    out: list[StreamSetup] = []
    now = datetime.fromtimestamp(clock(), tz=timezone.utc)
    for spec in streams:
        action: str | None = None
        query: str | None = None
        if spec.channel_kind == "pushtopic":
            outcome = _push_topic(rest, spec, log)
            action, query = outcome.action, outcome.query
            if spec.pushtopic is not None and spec.pushtopic.manage == "existing":
                log.info("streaming: PushTopic %s exists as stated", outcome.name)
        answer: dict[str, Any] | None = None
        if spec.api_name is not None:
            answer = describe(rest, spec.api_name)
            _check_selected(spec, query, answer)
        text = json.dumps(answer, sort_keys=True, separators=(",", ":")) if answer else None
        fingerprint = _fingerprint(text, query)
        previous = latest.get(spec.key)
        register = previous is None or previous.fingerprint != fingerprint
        if register:
            rows.append(
                {
                    "stream": spec.key,
                    "object": spec.api_name,
                    "describe_json": text,
                    "query": query,
                    "fingerprint": fingerprint,
                    "fetched_at": now,
                }
            )
        fields = len(answer.get("fields", [])) if answer else 0
        out.append(StreamSetup(spec.key, action, query, fields, register))
    if rows:
        engine.append(
            tables.describes,
            pa.Table.from_pylist(rows, schema=DESCRIBES_SCHEMA),
            metadata={"sfcdc.streams": ",".join(r["stream"] for r in rows)},
        )
        # A generic channel's row has no object (its payloads are text): name the channels.
        log.info(
            "streaming: stored the describe and query of %s in %s",
            ", ".join(str(r["stream"]) for r in rows),
            tables.describes,
        )
    return out


def _check_selected(spec: CometdObjectSpec, query: str | None, answer: Mapping[str, Any]) -> None:
    """A query naming a field the describe lacks would quarantine every notification: say so
    before subscribing."""
    if query is None:
        return
    from pipelines.spec.cometd import query_parts

    try:
        selected, entity = query_parts(query)
    except ValueError as exc:
        raise ConfigError(
            f"{spec.channel}: the PushTopic's query cannot be landed: {exc}. Change the query "
            "(pushtopic.query, or the PushTopic itself with manage: existing)"
        ) from exc
    if spec.api_name is not None and entity.lower() != spec.api_name.lower():
        raise ConfigError(
            f"{spec.channel}: the PushTopic selects FROM {entity} but the object file says "
            f"object: {spec.api_name}; make them agree"
        )
    known = {str(f.get("name", "")).lower() for f in answer.get("fields", [])}
    missing = [name for name in selected if name.lower() not in known]
    if missing:
        raise ConfigError(
            f"{spec.channel}: the PushTopic selects {missing}, which the describe of "
            f"{spec.api_name} does not list; check the field names and the user's field-level "
            "security"
        )
