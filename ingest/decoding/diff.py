"""Diff-encoded long text values (``diffFields``) rebuilt from the previous value.

For a long text field (Description, Long Text Area, Rich Text Area) Salesforce may send, in
place of the new value, a unified diff against the previous one::

    --- \\n+++ <sha256 hex of the complete new value>\\n@@ -2,1 +2,1 @@\\n-old\\n+new

The diff's own lines are separated by ``\\n``, while the value keeps the line breaks it was
written with: browsers send ``\\r\\n``, API clients whatever they used. Lines of the previous
value are therefore split at *its* line break (``\\r\\n`` if it contains one, else ``\\n``)
and the result is joined with the same one, with no trailing line break added. The SHA-256
in the ``+++`` line, over the UTF-8 bytes of the complete new value, is the only proof that
the reconstruction is right, so it is always checked; every other inconsistency is an error
too. Nothing is ever guessed: when this module cannot rebuild the exact value, the caller
re-reads the record from Salesforce.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ingest.errors import DiffError

__all__ = ["apply_diff", "diff_sha256", "is_diff"]

_SHA256_LINE = re.compile(r"\+\+\+ ([0-9a-fA-F]{64})\Z")
_HUNK = re.compile(r"@@ -([0-9]{1,9})(?:,([0-9]{1,9}))? \+([0-9]{1,9})(?:,([0-9]{1,9}))? @@")


@dataclass(frozen=True, slots=True)
class _Hunk:
    number: int  # 1-based position among the diff's hunks, for messages
    header: str  # "@@ -a,b +c,d @@" without any trailing section text
    start: int  # first old line, 1-based (for b == 0: the line the insertion follows)
    count: int  # old lines the hunk covers (context and removed)
    old: tuple[tuple[str, bool], ...]  # (text, is_context) for each covered old line
    new: tuple[str, ...]  # the lines that replace them (context and added)


def _header_lines(diff: str) -> tuple[str, str, str] | None:
    first, nl, rest = diff.partition("\n")
    second, _, body = rest.partition("\n")
    if not nl or not (first == "---" or first.startswith("--- ")):
        return None
    match = _SHA256_LINE.match(second)
    if match is None:
        return None
    return first, match.group(1).lower(), body


def is_diff(value: object) -> bool:
    """Whether ``value`` is a diff-encoded text value (``--- `` then ``+++ <sha256>``)."""
    return isinstance(value, str) and value.startswith("---") and _header_lines(value) is not None


def diff_sha256(diff: str) -> str:
    """The lower-case hex SHA-256 of the new value that ``diff`` announces."""
    header = _header_lines(diff) if isinstance(diff, str) else None
    if header is None:
        raise DiffError(_not_a_diff(diff))
    return header[1]


def _not_a_diff(value: object) -> str:
    if not isinstance(value, str):
        return f"a diff must be a str (got {type(value).__name__})"
    return (
        "value is not a diff: expected a '--- ' line then a '+++ <64 hex digits>' line "
        f"(got {len(value)} characters starting {value[:8]!r})"
    )


def _parse(diff: str) -> tuple[str, list[_Hunk]]:
    header = _header_lines(diff) if isinstance(diff, str) else None
    if header is None:
        raise DiffError(_not_a_diff(diff))
    _, sha, body = header
    lines = body.split("\n") if body else []
    if lines and lines[-1] == "":
        lines.pop()  # a line break after the last diff line ends it; it is not a line
    hunks: list[_Hunk] = []
    i = 0
    while i < len(lines):
        number = len(hunks) + 1
        match = _HUNK.match(lines[i])
        if match is None:
            raise DiffError(
                f"diff line {i + 3}: expected a hunk header '@@ -a,b +c,d @@' "
                f"(got a line starting {lines[i][:2]!r})"
            )
        a, b, _c, d = match.groups()
        start, count = int(a), 1 if b is None else int(b)
        added = 1 if d is None else int(d)
        if count > 0 and start == 0:
            raise DiffError(f"hunk {number} {match.group(0)}: line numbers start at 1")
        old: list[tuple[str, bool]] = []
        new: list[str] = []
        i += 1
        while i < len(lines) and (len(old) < count or len(new) < added):
            line = lines[i]
            tag, text = line[:1], line[1:]
            if tag == "-":
                old.append((text, False))
            elif tag == "+":
                new.append(text)
            elif tag == " ":
                old.append((text, True))
                new.append(text)
            elif tag != "\\":  # "\ No newline at end of file": values never end in one anyway
                raise DiffError(
                    f"hunk {number} {match.group(0)}, diff line {i + 3}: expected a line "
                    f"starting with '-', '+' or ' ' (got {tag!r})"
                )
            i += 1
        while i < len(lines) and lines[i].startswith("\\"):
            i += 1
        if len(old) != count or len(new) != added:
            raise DiffError(
                f"hunk {number} {match.group(0)} announces {count} old and {added} new lines "
                f"but carries {len(old)} old and {len(new)} new lines"
            )
        hunks.append(_Hunk(number, match.group(0), start, count, tuple(old), tuple(new)))
    return sha, hunks


def apply_diff(previous: str | None, diff: str) -> str:
    """Rebuild the new value of a diff-encoded field from its ``previous`` value.

    Raises :class:`~ingest.errors.DiffError` naming the problem when there is no previous
    value, the diff is malformed, a hunk falls outside the previous value or overlaps the one
    before it, a context or removed line differs from the previous value, or the SHA-256 of
    the result differs from the ``+++`` line. Messages never quote the text itself.
    """
    sha, hunks = _parse(diff)
    if previous is None:
        raise DiffError("no previous value to apply the diff to: re-read the record")
    if not isinstance(previous, str):
        raise DiffError(f"the previous value must be a str (got {type(previous).__name__})")
    sep = "\r\n" if "\r\n" in previous else "\n"
    old_lines = previous.split(sep) if previous else []
    out: list[str] = []
    cursor = 0
    for h in hunks:
        first = h.start - 1 if h.count else h.start  # 0-based index of the first covered line
        if first < cursor:
            raise DiffError(f"hunk {h.number} {h.header} overlaps or precedes the hunk before it")
        if first + h.count > len(old_lines):
            raise DiffError(
                f"hunk {h.number} {h.header} is out of range: the previous value has "
                f"{len(old_lines)} lines"
            )
        out.extend(old_lines[cursor:first])
        for j, (text, is_context) in enumerate(h.old):
            if old_lines[first + j] != text:
                what = "context line" if is_context else "removed line"
                raise DiffError(
                    f"hunk {h.number} {h.header}: {what} {first + j + 1} differs from line "
                    f"{first + j + 1} of the previous value"
                )
        out.extend(h.new)
        cursor = first + h.count
    out.extend(old_lines[cursor:])
    result = sep.join(out)
    try:
        digest = hashlib.sha256(result.encode("utf-8")).hexdigest()
    except UnicodeEncodeError as exc:
        raise DiffError("the rebuilt value is not valid Unicode") from exc
    if digest != sha:
        newline = "CRLF" if sep == "\r\n" else "LF"
        raise DiffError(
            f"SHA-256 of the rebuilt value ({len(result)} characters, {newline} line breaks) "
            f"is {digest}, the diff announces {sha}"
        )
    return result
