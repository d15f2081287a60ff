"""Exactly once across SIGKILLs, on both lake engines: `sfcdc ingest` in a subprocess is killed
at random points while the emulator (in this process) keeps producing generated events on
several topics, restarted each time, and finally drained; every topic's bronze table then holds
exactly the emulator's events, in order, once. On the spark engine each run starts its own
Spark driver with delta-spark (a JVM start per run), so it is killed fewer times (five). The
local engine also lands into a lake on object storage (an S3-compatible server and Azurite on
loopback), where every commit goes through delta-rs."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.managed import ManagedSubscriptionConfig
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload
from pipelines.engines import LocalEngine, TableRef
from pipelines.spec import load_conf
from tests.cli_env import cli_env
from tests.integration.bronze.conftest import checkpoint_rows, expected, landed
from tests.object_storage import ObjectLake

# Each spark-engine run starts a Spark driver: allow for it on a busy machine.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[3]
# Kills per engine: each spark-engine run starts a JVM first, which takes seconds.
KILLS = {"local": 20, "spark": 5, "object": 2}
# Pause between the producer's bursts and events per bronze batch: a spark-engine commit takes
# far longer than a local one, so its producer is slower and its batches bigger (the backlog a
# run leaves must drain in minutes).
PAUSE = {"local": 0.01, "spark": 0.1, "object": 0.2}
MAX_EVENTS = {"local": 150, "spark": 1000, "object": 1000}
# Events the producer appends at most: past this it stays quiet (keepalives only) until the
# kills are over, so a slow start-up on a busy machine does not leave a backlog of tens of
# thousands of events for the drain.
PRODUCED = {"local": 8000, "spark": 3000, "object": 1500}
# Events the producer must have made by the end (an object store's commits take longer).
MIN_EVENTS = {"local": 2000, "spark": 2000, "object": 300}
ACCOUNT = "/data/AccountChangeEvent"
INVOICE = "/data/Invoice__ChangeEvent"
CHANNEL = "/data/ChangeEvents"
ORDERS = "/event/Order_Shipped__e"
TOPICS = (ACCOUNT, INVOICE, CHANNEL, ORDERS)
MANAGED = "Orders_Crash"


def _conf(root: Path, emulator: Emulator, engine: str, lake: str | None = None) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    events = MAX_EVENTS[engine if lake is None else "object"]
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              emulator:
                mode: external
                grpc_port: {emulator.grpc_port}
                http_port: {emulator.http_port}
                tls: {{enabled: true, ca_file: {emulator.ca_cert_path}}}
            lake: {lake or f"{{engine: {engine}, location: {root / 'lake'}}}"}
            defaults:
              replay: {{start: earliest, on_corrupted: fail}}
              batching: {{max_events: {events}, max_bytes: 1MiB, max_age_seconds: 0.2}}
            ingest:
              retry: {{max_attempts: 30, initial_backoff_seconds: 0.05, max_backoff_seconds: 0.5}}
              progress_interval_seconds: 1
              maintain_every_commits: 15
            """
        )
    )
    objects = {
        "account": "object: Account\nkind: change_events\n",
        "contact": "object: Contact\nkind: change_events\ntopic: /data/ChangeEvents\n",
        "opportunity": "object: Opportunity\nkind: change_events\ntopic: /data/ChangeEvents\n",
        "invoice": "object: Invoice__c\nkind: change_events\n",
        "order": "object: Order_Shipped__e\nkind: platform_event\n"
        f"managed_subscription: {MANAGED}\n",
    }
    for name, text in objects.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


class Producer(threading.Thread):
    """The org's users: generated transactions appended in bursts with quiet spells (so
    keepalives come mid-run too)."""

    def __init__(self, emulator: Emulator, seed: int, pause: float, limit: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.emulator = emulator
        self.pause = pause
        self.limit = limit
        self.workload = Workload(emulator.catalogue, seed=seed)
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.events = 0

    def run(self) -> None:
        while not self.stop.is_set():
            if self.rng.random() < 0.03 or self.events >= self.limit:
                self.stop.wait(self.rng.uniform(0.3, 0.8))
                continue
            batch = [e for _ in range(self.rng.randint(1, 8)) for e in self.workload.transaction()]
            self.events += len(self.emulator.append(batch))
            self.stop.wait(self.pause)


def _ingest(conf: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = cli_env()
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "ingest", "--conf", str(conf), *extra],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while text not in log.read_text(errors="replace"):
        assert process.poll() is None, f"ingest exited before landing:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"ingest did not start landing:\n{_tail(log)}"
        time.sleep(0.02)


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def test_sigkill_at_random_points_loses_and_duplicates_nothing(
    tmp_path: Path, engine_name: str
) -> None:
    _kill_and_drain(tmp_path, engine_name, None)


def test_sigkill_with_the_lake_on_object_storage(tmp_path: Path, object_lake: ObjectLake) -> None:
    _kill_and_drain(tmp_path, "local", object_lake)


def _kill_and_drain(tmp_path: Path, engine_name: str, lake: ObjectLake | None) -> None:
    kind = engine_name if lake is None else "object"
    kills = KILLS[kind]
    rng = random.Random(20240501)
    emulator = Emulator(
        default_catalogue(),
        EmulatorConfig(
            tls=True,
            keepalive_interval=0.3,
            idle_timeout=30.0,
            managed_subscriptions=(
                ManagedSubscriptionConfig(MANAGED, ORDERS, default_replay="EARLIEST"),
            ),
        ),
    )
    emulator.start()
    producer = Producer(emulator, seed=7, pause=PAUSE[kind], limit=PRODUCED[kind])
    commits: list[int] = []
    try:
        conf = _conf(tmp_path, emulator, engine_name, None if lake is None else lake.yaml())
        producer.start()
        for run in range(kills):
            log = tmp_path / f"run-{run:02d}.log"
            process = _ingest(conf, log)
            # Kill at a random instant once it lands (start-up takes longer on a busy machine,
            # and a spark-engine run opens its tables for seconds before its first commit).
            _wait_for_line(log, "landed /", process)
            time.sleep(rng.uniform(0.0, 1.5))
            assert process.poll() is None, f"run {run} exited early:\n{_tail(log)}"
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            commits.append(log.read_text(errors="replace").count("landed /"))
        # The kills take as long as the machine lets them: the org's users go on until they
        # have made the events this test needs, however quickly the kills came.
        deadline = time.monotonic() + 120
        while producer.events <= MIN_EVENTS[kind] and time.monotonic() < deadline:
            time.sleep(0.1)
        producer.stop.set()
        producer.join(timeout=10)

        log = tmp_path / "drain.log"
        final = _ingest(conf, log, "--once")
        assert final.wait(timeout=900) == 0, _tail(log)
    finally:
        producer.stop.set()
        emulator.close()

    assert producer.events > MIN_EVENTS[kind]
    for topic in TOPICS:
        bronze = landed(conf, topic)
        truth = expected(emulator, topic)
        duplicates = [k for k, n in Counter(bronze).items() if n > 1]
        assert not duplicates, f"{topic}: {len(duplicates)} events landed twice"
        missing = set(truth) - set(bronze)
        assert not missing, f"{topic}: {len(missing)} of {len(truth)} events missing"
        assert bronze == truth, f"{topic}: same events, different order"
        batches = [r["batch_id"] for r in checkpoint_rows(conf, topic)]
        assert batches == list(range(1, len(batches) + 1)), f"{topic}: checkpoint batches"

    engine = LocalEngine.from_spec(load_conf(conf).pipeline.lake)
    registered = set(
        engine.read_arrow(TableRef("bronze", "sfcdc_schemas"))["schema_id"].to_pylist()
    )
    for table in ("account_change_event", "invoice__change_event", "change_events"):
        used = engine.read_arrow(TableRef("bronze", table), columns=["schema_id"])["schema_id"]
        assert set(used.to_pylist()) <= registered, f"{table}: a schema id missing from registry"
    # The kills hit running landings, not start-ups.
    assert sum(1 for n in commits if n) >= kills // 2, commits
    recovered = [r for r in checkpoint_rows(conf) if (r["detail"] or "").startswith("recovered")]
    print(
        f"{kind if lake is None else lake.server.kind}: {producer.events} events produced, "
        f"{kills} kills after {sum(commits)} commits, "
        f"{len(recovered)} checkpoints recovered from bronze after a kill between the two "
        "commits"
    )
