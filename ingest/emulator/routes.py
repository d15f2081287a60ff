"""Extra HTTP routes of the emulator's HTTP(S) server, as plain values.

The login server (:mod:`ingest.emulator.oauth`) owns the socket; other parts of the emulator
(the Streaming API's ``/cometd`` endpoint, the ``sobjects`` REST resources) answer requests
through :class:`Route` objects, so they are testable without a server and the login server does
not grow with each API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["HttpAnswer", "HttpRequest", "Route", "json_answer"]


@dataclass(frozen=True)
class HttpRequest:
    """One request: ``headers`` keys are lower-case; ``query`` holds the first value of each
    query parameter."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes = field(repr=False, default=b"")

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True)
class HttpAnswer:
    """What to send back. ``drop`` closes the connection without any answer (a lost long
    poll); ``headers`` are extra response headers such as ``Set-Cookie``."""

    status: int
    body: str = ""
    content_type: str = "application/json;charset=UTF-8"
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False


def json_answer(
    status: int, payload: Any, *, headers: tuple[tuple[str, str], ...] = ()
) -> HttpAnswer:
    """A JSON answer (``payload`` serialized compactly)."""
    return HttpAnswer(status, json.dumps(payload, separators=(",", ":")), headers=headers)


class Route(Protocol):
    """Answers the requests it owns; ``None`` lets the next route (or the login server) try."""

    def answer(self, request: HttpRequest) -> HttpAnswer | None: ...
