"""Fixtures for emulator tests over a real socket: emulators with sub-second timers and a fake
clock, a generated-stub client, and valid auth metadata."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ingest.emulator.faults import Faults
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.pubsub import pb2_grpc
from tests.emulator_helpers import FakeClock, catalogue

FAST = {"keepalive_interval": 0.25, "idle_timeout": 2.0}

MakeEmulator = Callable[..., Emulator]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_emulator(clock: FakeClock) -> Iterator[MakeEmulator]:
    """Start emulators over the test catalogue; all are stopped at teardown."""
    started: list[Emulator] = []

    def make(*, faults: Faults | None = None, catalogue_: Any = None, **overrides: Any) -> Emulator:
        config = EmulatorConfig(**{**FAST, **overrides})
        emulator = Emulator(catalogue_ or catalogue(), config, clock=clock, faults=faults)
        emulator.start()
        started.append(emulator)
        return emulator

    yield make
    for emulator in started:
        emulator.close()


@pytest.fixture
def emulator(make_emulator: MakeEmulator) -> Emulator:
    return make_emulator()


@pytest.fixture
def stub(emulator: Emulator) -> Iterator[pb2_grpc.PubSubStub]:
    channel = emulator.channel()
    yield pb2_grpc.PubSubStub(channel)
    channel.close()


@pytest.fixture
def md(emulator: Emulator) -> tuple[tuple[str, str], ...]:
    return emulator.issue_token().metadata()
