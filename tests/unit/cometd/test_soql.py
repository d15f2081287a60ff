"""The PushTopic SOQL subset: what parses, what the guide refuses, and evaluation."""

from __future__ import annotations

import pytest

from ingest.emulator.cometd.soql import SoqlError, evaluate, parse_query

pytestmark = pytest.mark.streaming_api


def test_parses_fields_object_and_where() -> None:
    query = parse_query(
        "SELECT Id, Name FROM Account WHERE (Industry = 'Energy' OR Rating != null) AND "
        "Name LIKE 'Ac%' AND NumberOfEmployees NOT IN (1, 2);"
    )
    assert query.fields == ("Id", "Name") and query.entity == "Account"
    record = {"Industry": "energy", "Rating": None, "Name": "Acme", "NumberOfEmployees": 3}
    assert evaluate(query.where, record.get)
    assert not evaluate(query.where, {**record, "NumberOfEmployees": 2}.get)
    assert not evaluate(query.where, {**record, "Name": "Bob"}.get)


def test_dates_and_datetimes_compare_as_epoch_ms() -> None:
    query = parse_query(
        "SELECT Id FROM Opportunity WHERE CloseDate < 2011-06-14 "
        "AND LastModifiedDate >= 2011-06-14T10:00:00Z"
    )
    day = 1_307_923_200_000  # 2011-06-13
    assert evaluate(query.where, {"CloseDate": day, "LastModifiedDate": day + 2 * 86_400_000}.get)
    assert not evaluate(query.where, {"CloseDate": day + 86_400_000, "LastModifiedDate": day}.get)


def test_includes_for_multi_select_picklists() -> None:
    query = parse_query("SELECT Id FROM Account WHERE Segments__c INCLUDES ('a;b', 'c')")
    assert evaluate(query.where, {"Segments__c": "b;a;z"}.get)
    assert not evaluate(query.where, {"Segments__c": "a"}.get)


@pytest.mark.parametrize(
    ("soql", "message"),
    [
        ("SELECT Id FROM Account LIMIT 1", "'LIMIT' is not allowed"),
        ("SELECT Id FROM Account OFFSET 1", "'OFFSET' clause is not allowed"),
        ("SELECT Id, AccountId FROM Contact GROUP BY AccountId", "Aggregate queries"),
        ("SELECT Id, AVG(AnnualRevenue) FROM Account", "Aggregate queries"),
        ("SELECT TYPEOF Owner WHEN User THEN LastName END FROM Case", "'TYPEOF'"),
        ("SELECT Id FROM Account WHERE NOT Name = 'x'", "'NOT' is not supported"),
        ("SELECT Id, Contact.Account.Name FROM Contact", "relationships are not supported"),
        ("SELECT Id FROM Account WHERE Id IN (SELECT AccountId FROM Contact)", "semi/anti join"),
        ("SELECT Id FROM", "unexpected end"),
        ("SELECT Id FROM Account WHERE Name = ", "unexpected end"),
        ("SELECT Id FROM Account WHERE Name ~ 'x'", "unexpected character"),
    ],
)
def test_refused_queries(soql: str, message: str) -> None:
    with pytest.raises(SoqlError, match=message.replace("(", r"\(")):
        parse_query(soql)
