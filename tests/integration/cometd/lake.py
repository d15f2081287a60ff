"""Test support for the Streaming API source end to end: a TLS emulator serving real HTTPS on
loopback, a ``conf/`` of ``kind: streaming_api`` object files that lands from it, and readers
of what landed."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.cometd import CometdSettings
from ingest.emulator.server import Emulator, EmulatorConfig
from pipelines.engines import LakeEngine, TableRef
from tests.cometd_helpers import assert_sessions_closed, change_event

__all__ = [
    "ACCOUNT_QUERY",
    "ACCTS",
    "CREATED",
    "account",
    "checkpoints",
    "inject",
    "ordered",
    "tls_emulator",
    "write_conf",
]

ACCOUNT_QUERY = "SELECT Id, Name, Industry, NumberOfEmployees FROM Account"
CREATED = "2025-01-01T00:00:00.000Z"
# The object file of a managed PushTopic channel on Account.
ACCTS = f"""\
kind: streaming_api
channel: /topic/Accts
pushtopic:
  manage: create_or_update
  query: {ACCOUNT_QUERY}
"""


@pytest.fixture
def tls_emulator(request: pytest.FixtureRequest) -> Iterator[Emulator]:
    """An emulator with TLS whose long polls end after 0.3 s when nothing is waiting (the
    test must leave no CometD session open: :func:`assert_sessions_closed`)."""
    emulator = Emulator(
        default_catalogue(),
        EmulatorConfig(tls=True, streaming=CometdSettings(poll_timeout=0.3)),
    ).start()
    try:
        yield emulator
        assert_sessions_closed(request, emulator)
    finally:
        emulator.close()


def write_conf(
    root: Path,
    emulator: Emulator,
    objects: Mapping[str, str],
    *,
    engine: str = "local",
    batching: str = "{max_events: 4, max_bytes: 1MiB, max_age_seconds: 0.2}",
) -> Path:
    """``root/conf`` landing from ``emulator`` (external, over its HTTPS port) into
    ``root/lake``."""
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True, exist_ok=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              source: emulator
              emulator:
                mode: external
                host: 127.0.0.1
                grpc_port: {emulator.grpc_port}
                http_port: {emulator.http_port}
                tls: {{enabled: true, ca_file: {emulator.ca_cert_path}}}
            lake: {{engine: {engine}, location: {root / "lake"}}}
            defaults:
              replay: {{start: earliest, on_corrupted: fail}}
              batching: {batching}
            ingest:
              retry: {{max_attempts: 20, initial_backoff_seconds: 0.02, max_backoff_seconds: 0.2}}
              progress_interval_seconds: 1
              maintain_every_commits: 0
            """
        )
    )
    for name, text in objects.items():
        (conf / "objects" / f"{name}.yml").write_text(textwrap.dedent(text))
    return conf


def account(
    emulator: Emulator, change: str, record_id: str, values: Mapping[str, Any] | None = None
) -> None:
    """One Account change on the emulator's bus (PushTopics on Account evaluate it)."""
    body = dict(values or {})
    emulator.append([change_event(emulator, "Account", change, [record_id], body, changed=[*body])])


def inject(emulator: Emulator, channel: str, data: Mapping[str, Any]) -> int:
    """A message with ``data`` (its ``event.replayId`` filled in) on a PushTopic or generic
    channel, as the server would deliver it; returns its replay id."""

    def build(replay_id: int) -> dict[str, Any]:
        out = json.loads(json.dumps(data))
        event = out.setdefault("event", {})
        if isinstance(event, dict):
            event.setdefault("replayId", replay_id)
            event.setdefault("createdDate", CREATED)
        return dict(out)

    return emulator.streaming.hub.append(channel, build)


def ordered(engine: LakeEngine, table: TableRef, *columns: str) -> list[dict[str, Any]]:
    """Rows of a bronze table in stream order."""
    rows = engine.read_arrow(table, columns=["batch_id", "batch_seq", *columns]).to_pylist()
    return sorted(rows, key=lambda r: (r["batch_id"], r["batch_seq"]))


def checkpoints(engine: LakeEngine, key: str) -> list[dict[str, Any]]:
    rows = engine.read_arrow(
        TableRef("bronze", "sfcdc_checkpoints"), where=[("topic", "=", key)]
    ).to_pylist()
    return sorted(rows, key=lambda r: r["batch_id"])
