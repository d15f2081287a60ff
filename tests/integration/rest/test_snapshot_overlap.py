"""A bootstrap while the org keeps changing: events committed after the recorded stream
position but before the snapshot is read are reflected in the snapshot and delivered again by
the stream; they apply on top of it without harm, events after the read apply as usual, and
gold ends equal to the ground truth."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.auth import ClientCredentials, Secret, TokenManager
from ingest.bulk import BulkQueryClient
from ingest.client import SchemaCache, TlsSettings
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from ingest.rest import RestClient
from pipelines.bootstrap import bootstrap_object, resync_objects
from pipelines.bronze import BronzeLanding
from pipelines.commands.ingest import select_topics
from pipelines.connect import connect, secret_resolver
from pipelines.engines import LakeEngine, TableRef
from pipelines.gold.job import run_gold
from pipelines.session import engine_for
from pipelines.silver.job import run_silver
from pipelines.snapshot_read import BulkRecords, SnapshotSource
from pipelines.spec import Conf, load_conf
from tests.integration.rest.oracle import assert_gold_equals_truth, write_conf

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TOLERATED = frozenset({"diff_failed", "diff_missing_base", "update_of_deleted"})
MIX = WorkloadMix(
    platform_event=0.0, gap=0.0, overflow=0.0, wildcard=0.0, entity_weights={"Account": 1.0}
)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(default_catalogue(), EmulatorConfig(keepalive_interval=0.2)) as running:
        running.rest.page_size = 25
        yield running


def _tokens(emulator: Emulator) -> TokenManager:
    return TokenManager(
        ClientCredentials(
            emulator.http_url,
            client_id=DEFAULT_CLIENT.client_id,
            client_secret=Secret(DEFAULT_CLIENT.client_secret),
        )
    )


def _land(engine: LakeEngine, conf: Conf, source: object) -> None:
    landing = BronzeLanding(
        engine,
        select_topics(conf, ["Account"]),
        channel=source.channel,  # type: ignore[attr-defined]
        tokens=source.tokens,  # type: ignore[attr-defined]
        ingest=conf.pipeline.ingest,
    )
    landing.run(once=True)


def test_changes_during_the_snapshot_are_not_missed(
    lake_kind: str, emulator: Emulator, tmp_path: Path
) -> None:
    _snapshot_while_the_org_changes(lake_kind, "rest", emulator, tmp_path)


def test_changes_during_a_bulk_api_snapshot_are_not_missed(
    emulator: Emulator, tmp_path: Path
) -> None:
    # The same hand-off when a Bulk API 2.0 job reads the snapshot (local engine suffices).
    emulator.bulk.settings.max_records = 40
    _snapshot_while_the_org_changes("local", "bulk", emulator, tmp_path)
    assert emulator.bulk.result_sets > 1


def _snapshot_while_the_org_changes(
    lake_kind: str, api: str, emulator: Emulator, tmp_path: Path
) -> None:
    workload = Workload(emulator.catalogue, seed=5, mix=MIX)
    emulator.rest.attach(workload.truth)
    # Part of the history is landed before the bootstrap (at or before the position).
    emulator.append(list(workload.events(300)))
    conf = load_conf(
        write_conf(tmp_path, emulator, {"account": "Account"}, start="earliest", engine=lake_kind)
    )
    engine = engine_for(conf.pipeline.lake)
    during: list[int] = []

    def land_then_keep_changing() -> None:
        _land(engine, conf, source)
        # Committed after the recorded position, before the snapshot is read.
        during.append(len(emulator.append(list(workload.events(200)))))

    with connect(
        conf.pipeline.connection, secrets=secret_resolver(), topics=conf.topics()
    ) as source:
        rest = RestClient(source.tokens, tls=TlsSettings(enabled=False))
        with rest:
            bulk = BulkRecords(
                BulkQueryClient(rest, poll_initial_seconds=0.01, poll_max_seconds=0.05),
                describe=rest.describe,
            )
            result = bootstrap_object(
                engine,
                conf,
                "Account",
                rest=SnapshotSource(rest, bulk=bulk, api="bulk" if api == "bulk" else "rest"),
                land=land_then_keep_changing,
                fetch_schema=SchemaCache(source.channel, tokens=source.tokens).current_schema,
            )
        assert during and during[0] > 0
        assert result.full and result.read == len(workload.truth.records("Account"))
        assert result.api == api
        assert result.position is not None
        assert result.position.startswith("/data/AccountChangeEvent batch ")
        # After the snapshot, the org changes again; the stream continues from the position.
        emulator.append(list(workload.events(200)))
        _land(engine, conf, source)
    run_silver(engine, conf)
    outcome = run_gold(engine, conf)
    (account,) = outcome.objects
    # The 200 changes made during the snapshot came again through the stream and applied.
    assert account.applied >= 200, account
    # Every value is right. Changes delivered again on top of a snapshot that already holds
    # them may flag their record: a diff that no longer applies, an update of a record the
    # snapshot saw deleted. Gold cannot vouch for those, so it says so.
    print(assert_gold_equals_truth(engine, conf, workload.truth, tolerated=TOLERATED))
    rows = engine.read_arrow(TableRef("gold", "account")).to_pylist()
    assert any(r["_cdc_last_change_type"] == "SNAPSHOT" for r in rows)
    flagged = {r["Id"] for r in rows if r["_cdc_needs_resync"]}

    # A re-sync of just those records clears them.
    with RestClient(_tokens(emulator), tls=TlsSettings(enabled=False)) as rest:
        results = resync_objects(engine, conf, ["Account"], rest=rest)
    if flagged:
        (resync,) = results
        assert not resync.full and resync.requested == len(flagged)
    print(assert_gold_equals_truth(engine, conf, workload.truth))
