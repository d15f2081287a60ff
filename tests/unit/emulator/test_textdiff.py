from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.emulator.textdiff import decide_diff, sha256_hex, unified_diff
from tests.unit.emulator.reference import apply_diff

PARAGRAPHS = [f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 5 for i in range(1, 11)]


def text(lines: list[str], newline: str) -> str:
    return newline.join(lines)


@pytest.mark.parametrize("newline", ["\r\n", "\n"])
def test_exact_wire_format(newline: str) -> None:
    old = text(PARAGRAPHS, newline)
    new_lines = list(PARAGRAPHS)
    new_lines[1] = "Paragraph 2 updated"
    new_lines[6] = "Paragraph 7 updated"
    new = text(new_lines, newline)
    decision = decide_diff(old, new, newline=newline)  # type: ignore[arg-type]
    digest = hashlib.sha256(new.encode("utf-8")).hexdigest()
    assert decision.diff == (
        f"--- \n+++ {digest}\n"
        f"@@ -2,1 +2,1 @@\n-{PARAGRAPHS[1]}\n+Paragraph 2 updated\n"
        f"@@ -7,1 +7,1 @@\n-{PARAGRAPHS[6]}\n+Paragraph 7 updated"
    )
    assert not decision.diff.endswith("\n"), "no trailing newline after the last diff line"
    assert apply_diff(old, decision.diff, newline) == new


def test_hash_covers_the_records_own_line_breaks() -> None:
    crlf = text(PARAGRAPHS, "\r\n")
    assert sha256_hex(crlf) != sha256_hex(text(PARAGRAPHS, "\n"))
    assert sha256_hex("é") == hashlib.sha256("é".encode()).hexdigest()


def test_insertions_and_deletions_use_empty_ranges() -> None:
    old = text(PARAGRAPHS, "\n")
    inserted = text([*PARAGRAPHS[:3], "A new line", *PARAGRAPHS[3:]], "\n")
    diff = unified_diff(old, inserted, newline="\n")
    assert "@@ -3,0 +4,1 @@\n+A new line" in diff
    assert apply_diff(old, diff, "\n") == inserted
    removed = text(PARAGRAPHS[:4] + PARAGRAPHS[5:], "\n")
    diff = unified_diff(old, removed, newline="\n")
    assert f"@@ -5,1 +4,0 @@\n-{PARAGRAPHS[4]}" in diff
    assert apply_diff(old, diff, "\n") == removed
    first = text(["New first", *PARAGRAPHS], "\n")
    assert "@@ -0,0 +1,1 @@" in unified_diff(old, first, newline="\n")


def test_rules_decide_when_the_full_value_is_sent() -> None:
    old = text(PARAGRAPHS, "\n")
    small = text(["Paragraph 1 updated", *PARAGRAPHS[1:]], "\n")
    assert decide_diff(old, small, newline="\n").send_diff
    assert "null" in decide_diff(None, old, newline="\n").reason
    assert "null" in decide_diff(old, None, newline="\n").reason
    assert "did not change" in decide_diff(old, old, newline="\n").reason
    short = "line one\nline two"
    assert "1000" in decide_diff(short, short + "!", newline="\n").reason
    grown = old + "\n" + old
    assert "50 %" in decide_diff(old, grown, newline="\n").reason
    rewritten = text([p.upper() for p in PARAGRAPHS[:4]] + PARAGRAPHS[4:], "\n")
    assert "25 %" in decide_diff(old, rewritten, newline="\n").reason
    # One long line among four short ones: replacing it is a 20 % line change, but the diff
    # (old line + new line) is longer than the new value.
    long_line = "x" * 1200
    lumpy = text(["a", "b", long_line, "c", "d"], "\n")
    changed = text(["a", "b", "y" * 1200, "c", "d"], "\n")
    assert "not shorter" in decide_diff(lumpy, changed, newline="\n").reason
    mixed = text(PARAGRAPHS, "\r\n").replace("\r\n", "\n", 1)
    assert "line breaks" in decide_diff(mixed, text(PARAGRAPHS, "\r\n"), newline="\r\n").reason
    with pytest.raises(ValueError, match="newline"):
        decide_diff(old, small, newline="\r")  # type: ignore[arg-type]


lines = st.lists(
    st.text(alphabet="abcdeéü東 .,;", min_size=0, max_size=60), min_size=1, max_size=40
)


@given(lines, st.data(), st.sampled_from(["\n", "\r\n"]))
def test_any_edit_round_trips(old_lines: list[str], data: st.DataObject, newline: str) -> None:
    new_lines = list(old_lines)
    for _ in range(data.draw(st.integers(0, 4))):
        action = data.draw(st.sampled_from(["replace", "insert", "delete"]))
        at = data.draw(st.integers(0, max(0, len(new_lines) - 1)))
        line = data.draw(st.text(alphabet="xyz ", max_size=30))
        if action == "replace" and new_lines:
            new_lines[at] = line
        elif action == "insert":
            new_lines.insert(at, line)
        elif new_lines:
            del new_lines[at]
    old, new = newline.join(old_lines), newline.join(new_lines)
    assert apply_diff(old, unified_diff(old, new, newline=newline), newline) == new  # type: ignore[arg-type]
    decision = decide_diff(old, new, newline=newline)  # type: ignore[arg-type]
    if decision.diff is not None:
        assert apply_diff(old, decision.diff, newline) == new
        assert len(decision.diff) < len(new) and len(old) >= 1000
