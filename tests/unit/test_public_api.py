"""Each package's ``__all__`` is curated: it names only what exists and nothing private."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "ingest",
    "ingest.auth_flows",
    "ingest.auth_secrets",
    "ingest.errors",
    "ingest.replay",
    "ingest.cometd",
    "ingest.emulator.cometd",
    "pipelines",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_exact(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    # ruff (RUF022) orders __all__ isort-style where constants are exported.
    isort_style = name in ("pipelines", "ingest.cometd", "ingest.emulator.cometd")
    assert sorted(exported) == list(exported) or isort_style, f"{name}.__all__ unsorted"
    assert len(set(exported)) == len(exported)
    for symbol in exported:
        assert not symbol.startswith("_")
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"
