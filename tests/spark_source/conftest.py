"""The emulator over a socket, the source's options for it, and a driver subprocess to run
(and kill) Structured Streaming queries with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "/data/AccountChangeEvent"
ORDERS = "/event/Order_Shipped__e"


@dataclass
class Org:
    emulator: Emulator
    workload: Workload

    def options(self, topic: str = ACCOUNT, **extra: str) -> dict[str, str]:
        """The source's options for this emulator (explicit connection keys)."""
        return {
            "connection.source": "emulator",
            "connection.emulator.mode": "external",
            "connection.emulator.grpc_port": str(self.emulator.grpc_port),
            "connection.emulator.http_port": str(self.emulator.http_port),
            "topic": topic,
            **extra,
        }

    def publish(self, n: int) -> None:
        self.emulator.append(self.workload.events(n))

    def replay_ids(self, topic: str = ACCOUNT) -> list[bytes]:
        return [e.replay_id for e in self.emulator.log(topic)]


@pytest.fixture
def org() -> Iterator[Org]:
    catalogue = default_catalogue()
    config = EmulatorConfig(keepalive_interval=0.5, idle_timeout=30.0)
    with Emulator(catalogue, config) as emulator:
        yield Org(emulator, Workload(catalogue, seed=7))


@dataclass
class Driver:
    """A streaming query in a Python subprocess of its own (see driver.py)."""

    root: Path
    options: dict[str, str]
    runs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def table(self) -> Path:
        return self.root / "table"

    def settings(self, options: dict[str, str] | None = None, **more: Any) -> str:
        return json.dumps(
            {
                "options": {**self.options, **(options or {})},
                "table": str(self.table),
                "checkpoint": str(self.root / "checkpoint"),
                "workdir": str(self.root / "spark"),
                **more,
            }
        )

    def start(self, options: dict[str, str] | None = None, **more: Any) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.spark_source.driver", self.settings(options, **more)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.runs.append(proc)
        return proc

    def wait_started(self, proc: subprocess.Popen[str], timeout: float = 90.0) -> None:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("STARTED"):
                return
            if not line and proc.poll() is not None:
                raise AssertionError(f"the driver ended with status {proc.returncode}")
        raise AssertionError("the driver did not start its query in time")

    def kill(self, proc: subprocess.Popen[str]) -> None:
        """SIGKILL the driver and everything it started (its JVM, its Python workers)."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def wait_for(
        self,
        proc: subprocess.Popen[str],
        done: Callable[[], bool],
        timeout: float = 150.0,
        what: str = "land every event",
    ) -> None:
        """Wait until ``done()`` (checked on the table or the checkpoint, not in the driver)
        or fail when the driver ends first; ``what`` the query did not do in time."""
        deadline = time.monotonic() + timeout
        while not done():
            if proc.poll() is not None:
                raise AssertionError(f"the driver ended with status {proc.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the query did not {what} in time")
            time.sleep(0.5)

    def close(self) -> None:
        for proc in self.runs:
            if proc.poll() is None:
                self.kill(proc)


@pytest.fixture
def driver_for(tmp_path: Path) -> Iterator[Any]:
    made: list[Driver] = []

    def make(options: dict[str, str], name: str = "query") -> Driver:
        driver = Driver(tmp_path / name, options)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()
