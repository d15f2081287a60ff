"""The client against the emulator serving the realistic generated workload: a schema change
mid-stream (AccountChangeEvent v2 inserts RecordTypeId, shifting every later field) decoded
with each event's own schema, on the object's topic and on /data/ChangeEvents."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ingest.auth import Secret, StaticToken, TokenManager
from ingest.client.channel import TlsSettings, connect
from ingest.client.multi import MultiSubscription
from ingest.client.schemas import SchemaCache
from ingest.client.stream import EventBatch
from ingest.client.subscriber import Subscription
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload
from ingest.replay import Earliest

pytestmark = pytest.mark.integration

ACCOUNT = "/data/AccountChangeEvent"
CHANNEL = "/data/ChangeEvents"


@pytest.fixture
def setup() -> Iterator[tuple[Emulator, Workload]]:
    catalogue = default_catalogue()
    workload = Workload(catalogue, seed=7)
    emulator = Emulator(catalogue, EmulatorConfig(keepalive_interval=0.2)).start()
    yield emulator, workload
    emulator.close()


def test_schema_change_mid_stream_is_decoded_with_each_events_own_schema(
    setup: tuple[Emulator, Workload],
) -> None:
    emulator, workload = setup
    tokens = TokenManager(
        StaticToken(
            Secret(emulator.issue_token().access_token),
            instance_url=emulator.instance_url,
            tenant_id=emulator.org_id,
        )
    )
    channel = connect(emulator.grpc_target, tokens=tokens, tls=TlsSettings(enabled=False))
    cache = SchemaCache(channel)
    decoders = cache.decoders()
    v1 = cache.current_schema(ACCOUNT)
    emulator.append(workload.events(300))
    subs = [
        Subscription(channel, topic, start=Earliest(), tokens=tokens)
        for topic in (ACCOUNT, CHANNEL)
    ]
    decoded: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {ACCOUNT: [], CHANNEL: []}
    changed = False
    with MultiSubscription(subs) as multi:
        for item in multi:
            if not isinstance(item, EventBatch):
                continue
            for e in item.events:
                event = decoders.decoder(e.schema_id).decode_event(e.payload)
                decoded[item.topic].append((e.event_id, e.schema_id, event.changed))
            if not changed and len(decoded[ACCOUNT]) >= 20:
                v2 = workload.change_schema("Account")  # while both streams are open
                emulator.append(workload.events(300))
                changed = True
            if changed and all(len(decoded[t]) >= len(emulator.log(t)) for t in (ACCOUNT, CHANNEL)):
                break
    assert v2.schema_id != v1.schema_id
    assert cache.topic_info(ACCOUNT, refresh=True).schema_id == v2.schema_id
    by_event = {g.event_id: g for g in workload.log}
    for topic in (ACCOUNT, CHANNEL):
        assert [eid for eid, _, _ in decoded[topic]] == [e.event_id for e in emulator.log(topic)]
        for event_id, schema_id, changed_fields in decoded[topic]:
            truth = by_event[event_id]
            assert schema_id == truth.schema_id
            assert changed_fields == truth.changed  # bitmaps read with the right schema
    account_ids = [sid for _, sid, _ in decoded[ACCOUNT]]
    assert v1.schema_id in account_ids and v2.schema_id in account_ids
    # the channel carries several objects, each with its own schema
    assert len({sid for _, sid, _ in decoded[CHANNEL]}) >= 3
    # one GetSchema per schema id, however many events
    assert cache.get_schema_calls == len({sid for _, sid, _ in decoded[CHANNEL]} | {v1.schema_id})
    channel.close()
