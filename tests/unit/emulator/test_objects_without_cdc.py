"""What the emulator serves of objects whose Change Data Capture is off and of formula fields:
records over REST and Bulk only (describe, query, queryAll, incremental ``SystemModstamp``
filters), no topic and no event; formula fields computed when a record is read, listed as
``calculated`` by describe, in no change event schema, and changing with their inputs without
an event of their own. The ground truth has both."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import datetime, timezone

import grpc
import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.formulas import DEFAULT_FORMULAS, Formula
from ingest.emulator.routes import HttpRequest
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.topics import Catalogue
from ingest.emulator.workload import Workload, WorkloadMix
from ingest.pubsub import pb2, pb2_grpc

MIX = WorkloadMix(platform_event=0.0)
_V = "/services/data/v62.0"


def _catalogue() -> Catalogue:
    catalogue = default_catalogue()
    catalogue.add_formulas(DEFAULT_FORMULAS)
    catalogue.disable_change_events("Opportunity")
    return catalogue


def _literal(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rest(emu: Emulator, soql: str, kind: str = "queryAll") -> list[dict[str, object]]:
    answer = emu.rest.get(f"{_V}/{kind}", {"q": soql}, {"sforce-query-options": "batchSize=2000"})
    assert answer.status == 200, answer.body
    assert answer.body["done"], "one page expected"
    return list(answer.body["records"])


def _bulk(emu: Emulator, soql: str) -> list[dict[str, str]]:
    auth = {"authorization": f"Bearer {emu.issue_token().access_token}"}
    jobs = f"{_V}/jobs/query"
    body = json.dumps({"operation": "queryAll", "query": soql}).encode()
    created = emu.bulk.answer(HttpRequest("POST", jobs, {}, auth, body))
    assert created is not None and created.status == 200, created
    job = json.loads(created.body)["id"]
    # The job runs in the background: its state is polled as a client polls it.
    for _ in range(1000):
        status = emu.bulk.answer(HttpRequest("GET", f"{jobs}/{job}", {}, auth))
        assert status is not None
        if json.loads(status.body)["state"] == "JobComplete":
            break
        time.sleep(0.01)
    results = emu.bulk.answer(HttpRequest("GET", f"{jobs}/{job}/results", {}, auth))
    assert results is not None and results.status == 200, results
    return list(csv.DictReader(io.StringIO(results.body)))


def test_an_object_without_change_data_capture_has_records_but_no_topic_and_no_event() -> None:
    catalogue = _catalogue()
    workload = Workload(catalogue, seed=11, mix=MIX)
    with Emulator(catalogue, EmulatorConfig()) as emu:
        emu.serve_records(workload.truth)
        batch = list(workload.events(400))
        opportunity = [e for e in batch if e.topic == "/data/OpportunityChangeEvent"]
        assert opportunity, "the workload changes Opportunity records all the same"
        stored = emu.append(batch)
        assert len(stored) == len(batch) - len(opportunity)
        assert not emu.log("/data/OpportunityChangeEvent")
        assert emu.log("/data/AccountChangeEvent")
        # No topic: GetTopic says it does not exist, as for an unknown topic.
        channel = emu.channel()
        stub = pb2_grpc.PubSubStub(channel)
        md = emu.issue_token().metadata()
        with pytest.raises(grpc.RpcError) as info:
            stub.GetTopic(pb2.TopicRequest(topic_name="/data/OpportunityChangeEvent"), metadata=md)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert stub.GetTopic(pb2.TopicRequest(topic_name="/data/ContactChangeEvent"), metadata=md)
        channel.close()
        # The records are there, over REST and Bulk, deleted ones through queryAll.
        truth = workload.truth
        rest = {r["Id"]: r for r in _rest(emu, "SELECT Id, IsDeleted, Amount FROM Opportunity")}
        assert set(rest) == set(truth.records("Opportunity"))
        assert {r for r, v in rest.items() if v["IsDeleted"]} == truth.deleted("Opportunity")
        live = _rest(emu, "SELECT Id FROM Opportunity", kind="query")
        assert {r["Id"] for r in live} == truth.live("Opportunity")
        bulk = _bulk(emu, "SELECT Id, Amount FROM Opportunity")
        assert {r["Id"] for r in bulk} == set(rest)
        described = emu.streaming.object_fields("Opportunity")
        assert described is not None and described.get("Amount") is not None
    # The multi-entity channel carries no event of it either.
    assert "/data/OpportunityChangeEvent" not in catalogue.channel_members("/data/ChangeEvents")
    with pytest.raises(KeyError, match="no change event entity Lead"):
        catalogue.disable_change_events("Lead")


def test_formula_fields_are_computed_when_read_and_in_no_change_event() -> None:
    catalogue = _catalogue()
    workload = Workload(catalogue, seed=12, mix=MIX)
    with Emulator(catalogue, EmulatorConfig()) as emu:
        emu.serve_records(workload.truth)
        emu.append(list(workload.events(500)))
        truth = workload.truth
        fields = emu.streaming.object_fields("Invoice__c")
        assert fields is not None
        entry = fields.describe("v62.0")
        total = next(f for f in entry["fields"] if f["name"] == "Total__c")
        assert total["calculated"] is True and total["type"] == "currency"
        assert not total["createable"] and not total["updateable"]
        amount = next(f for f in entry["fields"] if f["name"] == "Amount__c")
        assert amount["calculated"] is False
        # Not in the change event schema, so in no event.
        schema = catalogue.topic("/data/Invoice__ChangeEvent").current_schema
        assert schema is not None and "Total__c" not in {f.name for f in schema.fields}
        # REST and Bulk compute it from the record: equal to the truth's value.
        soql = "SELECT Id, Total__c, Amount__c, Tax_Rate__c FROM Invoice__c"
        rest = {r["Id"]: r for r in _rest(emu, soql)}
        bulk = {r["Id"]: r for r in _bulk(emu, soql)}
        assert set(rest) == set(bulk) == set(truth.records("Invoice__c"))
        valued = 0
        for record_id, row in rest.items():
            want = truth.formula_values("Invoice__c", record_id)["Total__c"]
            assert row["Total__c"] == want
            text = bulk[record_id]["Total__c"]
            assert (float(text) if text else None) == want
            valued += want is not None
        assert valued > 10
        # Opportunity's checkbox formula is never null.
        opportunities = _rest(emu, "SELECT Id, Is_Big_Deal__c FROM Opportunity")
        assert {type(r["Is_Big_Deal__c"]) for r in opportunities} == {bool}
        # Its inputs change: the value changes with them, and no event names the formula.
        before = {r: truth.formula_values("Invoice__c", r)["Total__c"] for r in rest}
        emu.append(list(workload.events(400)))
        after = {r["Id"]: r["Total__c"] for r in _rest(emu, soql)}
        changed = [r for r in before if r in after and after[r] != before[r]]
        assert changed, "no invoice's inputs changed in 400 events"
        assert all(after[r] == truth.formula_values("Invoice__c", r)["Total__c"] for r in after)


def test_formulas_must_read_fields_the_object_has() -> None:
    catalogue = default_catalogue()
    bad = Formula("Odd__c", "double", "currency", ("NoSuchField",), lambda v: None)
    with pytest.raises(ValueError, match=r"Odd__c reads \['NoSuchField'\]"):
        catalogue.add_formulas({"Account": (bad,)})
    with pytest.raises(ValueError, match="a formula field is a custom field"):
        Formula("Odd", "double", "currency", (), lambda v: None)
    with pytest.raises(ValueError, match="describe type one of"):
        Formula("Odd__c", "boolean", "currency", (), lambda v: None)


def test_incremental_queries_filter_on_system_modstamp() -> None:
    catalogue = _catalogue()
    workload = Workload(catalogue, seed=13, mix=MIX)
    with Emulator(catalogue, EmulatorConfig()) as emu:
        emu.serve_records(workload.truth)
        emu.append(list(workload.events(600)))
        stamps = workload.truth.modstamps("Opportunity")
        middle = sorted(stamps.values())[len(stamps) // 2]
        since = _literal(middle)
        bound = middle // 1000 * 1000
        want = {r for r, s in stamps.items() if s >= bound}
        assert 0 < len(want) < len(stamps)
        soql = f"SELECT Id, SystemModstamp FROM Opportunity WHERE SystemModstamp >= {since}"
        assert {r["Id"] for r in _rest(emu, soql)} == want
        assert {r["Id"] for r in _bulk(emu, soql)} == want
        strict = soql.replace(">=", ">")
        assert {r["Id"] for r in _rest(emu, strict)} == {r for r in want if stamps[r] > bound}
        # An offset names the same instant.
        shifted = datetime.fromtimestamp(bound / 1000, timezone.utc).astimezone()
        offset = shifted.strftime("%Y-%m-%dT%H:%M:%S%z")
        same = soql.replace(since, offset)
        assert {r["Id"] for r in _rest(emu, same)} == want
        counted = emu.rest.get(
            f"{_V}/queryAll",
            {"q": f"SELECT COUNT() FROM Opportunity WHERE SystemModstamp >= {since}"},
            {},
        )
        assert counted.status == 200 and counted.body["totalSize"] == len(want)
        refused = emu.rest.get(
            f"{_V}/query", {"q": "SELECT Id FROM Opportunity WHERE SystemModstamp >= '2024'"}, {}
        )
        assert refused.status == 400
        assert refused.body[0]["errorCode"] == "MALFORMED_QUERY"
        assert "WHERE SystemModstamp >= <dateTime>" in refused.body[0]["message"]
