"""``--once`` at Salesforce's timing: ``sfcdc emulator serve`` with its defaults (a keepalive
after 270 s of silence, Streaming API long polls held 110 s) and ``sfcdc ingest --once`` /
``sfcdc streaming ingest --once`` against it, each in a process of its own. Both land the
whole backlog and stop within seconds of it, without waiting for a keepalive or a long poll
to end (before, the Pub/Sub landing took 270 s or more and the Streaming API one 110 s)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.engines import TableRef
from pipelines.engines.local import LocalEngine
from tests.cli_env import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Short of the 110 s long poll and the 270 s keepalive, which a run that waited for either
# would take at least; a run that does not wait takes 5-8 s here, under 20 s with two CPU hogs
# beside it, and a loaded CI machine with Spark drivers alongside may take several times that.
WITHIN = 90.0
_COUNT = re.compile(r"^\s+(/\S+): (\d+) events$", re.MULTILINE)


@dataclass(frozen=True)
class Served:
    grpc_port: int
    http_port: int
    counts: dict[str, int]


def _sfcdc(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", *args]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``sfcdc emulator serve`` with Salesforce's timing (its defaults) and a backlog."""
    root = tmp_path_factory.mktemp("salesforce-timing")
    info = root / "emulator.json"
    out = root / "emulator.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            _sfcdc(
                "emulator",
                "serve",
                "--port",
                "0",
                "--events",
                "3000",
                "--platform-events",
                "300",
                "--connection-file",
                str(info),
            ),
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
    try:
        deadline = time.monotonic() + 60
        while "serving;" not in out.read_text():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        details = json.loads(info.read_text())
        counts = {topic: int(n) for topic, n in _COUNT.findall(out.read_text())}
        yield Served(
            int(details["grpc_target"].rsplit(":", 1)[1]),
            int(details["http_url"].rsplit(":", 1)[1]),
            counts,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _conf(root: Path, served: Served, objects: dict[str, str]) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        "connection:\n"
        "  emulator:\n"
        "    mode: external\n"
        f"    grpc_port: {served.grpc_port}\n"
        f"    http_port: {served.http_port}\n"
        "lake:\n"
        f"  location: {root / 'lake'}\n"
    )
    for name, text in objects.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


def _timed(argv: list[str], log: Path) -> float:
    started = time.monotonic()
    with log.open("w") as sink:
        code = subprocess.run(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=cli_env(), timeout=240, check=False
        ).returncode
    seconds = time.monotonic() - started
    assert code == 0, log.read_text()
    return seconds


def test_ingest_once_lands_the_backlog_without_waiting_for_a_keepalive(
    tmp_path: Path, served: Served
) -> None:
    objects = {
        "account": "object: Account\nkind: change_events\n",
        "contact": "object: Contact\nkind: change_events\n",
        "invoice": "object: Invoice__c\nkind: change_events\n",
        "order_shipped": "object: Order_Shipped__e\nkind: platform_event\n",
    }
    conf = _conf(tmp_path, served, objects)
    log = tmp_path / "ingest.out"
    seconds = _timed(_sfcdc("ingest", "--conf", str(conf), "--once"), log)
    assert seconds < WITHIN, log.read_text()
    engine = LocalEngine(location=tmp_path / "lake")
    tables = {
        "/data/AccountChangeEvent": "account_change_event",
        "/data/ContactChangeEvent": "contact_change_event",
        "/data/Invoice__ChangeEvent": "invoice__change_event",
        "/event/Order_Shipped__e": "order_shipped__e",
    }
    landed = {t: engine.read_arrow(TableRef("bronze", n)).num_rows for t, n in tables.items()}
    assert landed == {t: served.counts[t] for t in tables}
    assert "caught up: the server owed" in log.read_text()


def test_streaming_ingest_once_lands_the_backlog_without_waiting_for_a_long_poll(
    tmp_path: Path, served: Served
) -> None:
    objects = {
        "accounts": "kind: streaming_api\nchannel: /data/AccountChangeEvent\n",
        "orders": "kind: streaming_api\nchannel: /event/Order_Shipped__e\n",
    }
    conf = _conf(tmp_path, served, objects)
    log = tmp_path / "streaming.out"
    seconds = _timed(_sfcdc("streaming", "ingest", "--conf", str(conf), "--once"), log)
    assert seconds < WITHIN, log.read_text()
    engine = LocalEngine(location=tmp_path / "lake")
    landed = {
        channel: engine.read_arrow(TableRef("bronze", table)).num_rows
        for channel, table in (
            ("/data/AccountChangeEvent", "streaming_account_change_event"),
            ("/event/Order_Shipped__e", "streaming_order_shipped__e"),
        )
    }
    assert landed == {
        "/data/AccountChangeEvent": served.counts["/data/AccountChangeEvent"],
        "/event/Order_Shipped__e": served.counts["/event/Order_Shipped__e"],
    }
    assert "disconnected client" in log.read_text()
