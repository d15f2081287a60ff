"""A second landing of the same topics into the same lake is refused at start, naming the
running one; once that one is SIGKILLed, its lease is taken over and landing resumes exactly."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from ingest.emulator.server import Emulator
from ingest.errors import LeaseHeldError
from pipelines.commands.ingest import land
from pipelines.spec import load_conf
from tests.integration.bronze.conftest import ORDER_OBJECT, ORDERS, expected, landed, write_conf
from tests.integration.bronze.test_crash import _ingest, _tail, _wait_for_line
from tests.integration.client.conftest import fill

pytestmark = pytest.mark.integration


def test_a_second_ingest_is_refused_at_once_naming_the_first(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    conf = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"order": ORDER_OBJECT},
        # Long enough that a loaded machine never lets the first landing's lease expire
        # between renewals; the takeover below is by the holder's process being gone.
        ingest={"lease_seconds": 300},
    )
    fill(emulator, 50, ORDERS)
    log = tmp_path / "first.log"
    first = _ingest(conf, log)
    try:
        _wait_for_line(log, "subscribed to", first)
        started = time.monotonic()
        with pytest.raises(LeaseHeldError) as refused:
            land(load_conf(conf), once=True)
        # A few reads of the lease table (Spark jobs on the spark engine), not a landing.
        assert time.monotonic() - started < (10 if lake_kind == "local" else 30), "came late"
        message = str(refused.value)
        assert f"pid {first.pid}" in message and "since" in message and "until" in message
        assert ORDERS in message
        assert first.poll() is None, _tail(log)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    # Killed without releasing: on this host its lease is taken over at once (the process is
    # gone), and landing resumes after the last checkpoint.
    fill(emulator, 20, ORDERS, start=50)
    land(load_conf(conf), once=True)
    assert landed(conf, ORDERS) == expected(emulator, ORDERS)
