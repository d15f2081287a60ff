from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue, schema_versions, topic_for_schema
from ingest.emulator.ids import is_valid_id
from ingest.emulator.topics import Catalogue
from ingest.emulator.workload import DEFAULT_START_MS, Workload, WorkloadMix
from tests.unit.emulator.conftest import Run
from tests.unit.emulator.reference import Decoded, Replica

DAY_MS = 86_400_000
ORIGIN = re.compile(r"^(|com/salesforce/api/[a-z]+/\d+\.\d+(;client=\S+)?)$")
REQUIRED = {
    "Account": ["Name", "OwnerId"],
    "Contact": ["Name", "OwnerId"],
    "Opportunity": ["Name", "StageName", "CloseDate", "OwnerId", "IsClosed", "IsWon"],
    "Invoice__c": ["Name", "OwnerId", "Is_Paid__c"],
}
SYSTEM = ["CreatedDate", "CreatedById", "LastModifiedDate", "LastModifiedById"]
LOOKUPS = {
    "Account": {"ParentId": "001"},
    "Contact": {"AccountId": "001", "ReportsToId": "003"},
    "Opportunity": {"AccountId": "001", "ContactId": "003"},
    "Invoice__c": {"Account__c": "001", "Contact__c": "003"},
}
GAPS = {"GAP_CREATE", "GAP_UPDATE", "GAP_DELETE", "GAP_UNDELETE", "GAP_OVERFLOW"}


def change_events(run: Run) -> list[Decoded]:
    return [d for d in run.decoded if d.topic.startswith("/data/")]


def transactions(run: Run) -> Iterator[list[Decoded]]:
    current: list[Decoded] = []
    for d in change_events(run):
        if current and d.header["transactionKey"] != current[0].header["transactionKey"]:
            yield current
            current = []
        current.append(d)
    if current:
        yield current


def of_type(run: Run, *types: str) -> list[Decoded]:
    return [d for d in change_events(run) if d.change_type in types]


def kinds(schema_fields: dict[str, str], name: str) -> str:
    return schema_fields.get(name, "")


# -- determinism ---------------------------------------------------------------------------


def script(workload: Workload) -> list[tuple[str, str, bytes, str]]:
    events = list(workload.events(700))
    events += workload.transaction()
    workload.change_schema("Account")
    events += workload.platform_events(3)
    events += workload.events(400)
    return [(e.topic, e.schema_id, e.payload, e.event_id) for e in events]


def test_same_seed_and_calls_give_byte_identical_events_and_truth() -> None:
    first = Workload(default_catalogue(), seed=11)
    second = Workload(default_catalogue(), seed=11)
    assert script(first) == script(second)
    assert first.truth.to_json() == second.truth.to_json()
    assert list(first.log) == list(second.log)
    assert first.org_id == second.org_id and first.users == second.users
    other = Workload(default_catalogue(), seed=12)
    assert script(other)[0][2:] != script(Workload(default_catalogue(), seed=11))[0][2:]


def test_events_are_whole_transactions_in_commit_order(run: Run) -> None:
    workload = Workload(default_catalogue(), seed=3)
    events = list(workload.events(50))
    assert len(events) >= 50
    log = list(workload.log)
    last_key = log[len(events) - 1].transaction_key
    workload.transaction()
    later = list(workload.log)[len(events) :]
    assert all(c.transaction_key != last_key or not last_key for c in later)
    assert list(Workload(default_catalogue(), seed=3).events(0)) == []
    keys_seen: set[str] = set()
    previous = ("", 0, 0)
    for tx in transactions(run):
        key = tx[0].header["transactionKey"]
        assert key not in keys_seen, "a transaction's events are contiguous"
        keys_seen.add(key)
        stamp = (key, tx[0].header["commitTimestamp"], tx[0].header["commitNumber"])
        assert stamp[1] >= previous[1] and stamp[2] > previous[2]
        previous = stamp


# -- headers ---------------------------------------------------------------------------------


def test_event_ids_are_unique_random_uuids(run: Run) -> None:
    ids = [e.event_id for e in run.events]
    assert len(set(ids)) == len(ids)
    assert all(uuid.UUID(i).version == 4 for i in ids)


def test_transaction_headers(run: Run) -> None:
    gaps_in_sequence = 0
    multi_object = 0
    for tx in transactions(run):
        headers = [d.header for d in tx]
        assert len({h["commitTimestamp"] for h in headers}) == 1
        assert len({h["commitNumber"] for h in headers}) == 1
        assert len({h["commitUser"] for h in headers}) == 1
        assert len({h["changeOrigin"] for h in headers}) == 1
        stamp = headers[0]["commitTimestamp"]
        assert stamp % 1000 == 0 and stamp >= DEFAULT_START_MS
        assert 2**53 < headers[0]["commitNumber"] < 2**63
        sequence = [h["sequenceNumber"] for h in headers]
        assert sequence[0] == 1 and sequence == sorted(set(sequence))
        gaps_in_sequence += sequence != list(range(1, len(sequence) + 1))
        multi_object += len({h["entityName"] for h in headers}) > 1
        user = headers[0]["commitUser"]
        assert is_valid_id(user) and user.startswith("005") and len(user) == 18
        assert ORIGIN.match(headers[0]["changeOrigin"])
        uuid.UUID(headers[0]["transactionKey"])
        for d in tx:
            assert d.topic == f"/data/{d.schema.parsed['name'].rsplit('.', 1)[-1]}"
            assert d.header["entityName"] == run.workload.catalogue.schema(d.schema_id).entity_name
    assert gaps_in_sequence > 10 and multi_object > 10


# -- bodies by change type -------------------------------------------------------------------


def test_create_events_carry_every_field(run: Run) -> None:
    creates = of_type(run, "CREATE")
    person = business = 0
    for d in creates:
        h, body, entity = d.header, d.body, d.header["entityName"]
        assert h["changedFields"] == h["nulledFields"] == h["diffFields"] == []
        assert len(h["recordIds"]) == 1 and h["recordIds"][0].startswith(
            run.workload.catalogue.topic_for_entity(entity) and h["recordIds"][0][:3]
        )
        for name in REQUIRED[entity] + SYSTEM:
            assert body[name] is not None, (entity, name)
        assert body["CreatedDate"] == body["LastModifiedDate"] == h["commitTimestamp"]
        assert body["CreatedById"] == body["LastModifiedById"] == h["commitUser"]
        for value in body.values():
            if isinstance(value, dict):
                assert any(v is not None for v in value.values()), "an empty compound is null"
        if entity == "Account":
            if isinstance(body["Name"], dict):
                person += 1
                assert body["Name"]["LastName"]
                assert body["ParentId"] is None
            else:
                business += 1
                assert isinstance(body["Name"], str) and body["Name"]
                assert all(body[n] is None for n in body if n.startswith("Person"))
    assert person > 20 and business > 20


def test_field_value_forms(run: Run) -> None:
    seen: Counter[str] = Counter()
    for d in of_type(run, "CREATE", "UPDATE", "UNDELETE"):
        schema = run.workload.catalogue.schema(d.schema_id)
        for info in schema.fields[1:]:
            value = d.body.get(info.name)
            if value is None:
                continue
            seen[info.kind] += 1
            if info.kind == "date":
                assert value % DAY_MS == 0, (info.name, value)
            elif info.kind == "datetime":
                assert value % 1000 == 0, (info.name, value)
            elif info.kind == "time":
                assert 0 <= value < DAY_MS
            elif info.kind == "double":
                assert isinstance(value, float)
            elif info.kind == "int":
                assert isinstance(value, int)
            elif info.kind == "id":
                assert is_valid_id(value) and len(value) == 18
            elif info.kind == "multi_picklist":
                assert value and ";;" not in value and not value.startswith(";")
            elif info.kind == "long_text" and info.name not in d.names("diffFields"):
                assert value == value.strip()
    assert {"date", "datetime", "time", "double", "int", "id", "boolean", "compound"} <= set(seen)


def test_update_events_carry_only_changes(run: Run) -> None:
    updates = [d for d in of_type(run, "UPDATE") if not d.header["recordIds"][0].endswith("*")]
    nested_only_parents = 0
    for d in updates:
        changed, nulled, diffed = (
            d.names("changedFields"),
            d.names("nulledFields"),
            d.names("diffFields"),
        )
        assert "LastModifiedDate" in changed
        assert d.body["LastModifiedDate"] == d.header["commitTimestamp"]
        assert nulled <= changed and diffed <= changed
        parents = {n.partition(".")[0] for n in changed if "." in n}
        nested_only_parents += len(parents)
        assert not parents & changed, "a compound's own bit is not set with nested elements"
        for name, value in d.body.items():
            if name in parents:
                for child, child_value in value.items():
                    dotted = f"{name}.{child}"
                    if dotted in nulled or dotted not in changed:
                        assert child_value is None, dotted
                    else:
                        assert child_value is not None, dotted
            elif name in changed and name not in nulled:
                assert value is not None, name
            else:
                assert value is None, (name, value)
    assert nested_only_parents > 50
    assert sum(1 for d in updates if d.header["nulledFields"]) > 50
    assert any("." in n for d in updates for n in d.names("nulledFields"))
    assert any("LastModifiedById" in d.names("changedFields") for d in updates)
    assert any("LastModifiedById" not in d.names("changedFields") for d in updates)


def test_delete_and_gap_events_are_header_only(run: Run) -> None:
    counts: Counter[str] = Counter()
    for d in of_type(run, "DELETE", *GAPS):
        counts[d.change_type] += 1
        h = d.header
        assert h["changedFields"] == h["nulledFields"] == h["diffFields"] == []
        assert all(v is None for v in d.body.values())
        if d.change_type == "GAP_OVERFLOW":
            assert h["recordIds"] == [] and h["entityName"]
        else:
            assert h["recordIds"]
    assert set(counts) == {"DELETE", *GAPS}


def test_undelete_events_carry_the_restored_record(run: Run) -> None:
    undeletes = of_type(run, "UNDELETE")
    assert len(undeletes) > 20
    for d in undeletes:
        entity = d.header["entityName"]
        assert d.header["changedFields"] == []
        for name in REQUIRED[entity] + SYSTEM:
            assert d.body[name] is not None
        assert d.body["LastModifiedDate"] == d.header["commitTimestamp"]
        assert d.body["LastModifiedById"] == d.header["commitUser"]
        assert d.body["CreatedDate"] < d.header["commitTimestamp"]


# -- consistency of the event stream ---------------------------------------------------------


def test_no_event_references_a_record_in_an_impossible_state(run: Run) -> None:
    live: set[str] = set()
    dead: set[str] = set()
    for d in change_events(run):
        kind = d.change_type
        ids = d.header["recordIds"]
        if kind == "GAP_OVERFLOW" or (ids and ids[0].endswith("*")):
            continue
        for rid in ids:
            if kind in ("CREATE", "GAP_CREATE"):
                assert rid not in live and rid not in dead
                live.add(rid)
            elif kind in ("UPDATE", "GAP_UPDATE"):
                assert rid in live, f"{kind} of a record that is not live"
            elif kind in ("DELETE", "GAP_DELETE"):
                assert rid in live, f"{kind} of a record that is not live"
                live.remove(rid)
                dead.add(rid)
            else:
                assert rid in dead, f"{kind} of a record that is not deleted"
                dead.remove(rid)
                live.add(rid)
        if kind in ("CREATE", "UPDATE", "UNDELETE"):
            changed = d.names("changedFields")
            for name, prefix in LOOKUPS[d.header["entityName"]].items():
                target = d.body.get(name)
                if target is not None and (kind != "UPDATE" or name in changed):
                    assert target.startswith(prefix) and target in live, (kind, name, target)


def test_several_records_with_the_same_change_share_one_event(run: Run) -> None:
    multi = Counter(d.change_type for d in change_events(run) if len(d.header["recordIds"]) > 1)
    assert multi["UPDATE"] > 10 and multi["DELETE"] > 10
    assert sum(multi[g] for g in GAPS) > 0
    ids = [rid for d in change_events(run) for rid in d.header["recordIds"]]
    per_event = Counter(ids)
    assert per_event, "sanity"


def test_lead_conversion_links_account_contact_and_opportunity(run: Run) -> None:
    found = 0
    for tx in transactions(run):
        creates = {d.header["entityName"]: d for d in tx if d.change_type == "CREATE"}
        if {"Account", "Contact", "Opportunity"} <= set(creates) and len(tx) == 3:
            account = creates["Account"].header["recordIds"][0]
            contact = creates["Contact"].header["recordIds"][0]
            opportunity = creates["Opportunity"].body
            if opportunity["AccountId"] == account and opportunity["ContactId"] == contact:
                assert creates["Contact"].body["AccountId"] == account
                assert [d.header["entityName"] for d in tx] == ["Account", "Contact", "Opportunity"]
                found += 1
    assert found > 5


def test_deleting_an_account_deletes_its_contacts_and_opportunities(run: Run) -> None:
    replica = Replica()
    cascades = 0
    for tx in transactions(run):
        first = tx[0]
        if (
            first.change_type == "DELETE"
            and first.header["entityName"] == "Account"
            and len(tx) > 1
        ):
            account = first.header["recordIds"][0]
            for d in tx[1:]:
                assert d.change_type == "DELETE"
                assert d.header["entityName"] in ("Contact", "Opportunity")
                for rid in d.header["recordIds"]:
                    entity = d.header["entityName"]
                    if rid not in replica.stale.get(entity, ()):  # gaps hide values
                        assert replica.records[entity][rid]["AccountId"] == account
                        cascades += 1
        for d in tx:
            replica.apply(d)
    assert cascades > 3


def test_gap_and_overflow_events_and_their_resync_expectation(run: Run) -> None:
    truth = run.workload.truth
    gap_ids = {d.event_id: d for d in of_type(run, *(GAPS - {"GAP_OVERFLOW"}))}
    for entity in truth.entities:
        expectation = truth.resync(entity)
        assert expectation.record_ids == frozenset(expectation.gap_event_ids)
        for rid, event_ids in expectation.gap_event_ids.items():
            assert event_ids and all(rid in gap_ids[e].header["recordIds"] for e in event_ids)
    overflows = of_type(run, "GAP_OVERFLOW")
    assert overflows
    log = {c.event_id: c for c in run.log}
    for d in overflows:
        entity = d.header["entityName"]
        expectation = truth.resync(entity)
        assert expectation.full_resync and d.event_id in expectation.overflow_event_ids
        tx = next(t for t in transactions(run) if d in t)
        described = [e for e in tx if e.change_type == "UPDATE"]
        assert described and described[-1].header["sequenceNumber"] < d.header["sequenceNumber"]
        silent = set(log[d.event_id].affected_ids)
        assert silent and not silent & {r for e in described for r in e.header["recordIds"]}
        assert described[0].names("changedFields") - {"LastModifiedDate", "LastModifiedById"}


def test_wildcard_update_nulls_a_custom_field_everywhere(run: Run) -> None:
    wildcards = [d for d in of_type(run, "UPDATE") if d.header["recordIds"][0].endswith("*")]
    assert wildcards
    log = {c.event_id: c for c in run.log}
    for d in wildcards:
        entity = d.header["entityName"]
        prefix = run.workload.catalogue.topic_for_entity(entity) and d.header["recordIds"][0][:-1]
        assert d.header["recordIds"] == [f"{prefix}*"] and len(prefix) == 3
        changed, nulled = d.names("changedFields"), d.names("nulledFields")
        assert changed == nulled and len(changed) == 1
        assert next(iter(changed)).endswith("__c")
        assert all(v is None for v in d.body.values())
        assert all(rid.startswith(prefix) for rid in log[d.event_id].affected_ids)


# -- schema change ---------------------------------------------------------------------------


def test_schema_change_mid_stream(run: Run) -> None:
    before = [d for d in run.decoded[: run.first_v2] if d.header.get("entityName") == "Account"]
    after = [d for d in run.decoded[run.first_v2 :] if d.header.get("entityName") == "Account"]
    assert before and after
    assert {d.schema_id for d in before} == {run.account_v1}
    assert {d.schema_id for d in after} == {run.account_v2}
    topic = run.workload.catalogue.topic("/data/AccountChangeEvent")
    assert [s.schema_id for s in topic.schemas] == [run.account_v1, run.account_v2]
    # Decoded with their own schema, bits name the right fields; read with the old field list,
    # a v2 bitmap names the field one position earlier.
    v1_fields = [f.name for f in schema_versions("Account")[0].fields]
    shifted = 0
    for d in after:
        if d.change_type != "UPDATE" or d.header["recordIds"][0].endswith("*"):
            continue
        names = d.names("changedFields")
        assert "LastModifiedDate" in names
        top = int(d.header["changedFields"][0][2:], 16)
        misread = {
            v1_fields[i] if i < len(v1_fields) else "?"
            for i in range(top.bit_length())
            if top >> i & 1
        }
        shifted += misread != {n for n in names if "." not in n}
    assert shifted > 10
    assert any(d.body.get("RecordTypeId") for d in after if d.change_type == "CREATE")
    truth = run.workload.truth
    assert truth.fields("Account")[:5] == (
        "Name",
        "Type",
        "RecordTypeId",
        "ParentId",
        "BillingAddress",
    )
    assert "Tier__c" in truth.fields("Account")
    assert all("RecordTypeId" in r for r in truth.records("Account").values())


def test_change_schema_errors() -> None:
    workload = Workload(default_catalogue(), seed=1)
    workload.change_schema("Account")
    with pytest.raises(ValueError, match="already uses the last shipped schema"):
        workload.change_schema("Account")
    with pytest.raises(KeyError, match="no topic for 'Lead'"):
        workload.change_schema("Lead")


# -- platform events -------------------------------------------------------------------------


def test_platform_events(run: Run) -> None:
    events = [d for d in run.decoded if d.topic == "/event/Order_Shipped__e"]
    assert len(events) > 100
    schema = run.workload.catalogue.topic("/event/Order_Shipped__e").current_schema
    assert schema is not None
    accounts = set(run.workload.truth.records("Account"))
    for d in events:
        assert d.schema_id == schema.schema_id == schema.raw["uuid"]
        assert d.header == {}
        assert isinstance(d.body["CreatedDate"], int) and d.body["CreatedDate"] >= DEFAULT_START_MS
        assert d.body["CreatedById"] in run.workload.users
        if d.body["Account_Id__c"] is not None:
            assert d.body["Account_Id__c"] in accounts
    assert sum(1 for d in events if d.body["Order_Number__c"] is None) < len(events) / 3
    assert all(c.change_type == "PLATFORM_EVENT" for c in run.log if c.topic.startswith("/event/"))


# -- long text diffs -------------------------------------------------------------------------


def test_long_text_edits_are_sent_as_diffs_when_the_rules_allow(run: Run) -> None:
    replica = Replica()
    full_long_updates = 0
    for d in change_events(run):
        if d.change_type == "UPDATE":
            diffed = d.names("diffFields")
            for name in d.names("changedFields") - diffed - d.names("nulledFields"):
                value = d.body.get(name)
                full_long_updates += isinstance(value, str) and len(value) >= 1000
        replica.apply(d)
    assert replica.diffs_applied > 50
    assert replica.newlines_seen == {"\n", "\r\n"}
    assert full_long_updates > 10


# -- inputs ----------------------------------------------------------------------------------


def test_bad_arguments_are_rejected_with_reasons() -> None:
    catalogue = default_catalogue()
    with pytest.raises(TypeError, match="seed must be an int"):
        Workload(catalogue, seed="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"whole seconds.*remainder 1 ms"):
        Workload(catalogue, seed=1, start_ms=1_000_001)
    with pytest.raises(ValueError, match="org_id must start with the org key prefix 00D"):
        Workload(catalogue, seed=1, org_id="001A0000006Vm9r")
    with pytest.raises(ValueError, match="org_id must be a 15- or 18-char org id"):
        Workload(catalogue, seed=1, org_id="00D")
    assert Workload(catalogue, seed=1, org_id="00D000000000062").org_id == "00D000000000062EAA"
    with pytest.raises(ValueError, match=r"names \['Lead'\]"):
        Workload(catalogue, seed=1, mix=WorkloadMix(entity_weights={"Lead": 1.0}))
    with pytest.raises(ValueError, match="weight update must be a finite number >= 0"):
        WorkloadMix(update=-1)
    with pytest.raises(ValueError, match="needs a positive weight"):
        WorkloadMix(**dict.fromkeys(WorkloadMix().weights(), 0.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"crlf_ratio must be a number in \[0, 1\]"):
        WorkloadMix(crlf_ratio=2)
    with pytest.raises(ValueError, match="max_batch"):
        WorkloadMix(max_batch=1)
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        Workload(catalogue, seed=1).events(-1)
    with pytest.raises(TypeError, match="catalogue must be a Catalogue"):
        Workload({}, seed=1)  # type: ignore[arg-type]


def test_a_catalogue_with_one_object_only() -> None:
    account = schema_versions("Account")[0]
    catalogue = Catalogue.of([topic_for_schema(account)])
    workload = Workload(catalogue, seed=5)
    events = list(workload.events(300))
    assert {e.topic for e in events} == {"/data/AccountChangeEvent"}
    assert workload.truth.entities == ("Account",)
    with pytest.raises(ValueError, match="no platform event topic"):
        workload.platform_events(1)
    only_events = Workload(default_catalogue(), seed=5, mix=WorkloadMix(**{
        **dict.fromkeys(WorkloadMix().weights(), 0.0), "platform_event": 1.0,
    }))  # fmt: skip
    assert {e.topic for e in only_events.events(20)} == {"/event/Order_Shipped__e"}


def test_the_mix_can_change_between_transactions() -> None:
    none = dict.fromkeys(WorkloadMix().weights(), 0.0)
    workload = Workload(default_catalogue(), seed=9, mix=WorkloadMix(**{**none, "create": 1.0}))
    list(workload.events(200))
    assert {c.change_type for c in workload.log} == {"CREATE"}
    population = {e: len(workload.truth.records(e)) for e in workload.truth.entities}
    workload.mix = WorkloadMix(**{**none, "update": 1.0, "entity_weights": {"Contact": 1.0}})
    list(workload.events(200))
    later = workload.log[200:]
    assert len(later) == 200 and {c.change_type for c in later} == {"UPDATE"}
    assert {c.entity for c in later} == {"Contact"}
    assert {e: len(workload.truth.records(e)) for e in workload.truth.entities} == population
    with pytest.raises(TypeError, match="mix must be a WorkloadMix"):
        workload.mix = {"update": 1.0}  # type: ignore[assignment]


def _population(workload: Workload) -> tuple[set[str], set[str]]:
    """(every record the ground truth knows, the live ones)."""
    entities = workload.truth.entities
    known = {r for e in entities for r in workload.truth.records(e)}
    return known, {r for e in entities for r in workload.truth.live(e)}


@pytest.mark.parametrize("hold", [True, False])
def test_live_share_holds_the_population_a_delete_heavy_mix_would_drain(hold: bool) -> None:
    none = dict.fromkeys(WorkloadMix().weights(), 0.0)
    workload = Workload(default_catalogue(), seed=21, mix=WorkloadMix(**{**none, "create": 1.0}))
    list(workload.events(300))
    created, _ = _population(workload)
    churn = {"update": 4.0, "delete": 6.0, "mass_delete": 3.0, "undelete": 1.0, "gap": 2.0}
    workload.mix = WorkloadMix(**{**none, **churn, "live_share": 0.8 if hold else 0.0})
    first = len(workload.log)
    list(workload.events(6000))
    later = workload.log[first:]
    known, live = _population(workload)
    kinds = Counter(c.change_type for c in later)
    if hold:
        # Nothing is created; deletes go on while undeletes keep four in five records live.
        assert known == created
        assert not kinds.keys() & {"CREATE", "GAP_CREATE"}
        assert kinds["DELETE"] > 100 and kinds["UNDELETE"] > 100
        # One mass delete (with its cascades) may take the share below the mark at the end.
        assert len(live) >= 0.7 * len(known)
    else:
        # The same churn without the hold: deletes drain the live records and the creates
        # that stand in for the changes that no longer fit grow the population.
        assert len(live) < 0.5 * len(created) or len(known) > 1.2 * len(created)
        assert kinds["CREATE"] > 0


DIGEST = """
import hashlib, sys
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.workload import Workload
w = Workload(default_catalogue(), seed=8)
h = hashlib.sha256()
for e in w.events(1500):
    h.update(e.schema_id.encode() + e.payload + e.event_id.encode())
h.update(w.truth.to_json().encode())
print(h.hexdigest())
"""


def test_identical_across_processes_and_hash_seeds() -> None:
    # Nothing may depend on set or dict-of-str iteration order (salted per process).
    root = str(Path(__file__).resolve().parents[3])
    digests = set()
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": root}
        done = subprocess.run(
            [sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, check=True
        )
        digests.add(done.stdout.strip())
    assert len(digests) == 1
