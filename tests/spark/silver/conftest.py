"""The silver job tests' lake: one per test, on the test's lake engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.engines import LakeEngine
from tests.conftest import EngineFactory


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """Where the test's tables live (a later engine of the same kind may open it again, as
    a new run would: ``make_engine(lake)``)."""
    return tmp_path / "lake"


@pytest.fixture
def engine(make_engine: EngineFactory, lake: Path) -> LakeEngine:
    """An engine of this test's kind over the test's lake."""
    return make_engine(lake)
