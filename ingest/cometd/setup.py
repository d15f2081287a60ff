"""What a Streaming API subscriber sets up or reads over the REST API before subscribing:
PushTopic records and object describes.

:func:`ensure_push_topic` makes a PushTopic match a definition, idempotently: it looks the
topic up by ``Name`` (``SELECT ... FROM PushTopic WHERE Name = '...'``), creates it when it is
missing (``POST sobjects/PushTopic``), updates only the fields that differ
(``PATCH sobjects/PushTopic/<id>``) and leaves an equal one alone. :func:`check_push_topic`
reads an existing PushTopic that someone else manages and compares the fields a definition
states, without writing anything. :func:`describe` reads ``sobjects/<Object>/describe``.

Both take a :class:`RestApi`: anything with ``get``, ``post``, ``patch`` and ``query`` as
:class:`~ingest.rest.RestClient` has them (tests pass the real client against the emulator).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ingest.errors import ChannelError, RestError

__all__ = [
    "PUSH_TOPIC_FIELDS",
    "PushTopicOutcome",
    "RestApi",
    "check_push_topic",
    "describe",
    "ensure_push_topic",
    "find_push_topic",
]

_log = logging.getLogger(__name__)

# The writable PushTopic fields a definition may state (REST names).
PUSH_TOPIC_FIELDS: tuple[str, ...] = (
    "Query",
    "ApiVersion",
    "NotifyForFields",
    "NotifyForOperationCreate",
    "NotifyForOperationUpdate",
    "NotifyForOperationDelete",
    "NotifyForOperationUndelete",
    "Description",
    "IsActive",
)
_NAME = re.compile(r"^[A-Za-z0-9_]{1,25}$")
_OBJECT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class RestApi(Protocol):
    """The REST calls setup needs (:class:`~ingest.rest.RestClient` has them)."""

    api_version: str

    def get(self, path: str) -> dict[str, Any]: ...

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def patch(self, path: str, body: Mapping[str, Any]) -> None: ...

    def query(self, soql: str) -> Iterator[dict[str, Any]]: ...


@dataclass(frozen=True)
class PushTopicOutcome:
    """What :func:`ensure_push_topic` or :func:`check_push_topic` found and did: ``action``
    ``created``, ``updated`` (``changed`` names the fields), ``unchanged`` or ``checked``;
    ``record`` is the PushTopic as it now stands (its ``Query`` decides the notifications)."""

    name: str
    record_id: str
    action: Literal["created", "updated", "unchanged", "checked"]
    record: Mapping[str, Any]
    changed: tuple[str, ...] = ()

    @property
    def query(self) -> str:
        return str(self.record.get("Query") or "")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"a PushTopic name is 1 to 25 letters, digits or underscores (got {name!r})"
        )


def _same(field: str, want: Any, have: Any) -> bool:
    if field == "ApiVersion" and want is not None and have is not None:
        return float(want) == float(have)
    if field == "Query" and isinstance(want, str) and isinstance(have, str):
        return " ".join(want.split()) == " ".join(have.split())
    return bool(want == have)


def find_push_topic(rest: RestApi, name: str) -> dict[str, Any] | None:
    """The PushTopic called ``name`` (its id and writable fields), ``None`` when there is
    none."""
    _check_name(name)
    soql = f"SELECT Id, Name, {', '.join(PUSH_TOPIC_FIELDS)} FROM PushTopic WHERE Name = '{name}'"
    for record in rest.query(soql):
        if str(record.get("Name", "")).lower() == name.lower():
            return {k: v for k, v in record.items() if k != "attributes"}
    return None


def ensure_push_topic(
    rest: RestApi,
    name: str,
    settings: Mapping[str, Any],
    *,
    logger: logging.Logger | None = None,
) -> PushTopicOutcome:
    """Make the PushTopic ``name`` hold ``settings`` (REST field names; ``Query`` and
    ``ApiVersion`` required): create it, update the fields that differ, or leave it.

    An inactive PushTopic is activated (a landing subscribes to it). Errors of the REST API
    (a query the org refuses, a field that does not exist) are raised as
    :class:`~ingest.errors.RestError` naming the PushTopic."""
    log = logger or _log
    unknown = sorted(set(settings) - set(PUSH_TOPIC_FIELDS))
    if unknown:
        raise ValueError(f"unknown PushTopic fields {unknown} (known: {list(PUSH_TOPIC_FIELDS)})")
    if not settings.get("Query") or settings.get("ApiVersion") is None:
        raise ValueError("a PushTopic needs at least Query and ApiVersion")
    wanted = {"IsActive": True, **settings}
    base = f"/services/data/{rest.api_version}/sobjects/PushTopic"
    existing = find_push_topic(rest, name)
    if existing is None:
        try:
            answer = rest.post(base, {"Name": name, **wanted})
        except RestError as exc:
            if exc.error_code != "DUPLICATE_VALUE":
                raise RestError(
                    f"creating PushTopic {name} failed: {exc}",
                    status=exc.status,
                    error_code=exc.error_code,
                ) from exc
            # Created meanwhile (or by a create retried after a lost answer): update it.
            existing = find_push_topic(rest, name)
            if existing is None:
                raise
        else:
            record_id = str(answer.get("id") or "")
            log.info("streaming: created PushTopic %s (%s)", name, record_id)
            return PushTopicOutcome(name, record_id, "created", {"Id": record_id, **wanted})
    record_id = str(existing["Id"])
    changed = {k: v for k, v in wanted.items() if not _same(k, v, existing.get(k))}
    if not changed:
        return PushTopicOutcome(name, record_id, "unchanged", existing)
    try:
        rest.patch(f"{base}/{record_id}", changed)
    except RestError as exc:
        raise RestError(
            f"updating PushTopic {name} ({', '.join(sorted(changed))}) failed: {exc}",
            status=exc.status,
            error_code=exc.error_code,
        ) from exc
    log.info("streaming: updated PushTopic %s: %s", name, ", ".join(sorted(changed)))
    return PushTopicOutcome(
        name, record_id, "updated", {**existing, **changed}, tuple(sorted(changed))
    )


def check_push_topic(rest: RestApi, name: str, expected: Mapping[str, Any]) -> PushTopicOutcome:
    """Read the PushTopic ``name``, which someone else manages, and compare the fields
    ``expected`` states (REST names). Raises :class:`~ingest.errors.ChannelError` when it does
    not exist, is inactive or differs; never writes."""
    existing = find_push_topic(rest, name)
    channel = f"/topic/{name}"
    if existing is None:
        raise ChannelError(
            f"PushTopic {name} does not exist in the org, and the object file says it is managed "
            "elsewhere (pushtopic.manage: existing); create it, or let sfcdc create it with "
            "manage: create_or_update and a query",
            channel=channel,
        )
    problems = [
        f"{k}: expected {v!r}, the org has {existing.get(k)!r}"
        for k, v in expected.items()
        if not _same(k, v, existing.get(k))
    ]
    if existing.get("IsActive") is False:
        problems.append("IsActive: expected true, the PushTopic is inactive (no notifications)")
    if problems:
        raise ChannelError(
            f"PushTopic {name} is not as the object file states (pushtopic.manage: existing, "
            f"so sfcdc does not change it): {'; '.join(problems)}. Update the PushTopic, or "
            "the object file",
            channel=channel,
        )
    return PushTopicOutcome(name, str(existing["Id"]), "checked", existing)


def describe(rest: RestApi, sobject: str) -> dict[str, Any]:
    """``GET sobjects/<sobject>/describe``: the object's fields (``name``, ``type``,
    ``compoundFieldName``, ``nillable``, ...)."""
    if not isinstance(sobject, str) or not _OBJECT.fullmatch(sobject):
        raise ValueError(f"expected an object API name such as 'Account' (got {sobject!r})")
    try:
        answer = rest.get(f"/services/data/{rest.api_version}/sobjects/{sobject}/describe")
    except RestError as exc:
        raise RestError(
            f"reading the describe of {sobject} failed: {exc}",
            status=exc.status,
            error_code=exc.error_code,
        ) from exc
    fields = answer.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, Mapping) for f in fields):
        raise RestError(
            f"the describe of {sobject}: expected a 'fields' list of objects (got "
            f"{type(fields).__name__})"
        )
    return answer
