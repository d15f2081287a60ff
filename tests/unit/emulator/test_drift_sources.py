"""What a replica built from change events alone cannot see, as the emulator serves it: each
record's ``SystemModstamp`` (the commit time of its last save, served by REST and Bulk, not in
change events), records emptied from the Recycle Bin (gone, no event), and events lost before
they were stored (the change happened, nobody receives it)."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.routes import HttpRequest
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.truth import GroundTruth
from ingest.emulator.truthlog import TruthJournal
from ingest.emulator.workload import Workload, WorkloadMix

MIX = WorkloadMix(platform_event=0.0, gap=1.0, overflow=0.5, wildcard=0.3)


def _workload(events: int = 500, seed: int = 3) -> Workload:
    workload = Workload(default_catalogue(), seed=seed, mix=MIX)
    list(workload.events(events))
    return workload


def test_modstamp_is_the_commit_time_of_each_records_last_save() -> None:
    workload = _workload()
    truth = workload.truth
    last: dict[tuple[str, str], int] = {}
    for change in workload.log:
        if change.change_type == "UPDATE" and change.record_ids[:1] and "*" in change.record_ids[0]:
            continue  # a wildcard is a metadata operation, not a save
        for record_id in (*change.record_ids, *change.affected_ids):
            last[(change.entity, record_id)] = change.commit_timestamp
    checked = 0
    for entity in truth.entities:
        stamps = truth.modstamps(entity)
        assert set(stamps) == set(truth.records(entity)), entity
        for record_id, stamp in stamps.items():
            assert stamp == last[(entity, record_id)], (entity, record_id)
            checked += 1
    assert checked > 100


def test_emptying_the_recycle_bin_forgets_records_and_survives_a_journal(tmp_path: Path) -> None:
    workload = _workload()
    truth = workload.truth
    entity = "Contact"
    deleted = truth.deleted(entity)
    purged = workload.empty_recycle_bin(entity, 4)
    assert purged and set(purged) <= deleted
    assert truth.purged(entity) == frozenset(purged)
    for record_id in purged:
        assert record_id not in truth.records(entity)
        assert record_id not in truth.modstamps(entity)
    # Every way the truth is kept gives the same truth back.
    assert GroundTruth.from_json(truth.to_json()) == truth
    replayed = GroundTruth(org_id=truth.org_id)
    replayed.apply_changes(truth.all_changes())
    assert replayed == truth
    journal = TruthJournal(tmp_path)
    journal.start(truth)
    list(workload.events(50))
    more = workload.empty_recycle_bin("Account", 2)
    journal.record(truth)
    journal.close()
    loaded = TruthJournal(tmp_path).load()
    assert loaded is not None
    assert loaded == truth
    assert loaded.purged("Account") == frozenset(more)
    # A record not in the recycle bin cannot be emptied from it.
    live = next(iter(truth.live(entity)))
    try:
        truth.hard_delete(entity, live)
    except ValueError as exc:
        assert "not in the recycle bin" in str(exc)
    else:
        raise AssertionError("a live record was hard-deleted")


def test_lost_events_are_never_stored_but_the_truth_has_them() -> None:
    catalogue = default_catalogue()
    workload = Workload(catalogue, seed=9, mix=WorkloadMix(platform_event=0.0))
    with Emulator(catalogue, EmulatorConfig()) as emu:
        emu.serve_records(workload.truth)
        emu.append(list(workload.events(20)))
        emu.faults.lose_events(3, topic="/data/ContactChangeEvent")
        batch = list(workload.events(60))
        contact = [e for e in batch if e.topic == "/data/ContactChangeEvent"]
        assert len(contact) > 3
        stored = emu.append(batch)
        assert len(stored) == len(batch) - 3
        assert emu.faults.lost_event_ids == [e.event_id for e in contact[:3]]
        logged = {e.event_id for e in emu.log("/data/ContactChangeEvent")}
        assert logged.isdisjoint(emu.faults.lost_event_ids)
        assert {e.event_id for e in contact[3:]} <= logged
        # The fault is used up: the next events are stored.
        later = list(workload.events(5))
        assert len(emu.append(later)) == len(later)


def test_rest_and_bulk_serve_system_modstamp_and_hide_purged_records() -> None:
    catalogue = default_catalogue()
    workload = Workload(catalogue, seed=5, mix=WorkloadMix(platform_event=0.0))
    with Emulator(catalogue, EmulatorConfig()) as emu:
        emu.serve_records(workload.truth)
        emu.append(list(workload.events(400)))
        truth = workload.truth
        purged = workload.empty_recycle_bin("Account", 2)
        assert purged
        soql = "SELECT Id, SystemModstamp, IsDeleted FROM Account"
        answer = emu.rest.get(
            "/services/data/v62.0/queryAll", {"q": soql}, {"sforce-query-options": "batchSize=2000"}
        )
        assert answer.status == 200, answer.body
        rest = {r["Id"]: r for r in answer.body["records"]}
        assert set(rest) == set(truth.records("Account"))
        assert not set(purged) & set(rest)
        stamps = truth.modstamps("Account")
        record_id, record = next(iter(rest.items()))
        assert record["SystemModstamp"].endswith("+0000")
        assert record["IsDeleted"] == (record_id in truth.deleted("Account"))

        auth = {"authorization": f"Bearer {emu.issue_token().access_token}"}
        jobs = "/services/data/v62.0/jobs/query"
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
        assert results is not None and results.status == 200
        rows = list(csv.DictReader(io.StringIO(results.body)))
        assert {r["Id"] for r in rows} == set(rest)
        for row in rows:
            stamp = stamps[row["Id"]]
            # Bulk writes ...Z, REST ...+0000: the same instant.
            assert row["SystemModstamp"][:23] == rest[row["Id"]]["SystemModstamp"][:23]
            assert row["SystemModstamp"].endswith("Z") and stamp > 0
