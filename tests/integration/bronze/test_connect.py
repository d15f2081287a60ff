"""Connecting from the spec to real emulators: external (TLS, OAuth login) and in-process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.auth import StaticSecrets
from ingest.client import SchemaCache
from ingest.emulator.server import Emulator
from ingest.errors import AuthError
from pipelines.connect import connect, secret_resolver
from pipelines.spec import (
    BatchingSpec,
    ConnectionSpec,
    EmulatorSpec,
    EmulatorTls,
    EmulatorWorkload,
    EnvRef,
    ReplaySpec,
    TopicSpec,
    load_conf,
)
from tests.integration.bronze.conftest import ORDERS, write_conf

pytestmark = pytest.mark.integration


def test_external_emulator_over_tls_with_an_oauth_login(
    make_emulator: Callable[..., Emulator], tmp_path: Path
) -> None:
    emulator = make_emulator(tls=True)
    conf = load_conf(write_conf(tmp_path, emulator))
    with connect(conf.pipeline.connection, secrets=secret_resolver()) as source:
        assert source.endpoint == f"127.0.0.1:{emulator.grpc_port}"
        info = SchemaCache(source.channel, tokens=source.tokens).topic_info(ORDERS)
        assert info.schema_id == emulator.catalogue.topic(ORDERS).current_schema.schema_id  # type: ignore[union-attr]
        assert source.tokens.refreshes == 1
        assert source.emulator is None


def test_a_wrong_client_secret_is_an_auth_error(emulator: Emulator) -> None:
    spec = ConnectionSpec(
        emulator=EmulatorSpec(
            mode="external",
            grpc_port=emulator.grpc_port,
            http_port=emulator.http_port,
            client_secret=EnvRef("EMU_SECRET"),
        )
    )
    with (
        connect(spec, secrets=StaticSecrets({"EMU_SECRET": "not-it"})) as source,
        pytest.raises(AuthError, match="invalid_client"),
    ):
        source.tokens.current()


def _topic(topic: str, managed: str | None = None) -> TopicSpec:
    return TopicSpec(
        topic, "platform_event", "t", ReplaySpec(), BatchingSpec(), (), managed_subscription=managed
    )


def test_in_process_emulator_generates_its_workload_once(tmp_path: Path) -> None:
    spec = ConnectionSpec(
        emulator=EmulatorSpec(
            state_dir=str(tmp_path / "state"),
            keepalive_seconds=0.2,
            tls=EmulatorTls(enabled=True),
            workload=EmulatorWorkload(events=60, platform_events=10),
        )
    )
    topics = [_topic("/event/Order_Shipped__e", managed="Orders_Bronze")]
    with connect(spec, secrets=secret_resolver(), topics=topics) as source:
        emulator = source.emulator
        assert emulator is not None and emulator.running and emulator.ca_cert_path is not None
        held = {t.name: len(emulator.log(t.name)) for t in emulator.catalogue}
        assert held["/event/Order_Shipped__e"] >= 10
        assert sum(n for name, n in held.items() if name != "/data/ChangeEvents") >= 70
        assert emulator.managed.by_name("Orders_Bronze") is not None
        SchemaCache(source.channel, tokens=source.tokens).topic_info("/data/AccountChangeEvent")
    assert not emulator.running
    # A second start serves the journaled log instead of generating again.
    with connect(spec, secrets=secret_resolver(), topics=topics) as again:
        assert again.emulator is not None
        assert {t.name: len(again.emulator.log(t.name)) for t in again.emulator.catalogue} == held


def test_in_process_emulator_paces_a_workload_with_a_rate(tmp_path: Path) -> None:
    spec = ConnectionSpec(
        emulator=EmulatorSpec(
            workload=EmulatorWorkload(events=5000, platform_events=0, events_per_second=500)
        )
    )
    with connect(spec, secrets=secret_resolver()) as source:
        assert source.emulator is not None
        total = sum(len(source.emulator.log(t.name)) for t in source.emulator.catalogue)
        assert total < 5000  # still generating in the background
    # Closing stopped the generator along with the emulator.
