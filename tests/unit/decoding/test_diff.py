"""Diff-encoded long text: rebuilt exactly, in the value's own line breaks, or refused."""

from __future__ import annotations

import difflib
import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.decoding import apply_diff, diff_sha256, is_diff
from ingest.errors import DecodeError, DiffError


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def build(old: list[str], new: list[str], new_value: str, *, context: int = 0) -> str:
    """Salesforce's diff format from the standard library's unified diff."""
    lines = list(difflib.unified_diff(old, new, lineterm="", n=context))
    body = lines[2:]  # difflib's own '---' / '+++' header lines
    return "\n".join(["--- ", f"+++ {sha(new_value)}", *body])


# Decoded Avro strings never hold lone surrogates (they are not UTF-8).
LINE_CHARS = st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",))

PARAGRAPHS = [
    f"Paragraph {i}: " + "Acme builds widgets for customers in many markets. " * 3
    for i in range(1, 8)
]


def _docs_like(sep: str) -> tuple[str, str, str]:
    """Seven paragraphs, the 2nd and 7th edited, diffed the way the CDC guide shows."""
    new = list(PARAGRAPHS)
    new[1] = "Paragraph 2 was rewritten entirely."
    new[6] = "Paragraph 7: now shorter."
    previous, value = sep.join(PARAGRAPHS), sep.join(new)
    diff = (
        f"--- \n+++ {sha(value)}\n"
        f"@@ -2,1 +2,1 @@\n-{PARAGRAPHS[1]}\n+{new[1]}\n"
        f"@@ -7,1 +7,1 @@\n-{PARAGRAPHS[6]}\n+{new[6]}"
    )
    return previous, diff, value


@pytest.mark.parametrize("sep", ["\r\n", "\n"])
def test_the_documented_shape_rebuilds_in_the_values_own_line_breaks(sep: str) -> None:
    previous, diff, value = _docs_like(sep)
    assert len(previous) >= 1000
    assert apply_diff(previous, diff) == value
    assert is_diff(diff)
    assert diff_sha256(diff) == sha(value)


def test_a_crlf_value_does_not_rebuild_with_lf() -> None:
    previous, _, value = _docs_like("\r\n")
    lf_diff = _docs_like("\n")[1]  # announces the hash of the LF-joined text
    with pytest.raises(DiffError, match=r"SHA-256 of the rebuilt value .* CRLF line breaks"):
        apply_diff(previous, lf_diff)
    assert apply_diff(previous, lf_diff.replace(sha(value.replace("\r\n", "\n")), sha(value)))


def test_a_trailing_line_break_after_the_diff_is_not_a_line() -> None:
    previous, diff, value = _docs_like("\r\n")
    assert apply_diff(previous, diff + "\n") == value


def test_no_newline_markers_are_ignored() -> None:
    previous, diff, value = _docs_like("\n")
    marked = diff + "\n\\ No newline at end of file"
    assert apply_diff(previous, marked) == value


def test_an_upper_case_hash_is_accepted() -> None:
    previous, diff, value = _docs_like("\n")
    upper = diff.replace(sha(value), sha(value).upper())
    assert apply_diff(previous, upper) == value
    assert diff_sha256(upper) == sha(value)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["a", "b", "c"], ["A", "b", "c"]),  # first line
        (["a", "b", "c"], ["a", "b", "C"]),  # last line
        (["a", "b", "c"], ["new", "a", "b", "c"]),  # inserted before everything
        (["a", "b", "c"], ["a", "b", "c", "new"]),  # inserted after everything
        (["a", "b", "c"], ["a", "x", "y", "b", "c"]),  # inserted in the middle
        (["a", "b", "c", "d"], ["a", "d"]),  # deleted
        (["a", "b", "c", "d"], ["b"]),  # deleted around
        (["a", "b", "c", "d", "e", "f"], ["a", "B", "c", "d", "E", "f"]),  # two hunks
        (["a", "", "b", ""], ["a", "", "", "b", ""]),  # empty lines, trailing empty line
        (["é ü 漢字", "🙂"], ["é ü 漢字!", "🙂"]),  # UTF-8 hash
        (["x\u2028y", "z\x85"], ["x\u2028y", "Z\x85"]),  # not line breaks for Salesforce
    ],
)
@pytest.mark.parametrize("sep", ["\r\n", "\n"])
@pytest.mark.parametrize("context", [0, 1, 3])
def test_edits(old: list[str], new: list[str], sep: str, context: int) -> None:
    value = sep.join(new)
    assert apply_diff(sep.join(old), build(old, new, value, context=context)) == value


def test_an_empty_previous_value_has_no_lines() -> None:
    value = "first\nsecond"
    diff = build([], ["first", "second"], value)
    assert "@@ -0,0 +1,2 @@" in diff
    assert apply_diff("", diff) == value


def test_lone_line_feeds_stay_inside_the_lines_of_a_crlf_value() -> None:
    old = ["a\nstill a", "b"]
    new = ["a\nstill a", "B"]
    value = "\r\n".join(new)
    assert apply_diff("\r\n".join(old), build(old, new, value)) == value


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text(LINE_CHARS, max_size=30), min_size=1, max_size=25),
    st.data(),
)
def test_round_trips(old: list[str], data: st.DataObject) -> None:
    new = list(old)
    for _ in range(data.draw(st.integers(0, 6))):
        op = data.draw(st.sampled_from(["replace", "insert", "delete"]))
        text = data.draw(st.text(LINE_CHARS, max_size=30))
        if op == "insert":
            new.insert(data.draw(st.integers(0, len(new))), text)
        elif new:
            i = data.draw(st.integers(0, len(new) - 1))
            if op == "replace":
                new[i] = text
            else:
                del new[i]
    sep = data.draw(st.sampled_from(["\r\n", "\n"]))
    previous, value = sep.join(old), sep.join(new)
    lines = [] if previous == "" else old  # "" has no lines at all
    diff = build(lines, new, value, context=data.draw(st.sampled_from([0, 1, 3])))
    if "\r\n" in previous or sep == "\n" or len(new) <= 1:
        assert apply_diff(previous, diff) == value
    else:
        # A one-line value has no line break to copy: LF is assumed, and the hash says no.
        with pytest.raises(DiffError, match="SHA-256"):
            apply_diff(previous, diff)


# --- refusals -----------------------------------------------------------------------------

PREVIOUS = "one\ntwo\nthree"


def _diff(*lines: str, value: str = "one\nTWO\nthree") -> str:
    return "\n".join(["--- ", f"+++ {sha(value)}", *lines])


@pytest.mark.parametrize(
    ("previous", "diff", "problem"),
    [
        (None, _diff("@@ -2 +2 @@", "-two", "+TWO"), "no previous value"),
        (PREVIOUS, _diff("@@ -2 +2 @@", "-two", "+TWO", value="other"), "SHA-256 of the rebuilt"),
        (PREVIOUS, _diff("@@ -2 +2 @@", "-zwei", "+TWO"), "removed line 2 differs from line 2"),
        (
            PREVIOUS,
            _diff("@@ -1,2 +1,2 @@", " uno", "-two", "+TWO"),
            "context line 1 differs from line 1",
        ),
        (
            PREVIOUS,
            _diff("@@ -4 +4 @@", "-four", "+FOUR"),
            "out of range: the previous value has 3",
        ),
        (PREVIOUS, _diff("@@ -3,2 +3,2 @@", "-three", "-four", "+x", "+y"), "out of range"),
        (
            PREVIOUS,
            _diff("@@ -2 +2 @@", "-two", "+TWO", "@@ -2 +2 @@", "-two", "+TWO"),
            "hunk 2 @@ -2 +2 @@ overlaps or precedes",
        ),
        (PREVIOUS, _diff("@@ -2,2 +2 @@", "-two", "+TWO"), "announces 2 old and 1 new lines but"),
        (PREVIOUS, _diff("@@ -2 +2 @@", "-two"), "announces 1 old and 1 new lines"),
        (PREVIOUS, _diff("@@ -2 +2 @@", "-two", "+TWO", "+extra"), "expected a hunk header"),
        (PREVIOUS, _diff("@@ -2 +2 @@", "-two", "*TWO"), "expected a line starting with"),
        (PREVIOUS, _diff("@@ -0,1 +1 @@", "-one", "+ONE"), "line numbers start at 1"),
        (PREVIOUS, _diff("@@ 2 2 @@", "-two", "+TWO"), "expected a hunk header"),
        (PREVIOUS, _diff("-two", "+TWO"), "diff line 3: expected a hunk header"),
        (PREVIOUS, "just a long text value", "not a diff"),
        (PREVIOUS, "--- \n+++ 1234\n@@ -1 +1 @@", "not a diff"),
        (PREVIOUS, "+++ " + sha("x") + "\n--- ", "not a diff"),
        (PREVIOUS, b"--- ", "a diff must be a str (got bytes)"),
        (42, _diff("@@ -2 +2 @@", "-two", "+TWO"), "previous value must be a str (got int)"),
    ],
)
def test_every_inconsistency_is_refused(previous: object, diff: object, problem: str) -> None:
    with pytest.raises(DiffError) as info:
        apply_diff(previous, diff)  # type: ignore[arg-type]
    assert problem in str(info.value)
    assert isinstance(info.value, DecodeError)


def test_refusals_never_quote_the_text() -> None:
    previous = "public line\nsecret line"
    diff = _diff("@@ -2 +2 @@", "-secret lime", "+redacted", value="x")
    with pytest.raises(DiffError) as info:
        apply_diff(previous, diff)
    assert "secret" not in str(info.value) and "lime" not in str(info.value)


def test_is_diff_and_diff_sha256() -> None:
    _, diff, value = _docs_like("\n")
    assert is_diff(diff) and is_diff("---\n+++ " + sha(value))
    assert not is_diff("--- \n+++ " + sha(value)[:-1])
    assert not is_diff("-- \n+++ " + sha(value))
    assert not is_diff("A normal description.")
    assert not is_diff(None)
    assert not is_diff("--- ")
    assert diff_sha256(diff) == sha(value)
    with pytest.raises(DiffError, match="not a diff"):
        diff_sha256("plain text")
