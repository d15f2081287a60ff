"""`sfcdc ingest` as users run it: a subprocess landing from the emulator over its socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ingest.emulator.eventlog import encode_replay_id
from ingest.emulator.server import Emulator
from tests.integration.bronze.conftest import (
    ACCOUNT,
    CHANNEL,
    ORDER_OBJECT,
    ORDERS,
    checkpoint_rows,
    expected,
    landed,
    write_conf,
)
from tests.integration.client.conftest import fill

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# Runs the CLI, then reports whether a JVM gateway was ever launched in the process.
NO_JVM = textwrap.dedent(
    """
    import sys
    from pipelines.cli import main
    code = main(sys.argv[1:])
    from pyspark import SparkContext
    print("jvm:", SparkContext._gateway is not None)
    sys.exit(code)
    """
)


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_ingest_once_lands_everything_without_a_jvm(emulator: Emulator, tmp_path: Path) -> None:
    fill(emulator, 120, ACCOUNT)
    fill(emulator, 80, ORDERS)
    conf = write_conf(tmp_path, emulator)
    done = subprocess.run(
        [sys.executable, "-c", NO_JVM, "ingest", "--conf", str(conf), "--once"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "jvm: False" in done.stdout
    assert "stopped after" in done.stdout and "(drained:" in done.stdout
    assert f"{ACCOUNT} -> bronze.account_change_event: 120 events" in done.stdout
    for topic in (ACCOUNT, CHANNEL, ORDERS):
        assert landed(conf, topic) == expected(emulator, topic)
    # One INFO line per commit, and never a payload or a credential.
    commits = [line for line in done.stderr.splitlines() if " landed " in line]
    assert len(commits) == len(checkpoint_rows(conf))
    assert "sfcdc-emulator-secret" not in done.stderr + done.stdout


def test_sigterm_commits_the_open_batch_and_exits_zero(emulator: Emulator, tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        emulator,
        objects={"order": ORDER_OBJECT},
        batching="{max_events: 100000, max_bytes: 64MiB, max_age_seconds: 600}",
    )
    log = tmp_path / "ingest.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "ingest", "--conf", str(conf)],
            cwd=ROOT,
            env=ENV,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "subscribed to" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        fill(emulator, 50, ORDERS)
        # Received, sitting in the open batch (it only commits by age: 600 s): the landing's
        # progress line (every second) says so. The stop below commits what was received, so
        # it must come after all 50 (on a loaded machine they take their time to arrive).
        deadline = time.monotonic() + 120
        while " 50 in the open batch;" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert checkpoint_rows(conf, ORDERS) == []
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert "stopping (received SIGTERM)" in text
    assert landed(conf, ORDERS) == expected(emulator, ORDERS)


def test_a_purged_checkpoint_with_policy_fail_exits_non_zero_saying_why(
    emulator: Emulator, tmp_path: Path
) -> None:
    conf = write_conf(tmp_path, emulator, objects={"order": ORDER_OBJECT})
    fill(emulator, 10, ORDERS)
    assert _run("ingest", "--conf", str(conf), "--once").returncode == 0
    emulator.faults.purge(through=encode_replay_id(emulator.bus.position))
    failed = _run("-q", "ingest", "--conf", str(conf), "--once")
    assert failed.returncode == 2
    assert "sfcdc ingest: Subscribe to /event/Order_Shipped__e" in failed.stderr
    assert "rejected replay id" in failed.stderr
    assert "on_corrupted='earliest'" in failed.stderr and "on_corrupted='latest'" in failed.stderr
    assert (
        f"set replay.on_corrupted to earliest or latest in the topic's object files under {conf}"
        in failed.stderr
    )


def test_for_seconds_and_object_selection(emulator: Emulator, tmp_path: Path) -> None:
    fill(emulator, 30, ACCOUNT)
    fill(emulator, 20, ORDERS)
    conf = write_conf(tmp_path, emulator)
    done = _run("ingest", "--conf", str(conf), "--for", "2", "--objects", "Order_Shipped__e")
    assert done.returncode == 0, done.stderr
    assert "(duration reached)" in done.stdout
    assert landed(conf, ORDERS) == expected(emulator, ORDERS)
    assert landed(conf, ACCOUNT) == []

    unknown = _run("ingest", "--conf", str(conf), "--objects", "Acount")
    assert unknown.returncode == 2
    assert (
        "no object 'Acount'" in unknown.stderr and "configured: Account, Contact" in unknown.stderr
    )
    both = _run("ingest", "--conf", str(conf), "--once", "--for", "3")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
