"""The decoder cache loads each schema once, from any thread, and names unknown ids."""

from __future__ import annotations

import json
import logging
import pickle
import threading
import time
from collections import Counter

import pytest

from ingest.decoding import DecoderCache, EventDecoder
from ingest.errors import DecodeError, TransientError
from ingest.schema import schema_id

from .support import account_schema, encode, opt

ACCOUNT_JSON = json.dumps(account_schema())
ACCOUNT_ID = schema_id(ACCOUNT_JSON)
EVENT_JSON = json.dumps(
    {
        "type": "record",
        "name": "Order_Shipped__e",
        "namespace": "com.sforce.eventbus",
        "fields": [
            {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
            opt("Order_Number__c", "string", "Data:Text:00N000000000001"),
        ],
    }
)
EVENT_ID = schema_id(EVENT_JSON)


class Registry:
    """A schema source that counts its calls, like GetSchema or the registry table."""

    def __init__(self, schemas: dict[str, str], *, delay: float = 0.0) -> None:
        self.schemas = schemas
        self.calls: Counter[str] = Counter()
        self.delay = delay
        self.fail_next: Exception | None = None

    def __call__(self, sid: str) -> str:
        self.calls[sid] += 1
        if self.delay:
            time.sleep(self.delay)  # widens the window in which threads race, not a timeout
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return self.schemas[sid]


def test_each_id_is_loaded_parsed_and_compiled_once() -> None:
    registry = Registry({ACCOUNT_ID: ACCOUNT_JSON, EVENT_ID: EVENT_JSON})
    cache = DecoderCache(registry)
    schema, decoder = cache.get(ACCOUNT_ID)
    assert cache.get(ACCOUNT_ID) == (schema, decoder)
    assert cache.schema(ACCOUNT_ID) is schema and cache.decoder(ACCOUNT_ID) is decoder
    assert isinstance(decoder, EventDecoder) and decoder.schema is schema
    assert schema.schema_id == ACCOUNT_ID and schema.entity_name == "Account"
    assert cache.schema(EVENT_ID).name == "com.sforce.eventbus.Order_Shipped__e"
    assert registry.calls == {ACCOUNT_ID: 1, EVENT_ID: 1}
    assert ACCOUNT_ID in cache and len(cache) == 2


def test_the_decoder_decodes_events_of_its_schema() -> None:
    cache = DecoderCache(Registry({EVENT_ID: EVENT_JSON}))
    schema, decoder = cache.get(EVENT_ID)
    record = {"CreatedDate": 1_700_000_000_000, "Order_Number__c": "A-1"}
    assert decoder.decode(encode(schema, record)) == record


def test_concurrent_requests_for_one_id_load_it_once() -> None:
    registry = Registry({ACCOUNT_ID: ACCOUNT_JSON, EVENT_ID: EVENT_JSON}, delay=0.05)
    cache = DecoderCache(registry)
    start = threading.Barrier(8)
    got: list[object] = []

    def work(sid: str) -> None:
        start.wait()
        got.append((sid, cache.get(sid)))

    threads = [
        threading.Thread(target=work, args=([ACCOUNT_ID, EVENT_ID][i % 2],)) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert registry.calls == {ACCOUNT_ID: 1, EVENT_ID: 1}
    assert len({id(entry) for _, entry in got}) == 2


@pytest.mark.parametrize("missing", [KeyError("nope"), LookupError("nope")])
def test_unknown_ids_raise_decode_error_naming_the_id(missing: Exception) -> None:
    registry = Registry({})
    registry.fail_next = missing
    cache = DecoderCache(registry)
    with pytest.raises(DecodeError, match="unknown schema id 'gone-id'"):
        cache.get("gone-id")
    assert "gone-id" not in cache


def test_a_source_answering_none_means_unknown() -> None:
    cache = DecoderCache(lambda sid: None)
    with pytest.raises(DecodeError, match="unknown schema id 'x'"):
        cache.decoder("x")


@pytest.mark.parametrize("bad", ["", None, 3])
def test_ids_must_be_non_empty_strings(bad: object) -> None:
    cache = DecoderCache(Registry({}))
    with pytest.raises(DecodeError, match="a schema id must be a non-empty str"):
        cache.get(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "is not a valid event schema"),
        ('{"type": "enum", "name": "X", "symbols": ["A"]}', "must be an Avro record"),
        ('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "Nope"}]}', "Nope"),
    ],
)
def test_schemas_that_do_not_parse_raise_decode_error(text: str, problem: str) -> None:
    cache = DecoderCache(Registry({"sid": text}))
    with pytest.raises(DecodeError) as info:
        cache.get("sid")
    assert "schema 'sid'" in str(info.value) and problem in str(info.value)


def test_failures_of_the_source_propagate_and_are_not_cached() -> None:
    registry = Registry({ACCOUNT_ID: ACCOUNT_JSON})
    registry.fail_next = TransientError("GetSchema unavailable", status="UNAVAILABLE")
    cache = DecoderCache(registry)
    with pytest.raises(TransientError):
        cache.get(ACCOUNT_ID)
    assert cache.get(ACCOUNT_ID)[0].schema_id == ACCOUNT_ID
    assert registry.calls[ACCOUNT_ID] == 2


def test_bytes_from_the_source_are_utf8_text() -> None:
    cache = DecoderCache(lambda sid: ACCOUNT_JSON.encode())  # type: ignore[arg-type,return-value]
    assert cache.schema(ACCOUNT_ID).name == "com.sforce.eventbus.AccountChangeEvent"


def test_add_puts_schemas_in_without_loading() -> None:
    registry = Registry({})
    cache = DecoderCache(registry)
    schema = cache.add(ACCOUNT_JSON)
    assert schema.schema_id == ACCOUNT_ID
    assert cache.schema(ACCOUNT_ID) is schema
    assert cache.add(ACCOUNT_JSON) is schema  # already there: kept
    assert cache.add(EVENT_JSON, schema_id="server-id").schema_id == "server-id"
    assert registry.calls == {}
    with pytest.raises(DecodeError, match="not a valid event schema"):
        cache.add("{")


def test_an_id_that_is_not_the_schemas_fingerprint_is_kept_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = DecoderCache(Registry({"server-id": EVENT_JSON}))
    with caplog.at_level(logging.WARNING, logger="ingest.decoding.cache"):
        schema = cache.schema("server-id")
    assert schema.schema_id == "server-id"
    assert f"differs from the schema's own fingerprint {EVENT_ID}" in caplog.text


def _registry_source(sid: str) -> str:
    return {ACCOUNT_ID: ACCOUNT_JSON}[sid]


def test_a_pickled_cache_starts_empty_with_the_same_loader() -> None:
    cache = DecoderCache(_registry_source)
    cache.get(ACCOUNT_ID)
    copy = pickle.loads(pickle.dumps(cache))
    assert len(copy) == 0 and ACCOUNT_ID not in copy
    assert copy.schema(ACCOUNT_ID).schema_id == ACCOUNT_ID
