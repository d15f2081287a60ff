"""The diff Salesforce sends instead of a long text value, and when it sends one.

For an UPDATE of a long text field (Text Area, Long Text Area, Rich Text Area) Salesforce may
send a unified diff against the previous value instead of the value, and flag the field in
``diffFields`` (and ``changedFields``). The diff string is exactly::

    --- \\n+++ <sha256>\\n@@ -a,b +c,d @@\\n-<old line>\\n+<new line>\\n@@ ...

* ``--- `` (with its trailing space, no file name), then ``+++ `` and the lower-case hex
  SHA-256 of the complete new value encoded as UTF-8;
* hunks with **no context lines**, each ``@@ -a,b +c,d @@`` followed by its removed lines
  (``-``) then its added lines (``+``); counts are always written, also when 1 (``-2,1``);
  a start is the 1-based number of the range's first line, or, for an empty range (count 0),
  the number of the line after which the change applies (0 = before the first line), as in
  GNU unified diffs;
* "lines" are the value split at the record's own line break (``\\r\\n`` for values typed in a
  browser, ``\\n`` for most API writes); the diff's own lines are joined with ``\\n``;
* **no trailing** ``\\n`` after the last diff line (Salesforce's behaviour here is not
  documented; a reader should accept one and ignore it).

Reconstruction: split the previous value at the record's line break, replace each hunk's
range, join with the same line break, and check the SHA-256.

A diff is sent only when all of these hold, otherwise the full new value is sent
(:func:`decide_diff` returns the reason):

1. both the previous and the new value are non-null, differ, and are at least 1,000 characters;
2. the length changes by at most 50 % of the previous length;
3. both values use the given line break only (no stray ``\\r`` or ``\\n`` inside a line), so
   the lines are unambiguous;
4. at most 25 % of the lines changed: the sum over hunks of ``max(removed, added)`` is at most a
   quarter of ``max(old line count, new line count)``;
5. the diff is shorter than the new value.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DIFF_MIN_LENGTH",
    "MAX_CHANGED_LINE_RATIO",
    "MAX_LENGTH_CHANGE_RATIO",
    "DiffDecision",
    "Hunk",
    "Newline",
    "decide_diff",
    "hunks",
    "sha256_hex",
    "unified_diff",
]

Newline = Literal["\r\n", "\n"]

DIFF_MIN_LENGTH = 1000
MAX_LENGTH_CHANGE_RATIO = 0.5
MAX_CHANGED_LINE_RATIO = 0.25


@dataclass(frozen=True, slots=True)
class Hunk:
    """One replaced line range: ``removed`` old lines become ``added`` new lines."""

    old_start: int
    old_count: int
    new_start: int
    new_count: int
    removed: tuple[str, ...]
    added: tuple[str, ...]

    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"


@dataclass(frozen=True, slots=True)
class DiffDecision:
    """Whether an update of a long text field is sent as a diff (``diff`` set) or in full."""

    diff: str | None
    reason: str

    @property
    def send_diff(self) -> bool:
        return self.diff is not None


def sha256_hex(value: str) -> str:
    """Lower-case hex SHA-256 of ``value`` encoded as UTF-8 (the ``+++`` line's hash)."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def _start(index: int, count: int) -> int:
    return index + 1 if count else index


def hunks(old_lines: list[str], new_lines: list[str]) -> list[Hunk]:
    """The context-free hunks that turn ``old_lines`` into ``new_lines``."""
    # Edits of long text are usually local: match the common head and tail directly and run
    # the (quadratic) sequence matcher on the changed middle only.
    head = 0
    limit = min(len(old_lines), len(new_lines))
    while head < limit and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    limit -= head
    while tail < limit and old_lines[-1 - tail] == new_lines[-1 - tail]:
        tail += 1
    old_middle = old_lines[head : len(old_lines) - tail]
    new_middle = new_lines[head : len(new_lines) - tail]
    opcodes: Sequence[tuple[str, int, int, int, int]]
    if not old_middle or not new_middle:
        opcodes = [("replace", 0, len(old_middle), 0, len(new_middle))]
    else:
        matcher = difflib.SequenceMatcher(None, old_middle, new_middle, autojunk=False)
        opcodes = matcher.get_opcodes()
    out = []
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal" or (i1 == i2 and j1 == j2):
            continue
        out.append(
            Hunk(
                old_start=_start(head + i1, i2 - i1),
                old_count=i2 - i1,
                new_start=_start(head + j1, j2 - j1),
                new_count=j2 - j1,
                removed=tuple(old_middle[i1:i2]),
                added=tuple(new_middle[j1:j2]),
            )
        )
    return out


def _render(new: str, parts: list[Hunk]) -> str:
    lines = ["--- ", f"+++ {sha256_hex(new)}"]
    for h in parts:
        lines.append(h.header())
        lines.extend("-" + line for line in h.removed)
        lines.extend("+" + line for line in h.added)
    return "\n".join(lines)


def unified_diff(old: str, new: str, *, newline: Newline) -> str:
    """The diff string for ``old`` -> ``new`` split at ``newline``, whatever its size."""
    return _render(new, hunks(old.split(newline), new.split(newline)))


def _stray_break(value: str, newline: Newline) -> bool:
    rest = value.replace(newline, "") if newline == "\r\n" else value
    return "\r" in rest or (newline == "\r\n" and "\n" in rest)


def decide_diff(old: str | None, new: str | None, *, newline: Newline) -> DiffDecision:
    """Apply the rules of the module docstring to one long text update."""
    if newline not in ("\r\n", "\n"):
        raise ValueError(f"newline must be '\\r\\n' or '\\n' (got {newline!r})")
    if old is None or new is None:
        return DiffDecision(None, "a null value is never sent as a diff")
    if old == new:
        return DiffDecision(None, "the value did not change")
    if len(old) < DIFF_MIN_LENGTH or len(new) < DIFF_MIN_LENGTH:
        return DiffDecision(None, f"a value is shorter than {DIFF_MIN_LENGTH} characters")
    if abs(len(new) - len(old)) > MAX_LENGTH_CHANGE_RATIO * len(old):
        return DiffDecision(None, "the length changed by more than 50 %")
    if _stray_break(old, newline) or _stray_break(new, newline):
        return DiffDecision(None, f"a value mixes line breaks other than {newline!r}")
    old_lines = old.split(newline)
    new_lines = new.split(newline)
    parts = hunks(old_lines, new_lines)
    changed = sum(max(h.old_count, h.new_count) for h in parts)
    if changed > MAX_CHANGED_LINE_RATIO * max(len(old_lines), len(new_lines)):
        return DiffDecision(None, "more than 25 % of the lines changed")
    diff = _render(new, parts)
    if len(diff) >= len(new):
        return DiffDecision(None, "the diff is not shorter than the new value")
    return DiffDecision(diff, "sent as a diff")
