"""The commit time read from a payload: a change event's header, a platform event's
CreatedDate, as the emulator's workload stamped them."""

from __future__ import annotations

import json

from ingest.decoding import event_time_ms
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.workload import DEFAULT_START_MS, Workload
from ingest.schema import parse_event_schema
from tests.unit.decoding.support import header


def test_change_events_and_platform_events_give_the_time_the_workload_stamped() -> None:
    stamps = iter(range(DEFAULT_START_MS + 5_001, DEFAULT_START_MS + 10_000_000, 13))
    catalogue = default_catalogue()
    workload = Workload(catalogue, seed=11, clock_ms=lambda: next(stamps))
    schemas = catalogue.schemas
    events = list(workload.events(60)) + workload.platform_events(5)
    expected = [change.commit_timestamp for change in workload.log]
    got = [event_time_ms(schemas[e.schema_id], e.payload) for e in events]
    assert got == expected
    assert any(g is not None and g % 1000 for g in got), "millisecond stamps expected"


def test_a_schema_without_a_commit_time_or_a_payload_of_another_schema_gives_none() -> None:
    plain = parse_event_schema(
        '{"type": "record", "name": "Plain__e", "fields": [{"name": "Note__c", "type": "string"}]}'
    )
    assert event_time_ms(plain, b"\x02a") is None
    change = parse_event_schema(
        '{"type": "record", "name": "WidgetChangeEvent", "namespace": "com.sforce.eventbus", '
        f'"fields": [{json.dumps(header())}]}}'
    )
    assert event_time_ms(change, b"\xff\xff") is None
