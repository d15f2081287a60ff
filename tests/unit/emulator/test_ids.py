from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.emulator.ids import (
    KEY_PREFIXES,
    IdFactory,
    assign_key_prefixes,
    case_safe_suffix,
    is_valid_id,
    key_prefix,
    to_15,
    to_18,
)

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
ids15 = st.text(alphabet=BASE62, min_size=15, max_size=15)


def reference_suffix(id15: str) -> str:
    # Salesforce's documented recipe: per 5-char chunk, reverse it, write 1 for upper-case
    # letters and 0 otherwise, read that as binary, and index A-Z0-5.
    out = ""
    for chunk in (id15[0:5], id15[5:10], id15[10:15]):
        bits = "".join("1" if c.isupper() else "0" for c in reversed(chunk))
        out += "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"[int(bits, 2)]
    return out


def test_documented_example() -> None:
    assert to_18("001A0000006Vm9r") == "001A0000006Vm9rIAC"
    assert case_safe_suffix("00D000000000062") == "EAA"  # D is bit 2 of chunk 1


@given(ids15)
def test_suffix_matches_the_documented_recipe(id15: str) -> None:
    full = to_18(id15)
    assert full == id15 + reference_suffix(id15)
    assert to_15(full) == id15
    assert to_18(full) == full
    assert is_valid_id(full) and is_valid_id(id15)


@given(ids15)
def test_18_char_ids_are_case_insensitive_identities(id15: str) -> None:
    # Two ids differing only in case get different suffixes, so the 18-char forms stay
    # distinct even when compared without case.
    flipped = id15.swapcase()
    if flipped != id15:
        assert to_18(id15).lower() != to_18(flipped).lower()


def test_wrong_suffix_and_bad_input_are_rejected_with_reasons() -> None:
    with pytest.raises(ValueError, match="suffix should be 'IAC'"):
        to_18("001A0000006Vm9rAAA")
    with pytest.raises(ValueError, match="15 characters"):
        to_18("001-0000006Vm9r")
    with pytest.raises(ValueError, match="15 characters"):
        to_18("short")
    assert not is_valid_id("001A0000006Vm9rAAA")
    assert not is_valid_id(42)
    with pytest.raises(ValueError, match="key prefix"):
        key_prefix("0")


def test_key_prefixes() -> None:
    assert KEY_PREFIXES["Account"] == "001"
    assert KEY_PREFIXES["Contact"] == "003"
    assert KEY_PREFIXES["Opportunity"] == "006"
    assert KEY_PREFIXES["User"] == "005"
    assert KEY_PREFIXES["Organization"] == "00D"
    assigned = assign_key_prefixes(["Invoice__c", "Zeta__c", "Alpha__c", "Account"])
    assert assigned["Invoice__c"] == "a0B"
    assert assigned["Account"] == "001"
    assert assigned["Alpha__c"] != assigned["Zeta__c"]
    assert {assigned["Alpha__c"], assigned["Zeta__c"]}.isdisjoint(KEY_PREFIXES.values())
    assert assign_key_prefixes(["Zeta__c", "Alpha__c"]) == assign_key_prefixes(
        ["Alpha__c", "Zeta__c"]
    )


def test_factory_is_deterministic_unique_and_shares_the_pod() -> None:
    first = IdFactory(random.Random(5), pod="5g")
    second = IdFactory(random.Random(5), pod="5g")
    a = [first.new("001") for _ in range(500)] + [first.new("003") for _ in range(500)]
    b = [second.new("001") for _ in range(500)] + [second.new("003") for _ in range(500)]
    assert a == b
    assert len(set(a)) == len(a)
    assert all(is_valid_id(i) and len(i) == 18 and i[3:5] == "5g" and i[5] == "0" for i in a)
    assert {key_prefix(i) for i in a} == {"001", "003"}
    org = IdFactory.org_id(random.Random(1))
    assert key_prefix(org) == "00D" and is_valid_id(org) and len(org) == 18


def test_factory_rejects_bad_prefix_and_pod() -> None:
    with pytest.raises(ValueError, match="pod"):
        IdFactory(random.Random(1), pod="x")
    with pytest.raises(ValueError, match="key prefix"):
        IdFactory(random.Random(1), pod="5g").new("00")
