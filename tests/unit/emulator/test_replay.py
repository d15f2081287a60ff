"""Folding the decoded events in order reproduces the ground truth, cell for cell, except the
records the truth lists for re-sync (what a correct gold table must do)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.truth import GroundTruth
from ingest.emulator.workload import Workload, WorkloadMix
from tests.unit.emulator.conftest import Run
from tests.unit.emulator.reference import Decoded, Replica, decode, raw_schemas


def fold(decoded: list[Decoded]) -> Replica:
    replica = Replica()
    for d in decoded:
        if d.topic.startswith("/data/"):
            replica.apply(d)
    return replica


def compare(replica: Replica, truth: GroundTruth) -> dict[str, int]:
    """Assert the replica equals the truth outside the re-sync sets; return checked counts."""
    checked: dict[str, int] = {}
    assert all(stale for _, _, stale in replica.diff_failures), replica.diff_failures
    for entity in truth.entities:
        expectation = truth.resync(entity)
        unknowable = expectation.unknowable
        fields = truth.fields(entity)
        records = truth.records(entity)
        mine = replica.records.get(entity, {})
        assert set(mine) <= set(records), "the replica invented records"
        deleted = truth.deleted(entity)
        count = 0
        for record_id, values in records.items():
            if record_id in unknowable:
                continue
            assert record_id in mine, f"{entity} {record_id} missing from the replica"
            got: dict[str, Any] = {name: mine[record_id].get(name) for name in fields}
            assert got == dict(values), f"{entity} {record_id} differs"
            assert (record_id in replica.deleted.get(entity, set())) == (record_id in deleted)
            count += 1
        checked[entity] = count
    return checked


def test_replay_reproduces_the_truth(run: Run) -> None:
    replica = fold(run.decoded)
    checked = compare(replica, run.workload.truth)
    truth = run.workload.truth
    total = sum(len(truth.records(e)) for e in truth.entities)
    unknowable = sum(len(truth.resync(e).unknowable) for e in truth.entities)
    assert sum(checked.values()) == total - unknowable
    assert unknowable > 0 and sum(checked.values()) > total / 2
    assert replica.diffs_applied > 50


def generate(seed: int, mix: WorkloadMix, count: int, *, change_at: int | None) -> Workload:
    workload = Workload(default_catalogue(), seed=seed, mix=mix)
    events = list(workload.events(change_at or count))
    if change_at is not None:
        workload.change_schema("Account")
        events += workload.events(count - change_at)
    return workload


@pytest.mark.parametrize(
    "mix",
    [
        WorkloadMix(),
        WorkloadMix(person_account_ratio=0.9, crlf_ratio=1.0, long_text_edit_ratio=0.6),
        WorkloadMix(gap=10, overflow=2, wildcard=2, delete=10, undelete=10, mass_delete=5),
    ],
    ids=["default", "people-crlf-text", "gaps-and-recycling"],
)
def test_replay_over_different_mixes(mix: WorkloadMix) -> None:
    workload = Workload(default_catalogue(), seed=99, mix=mix)
    events = list(workload.events(1200))
    workload.change_schema("Account")
    events += workload.events(1200)
    schemas = raw_schemas(workload.catalogue)
    truth = workload.truth
    checked = compare(fold([decode(e, schemas) for e in events]), truth)
    assert all(checked.values())
    if mix == WorkloadMix():
        unknowable = sum(len(truth.resync(e).unknowable) for e in truth.entities)
        assert unknowable < sum(checked.values()) / 10, "with default weights gaps are rare"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    gap=st.floats(0, 5),
    overflow=st.floats(0, 1),
    undelete=st.floats(0, 6),
    fill=st.floats(0, 1),
    change=st.booleans(),
)
def test_replay_property(
    seed: int, gap: float, overflow: float, undelete: float, fill: float, change: bool
) -> None:
    mix = WorkloadMix(gap=gap, overflow=overflow, undelete=undelete, fill_ratio=fill)
    workload = Workload(default_catalogue(), seed=seed, mix=mix)
    events = list(workload.events(250))
    if change:
        workload.change_schema("Account")
    events += workload.events(250)
    schemas = raw_schemas(workload.catalogue)
    compare(fold([decode(e, schemas) for e in events]), workload.truth)
