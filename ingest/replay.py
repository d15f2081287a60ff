"""Replay ids and subscription start positions.

A replay id is an opaque position in a Pub/Sub API stream. Salesforce documents it as bytes
that must be stored and sent back unchanged; the values seen in practice are 10 bytes, but
nothing here depends on that. It is never converted to a number, because the server does not
promise that it is one, and ids are not comparable across org migrations.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal

__all__ = ["After", "Earliest", "Latest", "ReplayId", "StartPosition", "parse_start"]


@dataclass(frozen=True, slots=True)
class ReplayId:
    """An opaque replay id. Hex is for logs and storage only; equality is byte equality."""

    value: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.value, bytes):
            raise TypeError(
                f"ReplayId needs bytes (got {self.value!r}, a {type(self.value).__name__})"
            )
        if not self.value:
            raise ValueError("ReplayId cannot be empty: the server never assigns an empty id")

    @classmethod
    def from_hex(cls, text: str) -> ReplayId:
        try:
            return cls(bytes.fromhex(text))
        except ValueError as exc:
            raise ValueError(f"replay id must be hex digits (got {text!r})") from exc

    @classmethod
    def from_base64(cls, text: str) -> ReplayId:
        return cls(base64.b64decode(text, validate=True))

    def hex(self) -> str:
        return self.value.hex()

    def base64(self) -> str:
        return base64.b64encode(self.value).decode("ascii")

    def __bytes__(self) -> bytes:
        return self.value

    def __str__(self) -> str:
        return self.value.hex()

    def __repr__(self) -> str:
        return f"ReplayId({self.value.hex()})"


@dataclass(frozen=True, slots=True)
class Latest:
    """Start at the tip of the stream: only events published after subscribing."""

    kind: Literal["latest"] = "latest"


@dataclass(frozen=True, slots=True)
class Earliest:
    """Start at the oldest event the server still retains (72 hours on Salesforce)."""

    kind: Literal["earliest"] = "earliest"


@dataclass(frozen=True, slots=True)
class After:
    """Start strictly after ``replay_id`` (the last event or keepalive durably stored)."""

    replay_id: ReplayId
    kind: Literal["after"] = "after"


StartPosition = Latest | Earliest | After


def parse_start(text: str) -> StartPosition:
    """``"latest"``, ``"earliest"`` or ``"after:<hex replay id>"`` to a start position."""
    lowered = text.strip().lower()
    if lowered == "latest":
        return Latest()
    if lowered == "earliest":
        return Earliest()
    if lowered.startswith("after:"):
        return After(ReplayId.from_hex(lowered.removeprefix("after:")))
    raise ValueError(f"start position must be 'latest', 'earliest' or 'after:<hex>' (got {text!r})")
