"""The client modules' ``__all__`` name exactly what exists, nothing private, no duplicates."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "ingest.auth",
    "ingest.client",
    "ingest.client.channel",
    "ingest.client.errors",
    "ingest.client.managed",
    "ingest.client.multi",
    "ingest.client.publisher",
    "ingest.client.retry",
    "ingest.client.schemas",
    "ingest.client.stream",
    "ingest.client.subscriber",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_curated(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(set(exported)) == len(exported)
    for symbol in exported:
        assert not symbol.startswith("_")
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"


def test_the_package_exports_every_public_client_type() -> None:
    package = importlib.import_module("ingest.client")
    for name in MODULES[2:]:
        module = importlib.import_module(name)
        for symbol in module.__all__:
            if symbol[0].isupper() and not symbol.isupper():
                assert symbol in package.__all__, f"ingest.client does not export {symbol}"
