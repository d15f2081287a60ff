"""The emulator's REST resources for the Streaming API: PushTopic and StreamingChannel records,
their validation, SOQL lookups by name, and describe."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ingest.emulator.server import Emulator

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

BASE = "/services/data/v62.0"


@pytest.fixture
def http(emu: Emulator) -> Iterator[httpx.Client]:
    token = emu.issue_token().access_token
    client = httpx.Client(base_url=emu.http_url, headers={"Authorization": f"Bearer {token}"})
    yield client
    client.close()


def push_topic(**fields: Any) -> dict[str, Any]:
    return {"Name": "Accts", "Query": "SELECT Id, Name FROM Account", "ApiVersion": 62.0, **fields}


def test_create_read_update_query_delete(http: httpx.Client) -> None:
    created = http.post(f"{BASE}/sobjects/PushTopic", json=push_topic(NotifyForFields="Select"))
    assert created.status_code == 201, created.text
    topic_id = created.json()["id"]
    record = http.get(f"{BASE}/sobjects/PushTopic/{topic_id}").json()
    assert record["attributes"]["type"] == "PushTopic"
    assert record["NotifyForFields"] == "Select" and record["NotifyForOperations"] == "All"
    assert record["IsActive"] is True and record["NotifyForOperationDelete"] is True
    patched = http.patch(
        f"{BASE}/sobjects/PushTopic/{topic_id}", json={"NotifyForOperationCreate": False}
    )
    assert patched.status_code == 204
    found = http.get(
        f"{BASE}/query",
        params={"q": "SELECT Id, Name, NotifyForOperations FROM PushTopic WHERE Name = 'Accts'"},
    ).json()
    assert found["totalSize"] == 1
    assert found["records"][0]["NotifyForOperations"] == "Update"
    assert http.delete(f"{BASE}/sobjects/PushTopic/{topic_id}").status_code == 204
    assert http.get(f"{BASE}/sobjects/PushTopic/{topic_id}").status_code == 404


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"Query": "SELECT Name FROM Account"}, "INVALID_FIELD", "must select the Id field"),
        ({"Query": "SELECT Id FROM Account LIMIT 10"}, "INVALID_FIELD", "'LIMIT' is not allowed"),
        ({"Query": "SELECT Id FROM Account ORDER BY Name"}, "INVALID_FIELD", "'ORDER BY' clause"),
        ({"Query": "SELECT Id, COUNT(Name) FROM Account"}, "INVALID_FIELD", "Aggregate queries"),
        ({"Query": "SELECT Id FROM Account WHERE NOT Name = 'x'"}, "INVALID_FIELD", "'NOT' is not"),
        ({"Query": "SELECT Id, Owner.Name FROM Account"}, "INVALID_FIELD", "relationships are"),
        (
            {"Query": "SELECT Id FROM Account WHERE Id IN (SELECT AccountId FROM Contact)"},
            "INVALID_FIELD",
            "semi/anti join",
        ),
        ({"Query": "SELECT Id, Nope__c FROM Account"}, "INVALID_FIELD", "Nope__c do not exist"),
        ({"Query": "SELECT Id FROM Account"}, "FIELD_INTEGRITY_EXCEPTION", "Referenced needs"),
        ({"Query": "SELECT Id FROM Account WHERE Description = 'x'"}, "INVALID_FIELD", "filtered"),
        (
            {"Query": "SELECT Id, Name FROM Account WHERE NumberOfEmployees = 'x'"},
            "INVALID_FIELD",
            "type number",
        ),
        ({"Query": "SELECT Id FROM Widget"}, "INVALID_TYPE", "not supported"),
        ({"Name": "A" * 26}, "STRING_TOO_LONG", "max 25"),
        ({"ApiVersion": 20.0}, "FIELD_INTEGRITY_EXCEPTION", "greater than 20.0"),
        ({"NotifyForFields": "Some"}, "INVALID_OR_NULL_FOR_RESTRICTED_PICKLIST", "NotifyForFields"),
        ({"Bogus": 1}, "INVALID_FIELD", "No such column 'Bogus'"),
    ],
)
def test_validation_follows_the_guide(
    http: httpx.Client, fields: dict[str, Any], code: str, message: str
) -> None:
    answer = http.post(f"{BASE}/sobjects/PushTopic", json=push_topic(**fields))
    assert answer.status_code == 400, answer.text
    error = answer.json()[0]
    assert error["errorCode"] == code
    assert message in error["message"]


def test_names_are_unique(http: httpx.Client) -> None:
    assert http.post(f"{BASE}/sobjects/PushTopic", json=push_topic()).status_code == 201
    again = http.post(f"{BASE}/sobjects/PushTopic", json=push_topic())
    assert again.json()[0]["errorCode"] == "DUPLICATE_VALUE"


def test_streaming_channels_are_records_too(http: httpx.Client) -> None:
    bad = http.post(f"{BASE}/sobjects/StreamingChannel", json={"Name": "Alerts"})
    assert bad.json()[0]["errorCode"] == "FIELD_INTEGRITY_EXCEPTION"
    created = http.post(f"{BASE}/sobjects/StreamingChannel", json={"Name": "/u/Alerts"}).json()
    found = http.get(f"{BASE}/query", params={"q": "SELECT Id, Name FROM StreamingChannel"}).json()
    assert [r["Id"] for r in found["records"]] == [created["id"]]


def test_describe_lists_fields_with_types(http: httpx.Client) -> None:
    described = http.get(f"{BASE}/sobjects/Account/describe").json()
    fields = {f["name"]: f for f in described["fields"]}
    assert fields["Id"]["type"] == "id" and fields["Id"]["nillable"] is False
    assert fields["NumberOfEmployees"]["type"] == "int"
    assert fields["AnnualRevenue"]["type"] == "currency"
    assert fields["BillingAddress"]["type"] == "address"
    assert fields["BillingCity"]["compoundFieldName"] == "BillingAddress"
    assert fields["HQ_Location__Latitude__s"]["type"] == "double"
    assert fields["CreatedDate"]["type"] == "datetime"
    assert fields["Industry"]["type"] == "picklist"
    topic = http.get(f"{BASE}/sobjects/PushTopic/describe").json()
    assert {f["name"] for f in topic["fields"]} >= {"Query", "NotifyForFields", "IsActive"}
    assert http.get(f"{BASE}/sobjects/Nothing/describe").status_code == 404


def test_sobjects_need_a_valid_token(emu: Emulator) -> None:
    with httpx.Client(base_url=emu.http_url) as anonymous:
        answer = anonymous.post(f"{BASE}/sobjects/PushTopic", json=push_topic())
    assert answer.status_code == 401
    assert answer.json()[0]["errorCode"] == "INVALID_SESSION_ID"
