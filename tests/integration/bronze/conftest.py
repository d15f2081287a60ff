"""Bronze landing against the emulator on a loopback socket, into real Delta tables.

The emulator runs in the test process; landing reaches it as an *external* emulator, through
the YAML spec (``connection.emulator.mode: external``), logging in at its OAuth endpoint.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ingest.emulator.managed import ManagedSubscriptionConfig
from ingest.emulator.server import Emulator, EmulatorConfig
from pipelines.bronze import bronze_tables
from pipelines.engines import LocalEngine, TableRef
from pipelines.spec import Conf, load_conf
from tests.integration.client.conftest import ACCOUNT, CHANNEL, CONTACT, TOPIC, make_catalogue

ORDERS = TOPIC
MANAGED = "Orders_Bronze"
ACCOUNT_OBJECT = "object: Account\nkind: change_events\n"
CONTACT_ON_CHANNEL = "object: Contact\nkind: change_events\ntopic: /data/ChangeEvents\n"
ORDER_OBJECT = "object: Order_Shipped__e\nkind: platform_event\n"
OBJECTS = {"account": ACCOUNT_OBJECT, "contact": CONTACT_ON_CHANNEL, "order": ORDER_OBJECT}

__all__ = [
    "ACCOUNT",
    "CHANNEL",
    "CONTACT",
    "MANAGED",
    "OBJECTS",
    "ORDERS",
    "checkpoint_rows",
    "expected",
    "landed",
    "wait_for",
    "write_conf",
]


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., Emulator]]:
    started: list[Emulator] = []

    def make(**overrides: Any) -> Emulator:
        settings: dict[str, Any] = {
            "keepalive_interval": 0.2,
            "idle_timeout": 10.0,
            "managed_subscriptions": (
                ManagedSubscriptionConfig(MANAGED, ORDERS, default_replay="EARLIEST"),
            ),
            **overrides,
        }
        emulator = Emulator(make_catalogue(), EmulatorConfig(**settings))
        emulator.start()
        started.append(emulator)
        return emulator

    yield make
    for emulator in started:
        emulator.close()


@pytest.fixture
def emulator(make_emulator: Callable[..., Emulator]) -> Emulator:
    return make_emulator()


def write_conf(
    root: Path,
    emulator: Emulator,
    *,
    objects: Mapping[str, str] = OBJECTS,
    batching: str = "{max_events: 100, max_bytes: 1MiB, max_age_seconds: 0.2}",
    replay: str = "{start: earliest, on_corrupted: fail}",
    ingest: Mapping[str, object] | None = None,
    engine: str = "local",
) -> Path:
    """A conf/ directory landing from ``emulator`` (external, over its socket) into
    ``root/lake`` with the lake ``engine``; ``ingest`` overrides keys of the ``ingest:``
    section."""
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True, exist_ok=True)
    tls = (
        f"{{enabled: true, ca_file: {emulator.ca_cert_path}}}"
        if emulator.ca_cert_path is not None
        else "{enabled: false}"
    )
    settings = {"progress_interval_seconds": 1, "maintain_every_commits": 0, **(ingest or {})}
    ingest_lines = "\n".join(f"  {key}: {value}" for key, value in settings.items())
    pipeline = textwrap.dedent(
        f"""\
        connection:
          source: emulator
          emulator:
            mode: external
            host: 127.0.0.1
            grpc_port: {emulator.grpc_port}
            http_port: {emulator.http_port}
            tls: {tls}
        lake:
          engine: {engine}
          location: {root / "lake"}
        defaults:
          replay: {replay}
          batching: {batching}
        ingest:
          num_requested: 100
          retry: {{max_attempts: 20, initial_backoff_seconds: 0.02, max_backoff_seconds: 0.2}}
        """
    )
    (conf / "pipeline.yml").write_text(pipeline + ingest_lines + "\n")
    for name, text in objects.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


def _engine(conf: Conf) -> LocalEngine:
    # Whichever engine landed, the lake is read back with delta-rs.
    return LocalEngine.from_spec(conf.pipeline.lake)


def landed(conf_dir: Path, topic: str) -> list[tuple[bytes, str]]:
    """(replay id, event id) of the topic's bronze rows in stream order."""
    conf = load_conf(conf_dir)
    tables = bronze_tables(conf.topics(include_disabled=True))
    engine = _engine(conf)
    table = tables.bronze(topic)
    if not engine.exists(table):
        return []
    rows = engine.read_arrow(table, columns=["batch_id", "batch_seq", "replay_id", "event_id"])
    ordered = sorted(rows.to_pylist(), key=lambda r: (r["batch_id"], r["batch_seq"]))
    return [(r["replay_id"], r["event_id"]) for r in ordered]


def checkpoint_rows(conf_dir: Path, topic: str | None = None) -> list[dict[str, Any]]:
    """Checkpoint rows (of ``topic``), ordered by topic and batch."""
    conf = load_conf(conf_dir)
    engine = _engine(conf)
    table = TableRef("bronze", "sfcdc_checkpoints")
    if not engine.exists(table):
        return []
    where = [] if topic is None else [("topic", "=", topic)]
    rows = engine.read_arrow(table, where=where).to_pylist()
    return sorted(rows, key=lambda r: (r["topic"], r["batch_id"]))


def expected(emulator: Emulator, topic: str) -> list[tuple[bytes, str]]:
    """What the emulator holds for ``topic``, in stream order."""
    return [(e.replay_id, e.event_id) for e in emulator.log(topic)]


def wait_for(condition: Callable[[], bool], timeout: float = 90.0, what: str = "") -> None:
    """Poll ``condition`` until it holds. The deadline allows for a spark-engine landing on a
    busy machine, which creates its bookkeeping tables (seconds each) before its first commit."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)
