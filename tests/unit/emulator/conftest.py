"""One generated org shared by the emulator tests (generating it takes about a second).

The mix boosts the rare transaction kinds (gaps, overflows, wildcard updates) so that a few
thousand events cover every change type; Account switches to its second schema half-way.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.topics import EmittedEvent
from ingest.emulator.workload import GeneratedChange, Workload, WorkloadMix
from tests.unit.emulator.reference import Decoded, decode, raw_schemas

SEED = 20_240_601
EVENTS_PER_HALF = 3000
RARE_KINDS = WorkloadMix(gap=4.0, overflow=0.6, wildcard=0.4, undelete=4.0, mass_delete=2.0)


@dataclass
class Run:
    workload: Workload
    events: list[EmittedEvent]
    decoded: list[Decoded]
    log: list[GeneratedChange]
    first_v2: int  # index of the first event generated after the Account schema change
    account_v1: str
    account_v2: str


@pytest.fixture(scope="session")
def run() -> Run:
    workload = Workload(default_catalogue(), seed=SEED, mix=RARE_KINDS)
    account_v1 = workload.catalogue.topic("/data/AccountChangeEvent").schemas[-1].schema_id
    events = list(workload.events(EVENTS_PER_HALF))
    first_v2 = len(events)
    account_v2 = workload.change_schema("Account").schema_id
    events += workload.events(EVENTS_PER_HALF)
    events += workload.platform_events(7)
    schemas = raw_schemas(workload.catalogue)
    decoded = [decode(e, schemas) for e in events]
    return Run(workload, events, decoded, list(workload.log), first_v2, account_v1, account_v2)
