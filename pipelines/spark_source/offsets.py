"""Streaming offsets: a replay position per topic, replay ids base64 in the offset JSON.

Replay ids are opaque bytes that cannot be compared or counted, so an offset cannot say
"N events further". Instead the offset that ends a micro-batch says, per topic, where the
stream stands (``after``: the replay id to resume after; or ``start`` before any position is
known), how many events the batch took from the topic (``count``), the replay id of the last
of them (``last``) and, when the batch began at ``latest`` (a position that moves), the first
of them (``first``). Re-reading a batch after a crash subscribes after the start offset's
position and reads until the event whose replay id is ``last``: exactly the same events.

When the server rejected a stored position and ``onCorrupted`` resumed the subscription
elsewhere, the offset ending that micro-batch also lists the replay gap (``gaps``: where among
the batch's events, what was asked and where it resumed), so the micro-batch, and a re-read of
it, carries a row that says events may be missing or repeated there.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingest.replay import After, Earliest, Latest, ReplayId, StartPosition

__all__ = ["BatchOffset", "GapMark", "TopicOffset", "describe_position", "parse_starting"]


def describe_position(position: StartPosition) -> str:
    """``earliest``, ``latest`` or ``after <hex replay id>``."""
    return f"after {position.replay_id.hex()}" if isinstance(position, After) else position.kind


@dataclass(frozen=True)
class GapMark:
    """A replay gap met in a micro-batch: before its event number ``at`` (of its topic), the
    server rejected ``requested`` (``reason``) and the subscription resumed at ``resumed``."""

    at: int
    requested: str
    resumed: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "requested": self.requested,
            "resumed": self.resumed,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GapMark:
        return cls(
            at=int(data.get("at", 0)),
            requested=str(data.get("requested", "")),
            resumed=str(data.get("resumed", "")),
            reason=str(data.get("reason", "")),
        )


@dataclass(frozen=True)
class TopicOffset:
    """One topic's position: ``after`` a replay id, or a ``start`` preset before any."""

    after: ReplayId | None = None
    start: str = "earliest"
    count: int = 0
    last: ReplayId | None = None
    first: ReplayId | None = None
    gaps: tuple[GapMark, ...] = ()

    def position(self) -> StartPosition:
        """Where a subscription continuing from here starts."""
        if self.after is not None:
            return After(self.after)
        return Latest() if self.start == "latest" else Earliest()

    def resting(self) -> TopicOffset:
        """The same position, as the end of a batch that took nothing from this topic."""
        return TopicOffset(after=self.after, start=self.start)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = (
            {"after": self.after.base64()} if self.after is not None else {"start": self.start}
        )
        if self.count:
            out["count"] = self.count
        if self.last is not None:
            out["last"] = self.last.base64()
        if self.first is not None:
            out["first"] = self.first.base64()
        if self.gaps:
            out["gaps"] = [g.to_json() for g in self.gaps]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopicOffset:
        def rid(key: str) -> ReplayId | None:
            text = data.get(key)
            return None if text is None else ReplayId.from_base64(str(text))

        start = str(data.get("start", "earliest"))
        if start not in ("earliest", "latest"):
            raise ValueError(f"an offset's start must be earliest or latest (got {start!r})")
        return cls(
            after=rid("after"),
            start=start,
            count=int(data.get("count", 0)),
            last=rid("last"),
            first=rid("first"),
            gaps=tuple(GapMark.from_json(g) for g in data.get("gaps") or ()),
        )


@dataclass(frozen=True)
class BatchOffset:
    """The offset of all topics of a query, as Spark stores it (a JSON object)."""

    topics: Mapping[str, TopicOffset]

    def to_json(self) -> dict[str, Any]:
        return {"topics": {t: o.to_json() for t, o in sorted(self.topics.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchOffset:
        topics = data.get("topics")
        if not isinstance(topics, Mapping):
            raise ValueError(f"an offset is {{'topics': {{...}}}} (got {data!r})")
        return cls({str(t): TopicOffset.from_json(o) for t, o in topics.items()})


def parse_starting(text: str) -> TopicOffset:
    """``earliest``, ``latest`` or a replay id in base64 (``hex:<digits>`` also accepted)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return TopicOffset(start=value.lower())
    try:
        if value.lower().startswith("hex:"):
            return TopicOffset(after=ReplayId.from_hex(value[4:]))
        return TopicOffset(after=ReplayId(base64.b64decode(value, validate=True)))
    except (ValueError, binascii.Error):
        raise ValueError(
            "must be earliest, latest, or a stored replay id in base64 (e.g. 'AAAAAAAABnc=')"
        ) from None
