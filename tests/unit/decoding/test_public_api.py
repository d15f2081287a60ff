"""``ingest.decoding`` exports its public API, and every module curates ``__all__``."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "ingest.decoding",
    "ingest.decoding.avro",
    "ingest.decoding.avro_codegen",
    "ingest.decoding.avro_compiled",
    "ingest.decoding.avro_fallback",
    "ingest.decoding.avro_types",
    "ingest.decoding.avro_wire",
    "ingest.decoding.bitmap",
    "ingest.decoding.cache",
    "ingest.decoding.diff",
    "ingest.decoding.event",
    "ingest.decoding.event_time",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_unique_public_and_present(name: str) -> None:
    # Its order is ruff's (RUF022: constants, classes, functions), checked by the lint test.
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(set(exported)) == len(exported)
    for symbol in exported:
        assert not symbol.startswith("_")
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"


def test_the_package_exports_what_other_parts_use() -> None:
    import ingest.decoding as decoding

    assert {
        "ChangeEvent",
        "DecodedBatch",
        "DecoderCache",
        "EventDecoder",
        "apply_diff",
        "compile_decoder",
        "diff_sha256",
        "event_time_ms",
        "field_names",
        "is_diff",
    } <= set(decoding.__all__)
