"""The emulator modules' ``__all__`` lists are curated: existing names, nothing private, no
duplicates (their order is ruff's RUF022 isort-style order, checked by the lint test)."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "ingest.emulator.avrowriter",
    "ingest.emulator.bitmaps",
    "ingest.emulator.catalogue",
    "ingest.emulator.ids",
    "ingest.emulator.textdiff",
    "ingest.emulator.truth",
    "ingest.emulator.values",
    "ingest.emulator.workload",
    "ingest.emulator.workload_emit",
    "ingest.emulator.workload_mix",
    "ingest.emulator.workload_plans",
    "ingest.emulator.workload_records",
    "ingest.emulator.workload_tx",
    "ingest.emulator.workload_values",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_exact(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(set(exported)) == len(exported)
    for symbol in exported:
        assert not symbol.startswith("_")
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"
