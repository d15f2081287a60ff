from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.emulator.bitmaps import BitmapEncoder, bitmap_hex, encode_field_names
from ingest.emulator.catalogue import load_schema
from tests.unit.emulator.reference import RawSchema, decode_bitmap

SCHEMAS = {
    name: load_schema(name)
    for name in (
        "AccountChangeEvent.avsc",
        "AccountChangeEvent.v2.avsc",
        "ContactChangeEvent.avsc",
        "Invoice__ChangeEvent.avsc",
    )
}
HEX = re.compile(r"^(?:(\d+)-)?0x((?:[0-9A-F]{2})+)$")


def all_names(name: str) -> list[str]:
    raw = RawSchema.of(SCHEMAS[name].json)
    names = list(raw.fields[1:])
    for parent, children in raw.children.items():
        names += [f"{parent}.{c}" for c in children]
    return names


@pytest.mark.parametrize(
    ("indexes", "expected"),
    [
        ([6, 11, 24, 29], "0x21000840"),  # the Opportunity update of the pilot guide
        ([16], "0x010000"),  # diffFields of the documented Account Description edit
        ([16, 22], "0x410000"),
        ([17, 22], "0x420000"),
        ([7, 13], "0x2080"),
        ([3], "0x08"),
        ([0], "0x01"),
        ([], "0x00"),
    ],
)
def test_known_bitmaps(indexes: list[int], expected: str) -> None:
    assert bitmap_hex(indexes) == expected


def test_compound_children_go_to_parent_elements_without_the_parent_bit() -> None:
    schema = SCHEMAS["AccountChangeEvent.avsc"]
    # Fields: 0 header, 1 Name, 2 Type, 3 ParentId, 4 BillingAddress ... 19 LastModifiedDate
    encoded = encode_field_names(schema, ["LastModifiedDate", "BillingAddress.PostalCode"])
    assert encoded == ["0x080000", "4-0x08"]
    only_nested = encode_field_names(schema, ["BillingAddress.City", "BillingAddress.State"])
    assert only_nested == ["4-0x06"]
    assert encode_field_names(schema, ["Name.LastName", "Phone"]) == ["0x40", "1-0x04"]
    assert encode_field_names(schema, []) == []


def test_a_field_inserted_before_others_shifts_their_bits() -> None:
    v1 = SCHEMAS["AccountChangeEvent.avsc"]
    v2 = SCHEMAS["AccountChangeEvent.v2.avsc"]
    assert encode_field_names(v1, ["Phone", "BillingAddress.City"]) == ["0x40", "4-0x02"]
    assert encode_field_names(v2, ["Phone", "BillingAddress.City"]) == ["0x80", "5-0x02"]
    assert encode_field_names(v2, ["Type"]) == encode_field_names(v1, ["Type"]) == ["0x04"]


@given(st.data())
def test_round_trip_through_an_independent_decoder(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(SCHEMAS)))
    names = data.draw(st.sets(st.sampled_from(all_names(name))))
    encoded = BitmapEncoder(SCHEMAS[name]).encode(names)
    assert decode_bitmap(RawSchema.of(SCHEMAS[name].json), encoded) == names
    parents = []
    for i, item in enumerate(encoded):
        match = HEX.match(item)
        assert match, item  # upper-case, byte-aligned
        if match[1] is None:
            assert i == 0, "the top-level bitmap comes first"
        else:
            parents.append(int(match[1]))
    assert parents == sorted(set(parents))


def test_bad_names_are_rejected_with_the_valid_ones() -> None:
    schema = SCHEMAS["AccountChangeEvent.avsc"]
    with pytest.raises(ValueError, match=r"'Nope' is not a field of .*AccountChangeEvent"):
        encode_field_names(schema, ["Nope"])
    with pytest.raises(ValueError, match=r"has no child 'Planet'.*Street, City"):
        encode_field_names(schema, ["BillingAddress.Planet"])
    with pytest.raises(ValueError, match=r"Phone of .* is not a compound field"):
        encode_field_names(schema, ["Phone.Digits"])
    with pytest.raises(ValueError, match="ChangeEventHeader"):
        encode_field_names(schema, ["ChangeEventHeader"])
    with pytest.raises(ValueError, match="only in change events"):
        BitmapEncoder(load_schema("Order_Shipped__e.avsc"))
    with pytest.raises(ValueError, match="non-negative"):
        bitmap_hex([-1])
