"""Setup records the Streaming API is configured with, and the errors the REST API answers.

:class:`SObjectError` is a REST error (HTTP status, Salesforce ``errorCode``, field names);
:func:`check_body` validates a create/update body against an object's writable fields;
:func:`new_id` hands out record ids with a key prefix (``0IF`` PushTopic, ``0M6``
StreamingChannel).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any

from ingest.emulator.managed import salesforce_id_18

__all__ = ["SObjectError", "check_body", "new_id"]

_COUNTER = itertools.count(1)
_COUNTER_LOCK = threading.Lock()


class SObjectError(Exception):
    """A REST API error answer: ``[{"message", "errorCode", "fields"}]`` with ``status``."""

    def __init__(
        self, code: str, message: str, *, status: int = 400, fields: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.fields = fields

    def body(self) -> list[dict[str, Any]]:
        return [{"message": self.message, "errorCode": self.code, "fields": list(self.fields)}]


def new_id(prefix: str) -> str:
    """A new 18-character record id starting with ``prefix`` (3 characters)."""
    with _COUNTER_LOCK:
        n = next(_COUNTER)
    return salesforce_id_18(f"{prefix}Em{n:010d}")


def check_body(
    obj: str, body: object, types: Mapping[str, type | tuple[type, ...]]
) -> dict[str, Any]:
    """``body`` as a dict of known writable fields with the right JSON types, or an
    ``INVALID_FIELD`` / ``JSON_PARSER_ERROR`` error naming the first problem."""
    if not isinstance(body, Mapping):
        raise SObjectError(
            "JSON_PARSER_ERROR", f"expected a JSON object of {obj} fields (got {body!r:.80})"
        )
    lower = {name.lower(): name for name in types}
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key == "attributes":
            continue
        name = lower.get(str(key).lower())
        if name is None:
            raise SObjectError(
                "INVALID_FIELD",
                f"No such column '{key}' on sobject of type {obj}",
                fields=(str(key),),
            )
        expected = types[name]
        if value is not None and (
            not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool)
        ):
            raise SObjectError(
                "JSON_PARSER_ERROR",
                f"Cannot deserialize {obj}.{name}: expected {_type_name(expected)} (got "
                f"{type(value).__name__} {value!r:.40})",
                fields=(name,),
            )
        out[name] = value
    return out


def _type_name(expected: type | tuple[type, ...]) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__
