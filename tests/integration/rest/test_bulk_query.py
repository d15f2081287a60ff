"""Bulk API 2.0 query jobs against the emulator (a real HTTP server over a socket): a job's
records, read set after set with ``Sforce-Locator`` and typed by describe, equal the REST
API's; and the errors a user can meet (invalid SOQL, a failed job, expired results)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.auth import ClientCredentials, Secret, TokenManager
from ingest.bulk import BulkQueryClient
from ingest.client import TlsSettings
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.ids import to_18
from ingest.emulator.rest import rest_readers, stamped
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from ingest.errors import BulkJobError, RestError
from ingest.rest import RestClient
from pipelines import snapshot_read
from pipelines.snapshot_read import BulkRecords, SnapshotSource

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def org() -> Iterator[tuple[Emulator, Workload]]:
    catalogue = default_catalogue()
    emulator = Emulator(catalogue, EmulatorConfig(keepalive_interval=0.2))
    emulator.start()
    workload = Workload(catalogue, seed=19)
    emulator.append(list(workload.events(400)))
    emulator.serve_records(workload.truth)
    try:
        yield emulator, workload
    finally:
        emulator.close()


@pytest.fixture
def rest(org: tuple[Emulator, Workload]) -> Iterator[RestClient]:
    emulator, _ = org
    tokens = TokenManager(
        ClientCredentials(
            emulator.http_url,
            client_id=DEFAULT_CLIENT.client_id,
            client_secret=Secret(DEFAULT_CLIENT.client_secret),
        )
    )
    with RestClient(tokens, tls=TlsSettings(enabled=False)) as client:
        yield client


def _bulk(rest: RestClient, max_records: int = 50_000) -> BulkQueryClient:
    # Short pauses: the emulator runs a job in the background, as Salesforce does.
    return BulkQueryClient(
        rest, max_records=max_records, poll_initial_seconds=0.01, poll_max_seconds=0.05
    )


def _whole_object_soql(rest: RestClient, entity: str) -> str:
    # Every field the REST API returns, compound fields instead of their parts.
    fields = rest.describe(entity)["fields"]
    names = [f["name"] for f in fields if not f.get("compoundFieldName")]
    return f"SELECT {', '.join(names)} FROM {entity}"


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    # Bulk CSV writes datetimes with "Z", the REST API's JSON with "+0000": the same instant.
    return {
        k: (v.removesuffix("+0000") + "Z" if isinstance(v, str) and v.endswith(".000+0000") else v)
        for k, v in record.items()
        if k != "attributes"
    }


def test_bulk_records_equal_rest_records_over_many_result_sets(
    org: tuple[Emulator, Workload], rest: RestClient
) -> None:
    emulator, workload = org
    soql = _whole_object_soql(rest, "Account")
    expected = {r["Id"]: r for r in rest.query_all(soql)}
    assert workload.truth.deleted("Account"), "the history should hold deleted accounts"
    sets_before = emulator.bulk.result_sets
    reader = BulkRecords(_bulk(rest, max_records=7), describe=rest.describe)
    got = {r["Id"]: r for r in reader.query_all(soql)}
    assert emulator.bulk.result_sets - sets_before == -(-len(expected) // 7)
    assert got.keys() == expected.keys()
    for record_id, record in expected.items():
        assert _plain(got[record_id]) == _plain(record), record_id
    # A finished job is deleted once its records were read.
    assert emulator.bulk.jobs() == []


def test_a_job_max_records_would_read_in_one_set_is_read_in_four(
    org: tuple[Emulator, Workload], rest: RestClient
) -> None:
    # The first set's wait and the last set's conversion overlap nothing: a job of a few sets
    # is read in four smaller ones (ingest.bulk.set_size), none below min_set_records.
    emulator, _ = org
    soql = "SELECT Id, Name FROM Account"
    expected = sorted(r["Id"] for r in rest.query_all(soql))
    assert len(expected) >= 13, "the org should hold enough accounts for four sets"
    for min_set_records, sets in ((5, 4), (len(expected) // 2 + 1, 2)):
        client = BulkQueryClient(
            rest,
            max_records=len(expected),
            min_set_records=min_set_records,
            poll_initial_seconds=0.01,
            poll_max_seconds=0.05,
        )
        before = emulator.bulk.result_sets
        assert sorted(r["Id"] for r in client.query_all(soql)) == expected
        assert emulator.bulk.result_sets - before == sets, min_set_records


@pytest.mark.parametrize("halved", [False, True], ids=["whole", "last-set-halved"])
def test_payload_tables_hold_the_json_of_the_records_query_all_reads(
    org: tuple[Emulator, Workload], rest: RestClient, monkeypatch: pytest.MonkeyPatch, halved: bool
) -> None:
    # The columnar path a poll lands (every object of the catalogue: compound fields, numbers,
    # booleans, dates, long text) writes each record's JSON exactly as json.dumps writes the
    # record the row-by-row path reads, over many result sets; the last set converted in two
    # halves at once too.
    if halved:
        monkeypatch.setattr(snapshot_read, "_HALVED_FROM", 2)
    _, workload = org
    reader = BulkRecords(_bulk(rest, max_records=9), describe=rest.describe)
    for entity in workload.truth.entities:
        soql = _whole_object_soql(rest, entity)
        records = list(reader.query_all(soql))
        tables = list(reader.payloads(soql))
        assert len(tables) == max(1, -(-len(records) // 9)), entity
        rows = [row for table in tables for row in table.to_pylist()]
        assert [r["payload"] for r in rows] == [
            json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in records
        ], entity
        assert [(r["id"], r["modstamp"], r["is_deleted"]) for r in rows] == [
            (r["Id"], r.get("SystemModstamp"), bool(r.get("IsDeleted"))) for r in records
        ], entity
    # Read over REST, the records come as the same tables.
    whole = SnapshotSource(rest).whole(_whole_object_soql(rest, "Account"), "Account")
    by_rest = [json.loads(r["payload"]) for t in whole.payloads() for r in t.to_pylist()]
    by_bulk = {r["Id"]: r for r in reader.query_all(_whole_object_soql(rest, "Account"))}
    assert {r["Id"]: _plain(r) for r in by_rest} == {i: _plain(r) for i, r in by_bulk.items()}


def test_auto_counts_first_and_picks_the_api_by_size(rest: RestClient) -> None:
    bulk = BulkRecords(_bulk(rest), describe=rest.describe)
    soql = "SELECT Id, IsDeleted FROM Account"
    small = SnapshotSource(rest, bulk=bulk, api="auto", bulk_threshold=10**9)
    large = SnapshotSource(rest, bulk=bulk, api="auto", bulk_threshold=1)
    by_rest, by_bulk = small.whole(soql, "Account"), large.whole(soql, "Account")
    assert (by_rest.api, by_bulk.api) == ("rest", "bulk")
    assert by_rest.total == by_bulk.total == len(list(rest.query_all(soql)))
    assert sorted(r["Id"] for r in by_rest.records) == sorted(r["Id"] for r in by_bulk.records)


def test_invalid_soql_is_refused_when_the_job_is_created(rest: RestClient) -> None:
    bulk = _bulk(rest)
    with pytest.raises(RestError, match="MALFORMED_QUERY") as malformed:
        list(bulk.query_all("SELECT Id FROM Account ORDER BY Id"))
    assert not isinstance(malformed.value, BulkJobError)
    with pytest.raises(RestError, match="INVALID_FIELD"):
        list(bulk.query_all("SELECT Id, Nope__c FROM Account"))
    with pytest.raises(RestError, match="INVALID_TYPE"):
        list(bulk.query_all("SELECT Id FROM Nothing__c"))


def test_a_failed_job_reports_salesforce_error_message(
    org: tuple[Emulator, Workload], rest: RestClient
) -> None:
    emulator, _ = org
    emulator.bulk.fail_next("QUERY_TIMEOUT : Your query request was running for too long.")
    with pytest.raises(BulkJobError, match="QUERY_TIMEOUT") as failed:
        list(_bulk(rest).query_all("SELECT Id FROM Account"))
    assert failed.value.state == "Failed"


def test_a_compound_field_makes_the_job_fail(rest: RestClient) -> None:
    with pytest.raises(BulkJobError, match="Cannot serialize value for 'BillingAddress'"):
        list(_bulk(rest).query_all("SELECT Id, BillingAddress FROM Account"))


def test_results_gone_between_two_sets_name_the_locator(
    org: tuple[Emulator, Workload], rest: RestClient
) -> None:
    emulator, _ = org
    records = _bulk(rest, max_records=5).query_all("SELECT Id FROM Account")
    first = [next(records) for _ in range(5)]
    assert len(first) == 5
    assert emulator.bulk.expire() >= 1
    with pytest.raises(BulkJobError, match="locator") as gone:
        list(records)
    assert gone.value.status == 404


def test_a_locator_the_job_never_issued_is_refused(rest: RestClient) -> None:
    bulk = _bulk(rest)
    job = bulk.wait(bulk.create("SELECT Id FROM Account"))
    with pytest.raises(RestError, match="INVALID_QUERY_LOCATOR"):
        rest.send(
            "GET",
            f"/services/data/{rest.api_version}/jobs/query/{job.id}/results",
            params={"locator": "bm9wZQ"},
            accept="text/csv",
        )
    bulk.delete(job)


@pytest.mark.slow
def test_a_bulk_backfill_of_100k_records_equals_the_emulator_records() -> None:
    # 100,000 accounts: a workload's accounts (every field kind, person accounts, deleted
    # ones) copied under new ids, read with one job in ten sets of 10,000.
    catalogue = default_catalogue()
    workload = Workload(
        catalogue,
        seed=23,
        mix=WorkloadMix(
            platform_event=0.0, gap=0.0, overflow=0.0, wildcard=0.0, entity_weights={"Account": 1}
        ),
    )
    list(workload.events(1500))
    truth = workload.truth
    originals = list(truth.records("Account").items())
    deleted = set(truth.deleted("Account"))
    assert deleted, "the workload should delete some accounts"
    copies = 0
    while len(truth.records("Account")) < 100_000:
        record_id, values = originals[copies % len(originals)]
        copies += 1
        copy_id = to_18(f"001Z{copies:011d}")
        truth.create("Account", copy_id, values, event_id=f"copy-{copies}")
        if record_id in deleted:
            truth.delete("Account", copy_id, event_id=f"copy-{copies}-deleted")
    schema = catalogue.topic_for_entity("Account").current_schema
    assert schema is not None
    readers = rest_readers(schema.fields)

    with Emulator(catalogue, EmulatorConfig(keepalive_interval=0.2)) as emulator:
        emulator.serve_records(truth)
        tokens = TokenManager(
            ClientCredentials(
                emulator.http_url,
                client_id=DEFAULT_CLIENT.client_id,
                client_secret=Secret(DEFAULT_CLIENT.client_secret),
            )
        )
        with RestClient(tokens, tls=TlsSettings(enabled=False)) as rest:
            soql = _whole_object_soql(rest, "Account")
            reader = BulkRecords(_bulk(rest, max_records=10_000), describe=rest.describe)
            records = truth.records("Account")
            gone = set(truth.deleted("Account"))
            stamps = truth.modstamps("Account")
            seen: set[str] = set()
            # Compared as they stream in: 100,000 records held twice would need gigabytes.
            for record in reader.query_all(soql):
                record_id = record["Id"]
                values = stamped(records[record_id], stamps.get(record_id))
                expected = {
                    name: readers[name](record_id, values, record_id in gone)
                    for name in record
                    if name != "attributes"  # a person name's parts come through Name
                }
                assert _plain(record) == _plain(_null_compounds(expected)), record_id
                seen.add(record_id)
            assert emulator.bulk.result_sets == 10
    assert len(seen) == len(records) == 100_000


def _null_compounds(record: dict[str, Any]) -> dict[str, Any]:
    # The REST API writes a compound field whose parts are all empty as null.
    return {
        k: None if isinstance(v, dict) and all(x is None for x in v.values()) else v
        for k, v in record.items()
    }


def test_job_states_from_creation_to_abort(rest: RestClient) -> None:
    bulk = _bulk(rest)
    job = bulk.create("SELECT Id FROM Account")
    assert job.state == "UploadComplete"
    assert bulk.job(job.id).state == "InProgress"
    bulk.abort(job)
    assert bulk.job(job.id).state == "Aborted"
    with pytest.raises(BulkJobError, match="was aborted") as aborted:
        bulk.wait(bulk.job(job.id))
    assert aborted.value.job_id == job.id
    # Results of a job that did not complete are refused.
    with pytest.raises(BulkJobError, match="INVALIDJOBSTATE"):
        list(bulk.results(bulk.job(job.id)))
    bulk.delete(job)
    with pytest.raises(RestError, match="NOT_FOUND"):
        bulk.job(job.id)
