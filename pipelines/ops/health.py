"""Lag in seconds and a verdict (OK, WARN, FAIL) per object, from the commits table.

How far behind Salesforce a table is: now minus its *watermark*, the latest moment up to which
it is known to hold every change.

- bronze (per topic): the newest commit time among the events landed, or the last time a
  keepalive showed nothing pending beyond what was committed (a quiet topic is not behind),
  whichever is later;
- silver: the newest commit time among the events it decoded, or, when it has processed every
  bronze version, bronze's watermark (it then holds all bronze holds);
- gold: the same over silver.

An object is as far behind as its last table (gold; silver for a platform event). Its verdict,
against its ``health`` thresholds: FAIL when that lag reaches ``lag_fail_seconds`` or a layer's
last run failed and none of its tables committed since; WARN when the lag reaches
``lag_warn_seconds``, when quarantined rows or re-sync work reach their thresholds, or when
no lag can be told yet (nothing recorded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pipelines.ops.summary import Summary, TableSummary
from pipelines.spec.sections import HealthSpec

__all__ = ["ErrorNote", "LayerLag", "State", "Verdict", "judge", "layer_lags", "layer_rate"]

State = Literal["OK", "WARN", "FAIL"]
_ORDER: dict[State, int] = {"OK": 0, "WARN": 1, "FAIL": 2}


@dataclass(frozen=True)
class LayerLag:
    """One table's standing: its watermark and how far ``now`` is past it."""

    layer: str
    table: str
    watermark: datetime | None
    behind_seconds: float | None
    last_commit_at: datetime | None

    @classmethod
    def of(
        cls,
        layer: str,
        table: str,
        watermark: datetime | None,
        last_commit_at: datetime | None,
        now: datetime,
    ) -> LayerLag:
        behind = None if watermark is None else max(0.0, (now - watermark).total_seconds())
        return cls(layer, table, watermark, behind, last_commit_at)


@dataclass(frozen=True)
class ErrorNote:
    """The last failure recorded for a layer of an object."""

    layer: str
    at: datetime
    message: str
    recovered: bool


@dataclass(frozen=True)
class Verdict:
    """OK, WARN or FAIL, and why."""

    state: State
    reasons: tuple[str, ...]

    @staticmethod
    def worst(states: Sequence[State]) -> State:
        return max(states, key=_ORDER.__getitem__, default="OK")


def _latest(values: Sequence[datetime | None]) -> datetime | None:
    return max((v for v in values if v is not None), default=None)


def _groups(summary: Summary, layer: str, kind: str, table: str) -> list[TableSummary]:
    return summary.find(layer, kind, table=table)


def layer_lags(
    summary: Summary,
    *,
    now: datetime,
    tables: Sequence[tuple[str, str]],
    caught_up: Sequence[bool],
) -> list[LayerLag]:
    """The lag of each ``(layer, table)`` of an object, bronze first; ``caught_up[i]`` says
    whether table ``i`` has processed every version of table ``i - 1`` (ignored for bronze)."""
    lags: list[LayerLag] = []
    below: datetime | None = None
    for index, (layer, table) in enumerate(tables):
        commits = _groups(summary, layer, "commit", table)
        newest = _latest([g.newest_commit_at for g in commits])
        last = _latest([g.visible_at for g in commits])
        if index == 0:
            # A landing that keeps its topic caught up is running, even without events.
            quiet = _latest([g.visible_at for g in _groups(summary, layer, "caught_up", table)])
            watermark = _latest([newest, quiet])
            last = _latest([last, quiet])
        elif caught_up[index]:
            watermark = _latest([newest, below])
        else:
            watermark = newest
        lags.append(LayerLag.of(layer, table, watermark, last, now))
        below = watermark
    return lags


def layer_rate(summary: Summary, layer: str, table: str, window_seconds: float) -> float | None:
    """Events per second the table's commits applied over the window (``None`` with no
    commit recorded at all)."""
    commits = _groups(summary, layer, "commit", table)
    if not commits:
        return None
    return sum(g.events_recent for g in commits) / window_seconds


def _errors(summary: Summary, lags: Sequence[LayerLag], *, topic: str, obj: str) -> list[ErrorNote]:
    notes = []
    for lag in lags:
        found = [
            g
            for g in summary.find(lag.layer, "error")
            if g.visible_at is not None and g.topic in (None, topic) and g.object in (None, obj)
        ]
        if not found:
            continue
        last = max(found, key=lambda g: g.visible_at)  # type: ignore[arg-type,return-value]
        assert last.visible_at is not None
        recovered = lag.last_commit_at is not None and lag.last_commit_at > last.visible_at
        notes.append(ErrorNote(lag.layer, last.visible_at, last.message or "", recovered))
    return notes


def judge(
    summary: Summary,
    lags: Sequence[LayerLag],
    health: HealthSpec,
    *,
    topic: str,
    obj: str,
    quarantined: int,
    resync_records: int,
    resync_whole: int,
) -> tuple[Verdict, ErrorNote | None]:
    """The object's verdict and its latest recorded failure (see the module docstring)."""
    states: list[State] = []
    reasons: list[str] = []
    final = lags[-1] if lags else None
    if final is None or final.behind_seconds is None:
        states.append("WARN")
        reasons.append("no lag figure yet: nothing recorded in the commits table")
    else:
        behind = final.behind_seconds
        if behind >= health.lag_fail_seconds:
            states.append("FAIL")
            reasons.append(f"{behind:.0f} s behind >= lag_fail_seconds {health.lag_fail_seconds:g}")
        elif behind >= health.lag_warn_seconds:
            states.append("WARN")
            reasons.append(f"{behind:.0f} s behind >= lag_warn_seconds {health.lag_warn_seconds:g}")
    errors = _errors(summary, lags, topic=topic, obj=obj)
    for note in errors:
        if not note.recovered:
            states.append("FAIL")
            reasons.append(
                f"{note.layer} failed at {note.at.isoformat(timespec='seconds')} and has not "
                "committed since"
            )
    if health.quarantine_warn_rows and quarantined >= health.quarantine_warn_rows:
        states.append("WARN")
        reasons.append(f"{quarantined} quarantined rows")
    if health.resync_warn_records and (
        resync_records >= health.resync_warn_records or resync_whole
    ):
        states.append("WARN")
        what = f"{resync_records} records" + (", whole object" if resync_whole else "")
        reasons.append(f"re-sync pending ({what})")
    latest = max(errors, key=lambda n: n.at, default=None)
    return Verdict(Verdict.worst(states), tuple(reasons)), latest
