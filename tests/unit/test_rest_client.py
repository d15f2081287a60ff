"""RestClient against the emulator's REST endpoint (a real HTTP server over a socket): paging
with nextRecordsUrl, record shapes, error mapping and the SOQL the emulator rejects."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from ingest.auth import ClientCredentials, Secret, TokenManager
from ingest.client import TlsSettings
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.workload import Workload
from ingest.errors import AuthError, RestError, RestUnavailableError
from ingest.rest import RestClient

SEED = 7


@pytest.fixture(scope="module")
def org() -> Iterator[tuple[Emulator, Workload]]:
    catalogue = default_catalogue()
    emulator = Emulator(catalogue, EmulatorConfig(keepalive_interval=0.2))
    emulator.start()
    workload = Workload(catalogue, seed=SEED)
    emulator.append(list(workload.events(600)))
    emulator.rest.attach(workload.truth)
    try:
        yield emulator, workload
    finally:
        emulator.close()


def _tokens(emulator: Emulator) -> TokenManager:
    provider = ClientCredentials(
        emulator.http_url,
        client_id=DEFAULT_CLIENT.client_id,
        client_secret=Secret(DEFAULT_CLIENT.client_secret),
    )
    return TokenManager(provider)


@pytest.fixture
def client(org: tuple[Emulator, Workload]) -> Iterator[RestClient]:
    emulator, _ = org
    with RestClient(_tokens(emulator), tls=TlsSettings(enabled=False)) as rest:
        yield rest


@pytest.fixture
def small_pages(org: tuple[Emulator, Workload]) -> Iterator[None]:
    emulator, _ = org
    emulator.rest.page_size = 7
    try:
        yield
    finally:
        emulator.rest.page_size = 2000


def test_query_follows_next_records_url_over_every_page(
    org: tuple[Emulator, Workload], client: RestClient, small_pages: None
) -> None:
    emulator, workload = org
    truth = workload.truth
    live = truth.live("Account")
    assert len(live) > 20
    pages_before = emulator.rest.pages
    records = list(client.query("SELECT Id, Phone FROM Account"))
    assert [r["Id"] for r in records] == [r for r in truth.records("Account") if r in live]
    assert emulator.rest.pages - pages_before == -(-len(live) // 7)
    for r in records:
        assert r["attributes"] == {
            "type": "Account",
            "url": f"/services/data/v62.0/sobjects/Account/{r['Id']}",
        }
        assert r["Phone"] == truth.record("Account", r["Id"])["Phone"]


def test_query_all_returns_deleted_records_flagged(
    org: tuple[Emulator, Workload], client: RestClient
) -> None:
    _, workload = org
    truth = workload.truth
    deleted = truth.deleted("Contact")
    assert deleted, "the workload deleted no contact"
    records = {r["Id"]: r for r in client.query_all("SELECT Id, IsDeleted FROM Contact")}
    assert set(records) == set(truth.records("Contact"))
    assert {i for i, r in records.items() if r["IsDeleted"]} == deleted
    live = {r["Id"] for r in client.query("SELECT Id FROM Contact")}
    assert live == truth.live("Contact")


def test_where_id_in_selects_those_records(
    org: tuple[Emulator, Workload], client: RestClient
) -> None:
    _, workload = org
    ids = sorted(workload.truth.live("Opportunity"))[:3]
    quoted = ", ".join(f"'{i}'" for i in ids)
    got = [r["Id"] for r in client.query(f"SELECT Id FROM Opportunity WHERE Id IN ({quoted})")]
    assert sorted(got) == ids
    one = list(client.query(f"select id from opportunity where id = '{ids[0]}'"))
    assert [r["Id"] for r in one] == ids[:1]


def test_values_have_the_rest_api_shapes(
    org: tuple[Emulator, Workload], client: RestClient
) -> None:
    _, workload = org
    truth = workload.truth
    rows = list(
        client.query(
            "SELECT Id, Name, FirstName, LastName, IsPersonAccount, BillingAddress, "
            "CreatedDate, PersonBirthdate, NumberOfEmployees FROM Account"
        )
    )
    people = [r for r in rows if r["IsPersonAccount"]]
    business = [r for r in rows if not r["IsPersonAccount"]]
    assert people and business
    for r in business:
        assert r["Name"] == truth.record("Account", r["Id"])["Name"]
        assert r["FirstName"] is None
    for r in people:
        name = truth.record("Account", r["Id"])["Name"]
        assert r["LastName"] == name["LastName"]
        assert r["FirstName"] == name["FirstName"]
        assert name["LastName"] in r["Name"]
    for r in rows:
        created = truth.record("Account", r["Id"])["CreatedDate"]
        parsed = datetime.strptime(r["CreatedDate"], "%Y-%m-%dT%H:%M:%S.%f%z")
        assert int(parsed.timestamp() * 1000) == created
        address = truth.record("Account", r["Id"])["BillingAddress"]
        if address is None:
            assert r["BillingAddress"] is None
        else:
            assert r["BillingAddress"]["city"] == address["City"]
            assert r["BillingAddress"]["postalCode"] == address["PostalCode"]
    dated = [r for r in rows if r["PersonBirthdate"] is not None]
    assert dated and all(len(r["PersonBirthdate"]) == 10 for r in dated)


@pytest.mark.parametrize(
    ("soql", "code"),
    [
        ("SELECT Id FROM Account LIMIT 5", "MALFORMED_QUERY"),
        ("SELECT Id FROM Account ORDER BY Id", "MALFORMED_QUERY"),
        ("SELECT count(Id) FROM Account", "MALFORMED_QUERY"),
        ("SELECT Id FROM Account WHERE Name = 'x'", "MALFORMED_QUERY"),
        ("UPDATE Account SET Name = 'x'", "MALFORMED_QUERY"),
        ("SELECT Id, (SELECT Id FROM Contacts) FROM Account", "MALFORMED_QUERY"),
        ("SELECT Id FROM Nope__c", "INVALID_TYPE"),
        ("SELECT Id, Nope__c FROM Account", "INVALID_FIELD"),
    ],
)
def test_rejected_soql_has_salesforces_error_shape(
    org: tuple[Emulator, Workload], soql: str, code: str
) -> None:
    emulator, _ = org
    tokens = _tokens(emulator)
    token = tokens.current().access_token.reveal()
    response = httpx.get(
        f"{emulator.http_url}/services/data/v62.0/query",
        params={"q": soql},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 400
    body = response.json()
    assert isinstance(body, list) and len(body) == 1
    assert body[0]["errorCode"] == code
    assert isinstance(body[0]["message"], str) and body[0]["message"]
    client = RestClient(tokens, tls=TlsSettings(enabled=False))
    with client, pytest.raises(RestError) as caught:
        list(client.query(soql))
    assert caught.value.status == 400
    assert caught.value.error_code == code
    assert code in str(caught.value)


def test_unknown_query_locator_and_api_version(
    org: tuple[Emulator, Workload], client: RestClient
) -> None:
    emulator, _ = org
    token = _tokens(emulator).current().access_token.reveal()
    auth = {"Authorization": f"Bearer {token}"}
    gone = httpx.get(f"{emulator.http_url}/services/data/v62.0/query/01gNOPE-2000", headers=auth)
    assert gone.status_code == 400
    assert gone.json()[0]["errorCode"] == "INVALID_QUERY_LOCATOR"
    old = httpx.get(
        f"{emulator.http_url}/services/data/v20.0/query", params={"q": "x"}, headers=auth
    )
    assert old.status_code == 404 and old.json()[0]["errorCode"] == "NOT_FOUND"


def test_a_rejected_token_is_refreshed_once(
    org: tuple[Emulator, Workload], client: RestClient
) -> None:
    emulator, _ = org
    tokens = _tokens(emulator)
    first = tokens.current()
    emulator.faults.expire_tokens()
    with RestClient(tokens, tls=TlsSettings(enabled=False)) as rest:
        assert len(list(rest.query("SELECT Id FROM Invoice__c"))) >= 0
    assert tokens.current() is not first
    assert tokens.refreshes == 2


class _Refusing:
    """A token provider whose tokens the server never accepts."""

    name = "refusing"

    def __init__(self, instance_url: str) -> None:
        self.instance_url = instance_url

    def fetch(self) -> Any:
        from ingest.auth import Credentials

        return Credentials(
            access_token=Secret("00D000000000001!AQnotatoken"),
            instance_url=self.instance_url,
            tenant_id="00D000000000001AAA",
            expires_at=None,
            issued_at=0.0,
        )


def test_a_token_rejected_twice_is_an_auth_error_without_the_token(
    org: tuple[Emulator, Workload],
) -> None:
    emulator, _ = org
    rest = RestClient(TokenManager(_Refusing(emulator.http_url)))
    with rest, pytest.raises(AuthError) as caught:
        list(rest.query("SELECT Id FROM Account"))
    assert "INVALID_SESSION_ID" in str(caught.value)
    assert "notatoken" not in str(caught.value)


def test_no_server_is_unavailable_after_the_retries() -> None:
    sleeps: list[float] = []

    class Nowhere(_Refusing):
        pass

    with (
        RestClient(
            TokenManager(Nowhere("http://127.0.0.1:9")), max_attempts=3, sleep=sleeps.append
        ) as rest,
        pytest.raises(RestUnavailableError, match="after 3 attempts"),
    ):
        list(rest.query("SELECT Id FROM Account"))
    assert sleeps == [0.5, 1.0]


def test_no_truth_attached_is_a_clear_error(client: RestClient) -> None:
    catalogue = default_catalogue()
    with Emulator(catalogue, EmulatorConfig()) as bare:
        rest = RestClient(_tokens(bare))
        with rest, pytest.raises(RestError) as caught:
            list(rest.query("SELECT Id FROM Account"))
    assert caught.value.error_code == "API_DISABLED_FOR_ORG"
    assert "ground truth" in str(caught.value)


@pytest.mark.parametrize("version", ["v62.0\n", "62.0", "v62"])
def test_an_api_version_that_is_not_exactly_vNN_N_is_refused(
    org: tuple[Emulator, Workload], version: str
) -> None:
    emulator, _ = org
    with pytest.raises(ValueError, match=r"api_version must look like 'v62\.0'"):
        RestClient(_tokens(emulator), api_version=version, tls=TlsSettings(enabled=False))
