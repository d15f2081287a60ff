"""Bitmaps checked against an independent reference decoder, worked examples, round trips."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.decoding import BitmapExpander, expander_for, field_names
from ingest.errors import BitmapError
from ingest.schema import EventSchema

from .support import ADDRESS, LOCATION, SWITCHABLE_NAME, event_schema, header, hex_bitmap, opt


def _schema(name: str, fields: list[Any]) -> EventSchema:
    return event_schema(
        {
            "type": "record",
            "name": name,
            "namespace": "com.sforce.eventbus",
            "fields": [header(), *fields],
        }
    )


# Opportunity in the field order of the pilot guide's example (0 header, 1 AccountId, ...,
# 6 Amount, 11 Type, 24 LastModifiedDate, 29 LastAmountChangedHistoryId).
OPPORTUNITY = _schema(
    "OpportunityChangeEvent",
    [
        opt(name, t)
        for name, t in [
            ("AccountId", "string"),
            ("IsPrivate", "boolean"),
            ("Name", "string"),
            ("Description", "string"),
            ("StageName", "string"),
            ("Amount", "double"),
            ("Probability", "double"),
            ("ExpectedRevenue", "double"),
            ("TotalOpportunityQuantity", "double"),
            ("CloseDate", "long"),
            ("Type", "string"),
            ("NextStep", "string"),
            ("LeadSource", "string"),
            ("IsClosed", "boolean"),
            ("IsWon", "boolean"),
            ("ForecastCategory", "string"),
            ("ForecastCategoryName", "string"),
            ("CampaignId", "string"),
            ("HasOpportunityLineItem", "boolean"),
            ("Pricebook2Id", "string"),
            ("OwnerId", "string"),
            ("CreatedDate", "long"),
            ("CreatedById", "string"),
            ("LastModifiedDate", "long"),
            ("LastModifiedById", "string"),
            ("LastStageChangeDate", "long"),
            ("FiscalQuarter", "int"),
            ("FiscalYear", "int"),
            ("LastAmountChangedHistoryId", "string"),
        ]
    ],
)

# Account in the field order of the CDC guide's diff example (0 header, 1 Name, ...,
# 4 BillingAddress, 16 Description, 17 Rating, 22 LastModifiedDate).
ACCOUNT = _schema(
    "AccountChangeEvent",
    [
        opt("Name", "string", "Data:Text"),
        opt("Type", "string", "Data:DynamicEnum"),
        opt("ParentId", "string", "ForeignKey:EntityId"),
        opt("BillingAddress", ADDRESS, "Data:Address"),
        opt("ShippingAddress", "Address", "Data:Address"),
        opt("Phone", "string", "Data:Phone"),
        opt("Fax", "string", "Data:Phone"),
        opt("AccountNumber", "string", "Data:Text"),
        opt("Website", "string", "Data:Url"),
        opt("Sic", "string", "Data:Text"),
        opt("Industry", "string", "Data:DynamicEnum"),
        opt("AnnualRevenue", "double", "Data:Currency"),
        opt("NumberOfEmployees", "int", "Data:Integer"),
        opt("Ownership", "string", "Data:DynamicEnum"),
        opt("TickerSymbol", "string", "Data:Text"),
        opt("Description", "string", "Data:StringPlusClob"),
        opt("Rating", "string", "Data:DynamicEnum"),
        opt("Site", "string", "Data:Text"),
        opt("OwnerId", "string", "ForeignKey:EntityId"),
        opt("CreatedDate", "long", "CreatedDate:DateTime"),
        opt("CreatedById", "string", "ForeignKey:EntityId"),
        opt("LastModifiedDate", "long", "Data:DateTime"),
    ],
)


def _reference(bitmap: list[str], schema: EventSchema) -> list[str]:
    """Reference §2.2 done the long way: hex -> bit string, reversed, '1' positions."""
    names: list[str] = []
    nested: list[str] = []
    for element in bitmap:
        if "-" in element:
            parent, hex_part = element.split("-", 1)
            compound = schema.fields[int(parent)]
            fields, prefix = compound.children, compound.name + "."
        else:
            hex_part, fields, prefix = element, schema.fields, ""
        bits = "".join(format(int(d, 16), "04b") for d in hex_part[2:])[::-1]
        hit = [prefix + fields[i].name for i, bit in enumerate(bits) if bit == "1"]
        (nested if prefix else names).extend(hit)
    return names + nested


# --- Salesforce's worked examples -------------------------------------------------------


def test_the_pilot_guide_opportunity_example() -> None:
    assert field_names(["0x21000840"], OPPORTUNITY) == (
        "Amount",
        "Type",
        "LastModifiedDate",
        "LastAmountChangedHistoryId",
    )
    assert [f.index for f in OPPORTUNITY.fields if f.name in {"Amount", "Type"}] == [6, 11]


@pytest.mark.parametrize(
    ("bitmap", "names"),
    [
        (["0x010000"], ("Description",)),  # diffFields of the diff example
        (["0x410000"], ("Description", "LastModifiedDate")),  # its changedFields
        (["0x420000"], ("Rating", "LastModifiedDate")),
        (["0x420000", "4-0x08"], ("BillingAddress.PostalCode", "Rating", "LastModifiedDate")),
        (
            ["0x400000", "4-0x06"],
            ("BillingAddress.City", "BillingAddress.State", "LastModifiedDate"),
        ),
    ],
)
def test_the_account_examples(bitmap: list[str], names: tuple[str, ...]) -> None:
    assert field_names(bitmap, ACCOUNT) == names
    assert sorted(field_names(bitmap, ACCOUNT)) == sorted(_reference(bitmap, ACCOUNT))


def test_the_documented_example_with_two_compound_elements() -> None:
    # ['0x650004E0', '4-0x10', '7-0x06']: top-level 5, 6, 7, 10, 24, 26, 29, 30; the
    # compound at 4 -> its child 4; the compound at 7 -> children 1 and 2.
    fields = [opt(f"F{i}", "string") for i in range(1, 31)]
    fields[3] = opt("Mailing", ADDRESS, "Data:Address")
    fields[6] = opt("Other", "Address", "Data:Address")
    schema = _schema("WidgetChangeEvent", fields)
    assert field_names(["0x650004E0", "4-0x10", "7-0x06"], schema) == (
        "Mailing.Country",
        "F5",
        "F6",
        "Other",
        "Other.City",
        "Other.State",
        "F10",
        "F24",
        "F26",
        "F29",
        "F30",
    )


# --- the rules --------------------------------------------------------------------------


def test_case_padding_prefix_and_element_order_do_not_matter() -> None:
    expected = ("Name", "BillingAddress.City", "LastModifiedDate")
    for bitmap in (
        ["0x400002", "4-0x02"],
        ["0x400002", "4-0x2"],
        ["0X400002", "4-0X02"],
        ["4-0x02", "0x400002"],
        ["0x0000400002", "04-0x0002"],
        ["0x400000", "0x2", "4-0x02"],  # two top-level elements are one bitmap
        ["0x400002", "4-0x02", "4-0x02"],  # as are repeated nested ones
    ):
        assert field_names(bitmap, ACCOUNT) == expected, bitmap
    assert field_names(["0xaBcD"], ACCOUNT) == field_names(["0xABCD"], ACCOUNT)


def test_different_nested_elements_for_one_parent_are_unioned() -> None:
    # Two elements for BillingAddress (4) that set different children: both count, whichever
    # comes first. Identical repeats cannot tell a union from one element overwriting another.
    street_and_city = ("Name", "BillingAddress.Street", "BillingAddress.City", "LastModifiedDate")
    assert field_names(["0x400002", "4-0x01", "4-0x02"], ACCOUNT) == street_and_city
    assert field_names(["0x400002", "4-0x02", "4-0x01"], ACCOUNT) == street_and_city
    assert field_names(["4-0x01", "0x400002", "5-0x04", "4-0x02", "5-0x08"], ACCOUNT) == (
        "Name",
        "BillingAddress.Street",
        "BillingAddress.City",
        "ShippingAddress.State",
        "ShippingAddress.PostalCode",
        "LastModifiedDate",
    )


def test_empty_and_zero_bitmaps_name_nothing() -> None:
    assert field_names([], ACCOUNT) == ()
    assert field_names(["0x0"], ACCOUNT) == ()
    assert field_names(["0x00", "4-0x00"], ACCOUNT) == ()


def test_the_input_is_never_modified() -> None:
    bitmap = ["0x420000", "4-0x08"]
    field_names(bitmap, ACCOUNT)
    assert bitmap == ["0x420000", "4-0x08"]


def test_the_switchable_name_and_a_location_are_compound_parents() -> None:
    schema = _schema(
        "AccountChangeEvent",
        [
            {"name": "Name", "type": ["null", "string", SWITCHABLE_NAME], "default": None},
            opt("Where__c", LOCATION, "Data:Location:00N000000000001"),
        ],
    )
    assert field_names(["1-0x6", "2-0x1"], schema) == (
        "Name.FirstName",
        "Name.LastName",
        "Where__c.Latitude",
    )


@pytest.mark.parametrize(
    ("bitmap", "problem"),
    [
        (["0x800000"], "bit 23 is past the last field"),
        (["0x1" + "0" * 40], "bit 160 is past the last field"),
        (["4-0x400"], "bit 10 of element 4 is past the last child of BillingAddress (10 children)"),
        (["2-0x1"], "parent index 2 is Type, not a compound field"),
        (["0-0x1"], "parent index 0 is ChangeEventHeader, not a compound field"),
        (["23-0x1"], "parent index 23 is past the last field"),
        (["0x"], "malformed element '0x'"),
        (["12"], "malformed element '12'"),
        (["x12"], "malformed element"),
        (["4-12"], "malformed element"),
        (["-4-0x1"], "malformed element"),
        (["0x1 "], "malformed element"),
        ([" 0x1"], "malformed element"),
        (["0x_1"], "malformed element"),
        (["+0x1"], "malformed element"),
        (["0xG1"], "malformed element"),
        (["\u0664-0x1"], "malformed element"),  # an Arabic-Indic digit is not a parent index
        ([""], "malformed element ''"),
        ([None], "element None is a NoneType"),
        ([["0x1"]], "elements must be strings"),
    ],
)
def test_bitmaps_that_do_not_fit_are_errors(bitmap: list[Any], problem: str) -> None:
    with pytest.raises(BitmapError) as info:
        field_names(bitmap, ACCOUNT)
    message = str(info.value)
    assert problem in message
    assert f"({ACCOUNT.schema_id}, 23 top-level fields)" in message
    assert "does not fit schema com.sforce.eventbus.AccountChangeEvent" in message


@pytest.mark.parametrize("bitmap", ["0x1", b"0x1", 7, {"0x1": 1}])
def test_a_bitmap_is_a_sequence_of_strings(bitmap: Any) -> None:
    with pytest.raises(BitmapError, match=r"a bitmap must be a list of strings .* \(got"):
        field_names(bitmap, ACCOUNT)


def test_none_names_nothing() -> None:
    assert field_names(None, ACCOUNT) == ()


def test_error_messages_quote_a_long_bitmap_only_in_part() -> None:
    with pytest.raises(BitmapError) as info:
        field_names(["0x" + "F" * 5000], ACCOUNT)
    assert len(str(info.value)) < 500


# --- memo -------------------------------------------------------------------------------


def test_answers_are_memoized_per_schema_and_bitmap() -> None:
    expander = expander_for(ACCOUNT)
    assert expander_for(ACCOUNT) is expander
    first = field_names(["0x420000"], ACCOUNT)
    assert expander.memo[("0x420000",)] is first
    assert field_names(("0x420000",), ACCOUNT) is first
    assert field_names(["0x420000"], ACCOUNT) is first


def test_the_memo_is_bounded() -> None:
    expander = BitmapExpander(ACCOUNT, memo_size=4)
    for i in range(1, 20):
        assert expander.expand([hex(i)]) == _tuple(_reference([hex(i)], ACCOUNT))
        assert len(expander.memo) <= 4


def test_a_new_schema_with_a_reused_id_gets_its_own_expander() -> None:
    expander = expander_for(ACCOUNT)
    other = event_schema(
        {
            "type": "record",
            "name": "AccountChangeEvent",
            "namespace": "com.sforce.eventbus",
            "fields": [header(), opt("Only", "string")],
        }
    )
    twin = EventSchema(ACCOUNT.schema_id, other.json, other.name, other.fields, other.raw)
    assert field_names(["0x2"], twin) == ("Only",)
    assert expander_for(twin) is not expander


def _tuple(names: list[str]) -> tuple[str, ...]:
    return tuple(names)


# --- properties -------------------------------------------------------------------------


def _encode(names: list[str], schema: EventSchema, *, upper: bool, pad: int) -> list[str]:
    """The test's own encoder: field names -> bitmap elements."""
    top: set[int] = set()
    nested: dict[int, set[int]] = {}
    for name in names:
        parent, _, child = name.partition(".")
        f = schema.field(parent)
        if child:
            nested.setdefault(f.index, set()).add(f.child(child).index)
        else:
            top.add(f.index)
    elements = [hex_bitmap(top, upper=upper, pad=pad)] if top else []
    elements += [f"{p}-{hex_bitmap(c, upper=upper, pad=pad)}" for p, c in nested.items()]
    return elements


def _schema_order(schema: EventSchema) -> list[str]:
    order: list[str] = []
    for f in schema.fields:
        order.append(f.name)
        if f.children and f.kind != "header":
            order.extend(f"{f.name}.{c.name}" for c in f.children)
    return order


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_round_trips_through_the_test_encoder(data: st.DataObject) -> None:
    order = _schema_order(ACCOUNT)
    names = data.draw(st.lists(st.sampled_from(order[1:]), unique=True))
    bitmap = _encode(
        names, ACCOUNT, upper=data.draw(st.booleans()), pad=data.draw(st.integers(0, 3))
    )
    bitmap = data.draw(st.permutations(bitmap))
    got = field_names(bitmap, ACCOUNT)
    assert got == tuple(sorted(names, key=order.index))
    assert sorted(got) == sorted(_reference(list(bitmap), ACCOUNT))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**23 - 1), st.booleans())
def test_any_top_level_value_matches_the_reference(value: int, upper: bool) -> None:
    digits = format(value, "X" if upper else "x")
    assert list(field_names([f"0x{digits}"], ACCOUNT)) == _reference([f"0x{digits}"], ACCOUNT)


@settings(max_examples=100, deadline=None)
@given(st.integers(2**23, 2**80))
def test_any_value_past_the_fields_is_an_error(value: int) -> None:
    with pytest.raises(BitmapError, match=f"bit {value.bit_length() - 1} is past"):
        field_names([hex(value)], ACCOUNT)
