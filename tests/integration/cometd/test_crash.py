"""Exactly once across SIGKILLs for the Streaming API source: ``sfcdc streaming ingest`` in a
subprocess is killed at random instants while the emulator (in this process, over loopback
HTTPS) keeps notifying on a PushTopic and a generic channel; it is restarted each time and
finally drained with ``--once``. Every notification of each channel is then in its bronze
table once, in replay id order, and the checkpoint batches run 1, 2, 3, ... On the spark engine
every run starts a Spark driver first and each commit takes seconds, so it is killed fewer times
and the producer stops after a few hundred notifications (the final drain stays short)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ingest.emulator.server import Emulator
from pipelines.bronze.cometd_tables import replay_number
from pipelines.engines import TableRef
from pipelines.engines.local import LocalEngine
from tests.cli_env import cli_env
from tests.integration.cometd.lake import (
    ACCOUNT_QUERY,
    account,
    checkpoints,
    ordered,
    write_conf,
)

pytestmark = [
    pytest.mark.streaming_api,
    pytest.mark.integration,
    pytest.mark.slow,
    # A SIGKILLed landing cannot disconnect its session.
    pytest.mark.leaves_sessions,
    pytest.mark.timeout(2400),
]

ROOT = Path(__file__).resolve().parents[3]
KILLS = {"local": 20, "spark": 2}
# Account changes the producer makes (None: until the kills are over).
CHANGES: dict[str, int | None] = {"local": None, "spark": 150}
# The kill comes at a random instant after this log line: a spark-engine run is killed once it
# committed a batch (its commits take seconds, so a kill soon after subscribing would hit
# nothing but start-ups). A local-engine run is killed after subscribing (its first connects
# and recovery included), every other one only once it committed a batch: its first commit
# comes about a second after subscribing here, so 6 of 20 kills soon after subscribing hit
# it before any, and the slower a loaded machine starts a landing, the more of them do.
KILL_AFTER = {"local": ("subscribed", 1.2), "spark": ("landed streaming:", 8.0)}
OBJECTS = {
    "accts": f"""\
        kind: streaming_api
        channel: /topic/Accts
        pushtopic:
          manage: create_or_update
          query: {ACCOUNT_QUERY}
        """,
    "news": "kind: streaming_api\nchannel: /u/News\n",
}
CHANNELS = {"/topic/Accts": "streaming_accts", "/u/News": "streaming_news"}


class Producer(threading.Thread):
    """Account changes on a few records and generic events, in bursts."""

    def __init__(
        self, emulator: Emulator, channel_id: str, seed: int, limit: int | None = None
    ) -> None:
        super().__init__(name="producer", daemon=True)
        self.limit = limit
        self.emulator = emulator
        self.channel_id = channel_id
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.made: set[str] = set()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set() and (self.limit is None or n < self.limit):
            for _ in range(self.rng.randint(1, 3)):
                n += 1
                record = f"001{self.rng.randrange(40):012d}AAA"
                if record in self.made:
                    account(self.emulator, "UPDATE", record, {"NumberOfEmployees": n})
                else:
                    self.made.add(record)
                    account(self.emulator, "CREATE", record, {"Name": f"Acct {n}"})
                if n % 3 == 0:
                    self.emulator.streaming.push(self.channel_id, f"event {n}")
            self.stop.wait(self.rng.uniform(0.05, 0.15))


def _ingest(conf: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = cli_env()
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                "streaming",
                "ingest",
                "--conf",
                str(conf),
                *extra,
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    # A spark-engine start-up (JVM, Delta tables, recovery) takes minutes on a busy machine.
    deadline = time.monotonic() + 600
    while text not in log.read_text(errors="replace"):
        assert process.poll() is None, f"ingest exited before landing:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"ingest did not start landing:\n{_tail(log)}"
        time.sleep(0.02)


def test_sigkill_at_random_points_loses_and_duplicates_no_notification(
    tmp_path: Path, tls_emulator: Emulator, engine_name: str
) -> None:
    emu = tls_emulator
    kills = KILLS[engine_name]
    rng = random.Random(20261125)
    channel_id = emu.streaming.create_channel("/u/News")
    conf = write_conf(
        tmp_path,
        emu,
        OBJECTS,
        engine=engine_name,
        batching="{max_events: 50, max_bytes: 1MiB, max_age_seconds: 0.1}",
    )
    producer = Producer(emu, channel_id, seed=17, limit=CHANGES[engine_name])
    landed_runs = 0
    started = time.monotonic()
    try:
        for run in range(kills):
            log = tmp_path / f"run-{run:02d}.log"
            process = _ingest(conf, log)
            line, within = KILL_AFTER[engine_name]
            if run % 2:
                line = "landed streaming:"
            _wait_for_line(log, "subscribed", process)
            if producer.ident is None:
                producer.start()  # the PushTopic exists once the first run subscribed
            _wait_for_line(log, line, process)
            time.sleep(rng.uniform(0.0, within))
            assert process.poll() is None, f"run {run} exited early:\n{_tail(log)}"
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            landed_runs += "landed streaming:" in log.read_text(errors="replace")
        producer.stop.set()
        producer.join(timeout=10)
        log = tmp_path / "drain.log"
        final = _ingest(conf, log, "--once")
        assert final.wait(timeout=300) == 0, _tail(log)
    finally:
        producer.stop.set()

    engine = LocalEngine(location=tmp_path / "lake")
    total = 0
    for channel, table in CHANNELS.items():
        truth = list(range(1, emu.streaming.hub.tip(channel) + 1))
        rows = ordered(engine, TableRef("bronze", table), "replay_id")
        got = [r["replay_id"] for r in rows]
        twice = [k for k, n in Counter(got).items() if n > 1]
        assert not twice, f"{channel}: {len(twice)} notifications landed twice"
        assert set(truth) <= set(got), f"{channel}: {len(set(truth) - set(got))} missing"
        assert got == truth, f"{channel}: same notifications, another order"
        marks = checkpoints(engine, f"streaming:{channel}")
        assert [m["batch_id"] for m in marks] == list(range(1, len(marks) + 1))
        assert replay_number(marks[-1]["replay_id"]) == truth[-1]
        total += len(truth)
    assert len(emu.streaming.push_topics.records()) == 1  # made once, then left as it was
    # Most kills hit a running landing, not a start-up.
    assert landed_runs >= kills // 2
    recovered = sum(
        1
        for c in CHANNELS
        for m in checkpoints(engine, f"streaming:{c}")
        if (m["detail"] or "").startswith("recovered")
    )
    print(
        f"{engine_name}: {total} notifications, {kills} kills ({landed_runs} mid-landing), "
        f"{recovered} checkpoints rebuilt from bronze, {time.monotonic() - started:.0f} s"
    )
