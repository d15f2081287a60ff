"""The bronze modules export a curated ``__all__``: existing names, once, nothing private (ruff
keeps the lists sorted)."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "pipelines.bronze",
    "pipelines.bronze.tables",
    "pipelines.bronze.checkpoint",
    "pipelines.engines.deltalog",
    "pipelines.bronze.landing",
    "pipelines.bronze.landing_state",
    "pipelines.bronze.batches",
    "pipelines.bronze.commit_thread",
    "pipelines.bronze.committer",
    "pipelines.bronze.cometd",
    "pipelines.bronze.cometd_batches",
    "pipelines.bronze.cometd_commit",
    "pipelines.bronze.cometd_state",
    "pipelines.connect",
    "pipelines.commands.ingest",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_exact(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(set(exported)) == len(exported)
    for symbol in exported:
        assert not symbol.startswith("_")
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"
