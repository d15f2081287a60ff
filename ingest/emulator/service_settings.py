"""The Pub/Sub servicer's knobs (:class:`ServiceSettings`), shared by the servicer
(:mod:`ingest.emulator.service`) and the call streams it runs (:mod:`ingest.emulator.streams`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ResponseEncoding", "ServiceSettings"]

# How Subscribe responses are encoded: bytes built once per event, or protobuf messages.
ResponseEncoding = Literal["prebuilt", "message"]


@dataclass(frozen=True)
class ServiceSettings:
    """The servicer's knobs; see :class:`~ingest.emulator.server.EmulatorConfig`."""

    org_id: str
    instance_url: str
    keepalive_interval: float = 270.0
    idle_timeout: float = 60.0
    no_commit_timeout: float = 1800.0
    max_pending: int = 100
    max_response_bytes: int = 3 * 1024 * 1024
    max_event_bytes: int = 1024 * 1024
    response_encoding: ResponseEncoding = "prebuilt"
