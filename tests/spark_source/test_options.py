"""The source's options, offsets and Spark's automatic discovery, without a JVM."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest
from pyspark.sql.datasource import DataSource

from ingest.errors import ConfigError
from ingest.replay import After, Earliest, Latest, ReplayId
from pipelines.spark_source import SalesforceSource
from pipelines.spark_source.offsets import BatchOffset, GapMark, TopicOffset, parse_starting
from pipelines.spark_source.options import parse_options

pytestmark = pytest.mark.spark_source

EMULATOR = {
    "connection.emulator.mode": "external",
    "connection.emulator.grpc_port": "7443",
    "connection.emulator.http_port": "7444",
    "topic": "/data/AccountChangeEvent",
}


def test_options_are_case_insensitive_with_defaults_per_read_kind() -> None:
    stream = parse_options({**EMULATOR, "MAXEVENTSPERTRIGGER": "50"}, streaming=True)
    assert stream.connection.emulator.grpc_port == 7443
    assert stream.max_events_per_trigger == 50
    assert stream.starting["/data/AccountChangeEvent"].position() == Latest()
    batch = parse_options(EMULATOR, streaming=False)
    assert batch.starting["/data/AccountChangeEvent"].position() == Earliest()
    assert (batch.decode, batch.on_corrupted) == ("raw", "fail")


def test_unknown_options_are_refused_listing_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="unknown option") as info:
        parse_options({**EMULATOR, "startReplay": "earliest"}, streaming=True)
    assert "startingreplay" in str(info.value)


def test_connection_keys_are_checked_by_the_spec_without_echoing_values() -> None:
    secret = "s3cr3t-value"
    options = {
        **EMULATOR,
        "connection.source": "salesforce",
        "connection.salesforce.auth.type": "client_credentials",
        "connection.salesforce.auth.client_secret": secret,
    }
    with pytest.raises(ConfigError) as info:
        parse_options(options, streaming=True)
    text = str(info.value) + " ".join(info.value.problems)
    assert "client_secret" in text
    assert secret not in text


def test_an_in_process_emulator_is_refused() -> None:
    with pytest.raises(ConfigError, match="external"):
        parse_options({"topic": "/data/AccountChangeEvent"}, streaming=True)


def test_a_pipeline_file_gives_the_connection_and_replay_defaults(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "pipeline.yml").write_text(
        "connection:\n  source: emulator\n  emulator:\n    mode: external\n"
        "    grpc_port: 7443\n    http_port: 7444\n"
        "defaults:\n  replay: {start: earliest, on_corrupted: latest}\n"
    )
    options = {"pipeline": str(conf / "pipeline.yml"), "topic": "/event/Order_Shipped__e"}
    parsed = parse_options(options, streaming=True)
    assert parsed.connection.emulator.http_port == 7444
    assert parsed.on_corrupted == "latest"
    assert parsed.starting["/event/Order_Shipped__e"].position() == Earliest()


def test_a_stored_replay_id_starts_after_it_and_bad_text_is_refused() -> None:
    rid = ReplayId(b"\x00\x00\x00\x00\x00\x00\x13\x88\xff\x01")
    assert parse_starting(rid.base64()).position() == After(rid)
    assert parse_starting(f"hex:{rid.hex()}").position() == After(rid)
    with pytest.raises(ConfigError, match="startingReplay"):
        parse_options({**EMULATOR, "startingReplay": "yesterday"}, streaming=True)


def test_offsets_round_trip_through_json_losslessly() -> None:
    rid = ReplayId(bytes(range(256))[:10] + b"\xff\xfe")
    offset = BatchOffset(
        {
            "/data/AccountChangeEvent": TopicOffset(after=rid, count=3, last=rid, first=rid),
            "/event/Order_Shipped__e": TopicOffset(start="latest"),
            "/data/ContactChangeEvent": TopicOffset(
                after=rid,
                gaps=(GapMark(at=0, requested=f"after {rid.hex()}", resumed="latest", reason="x"),),
            ),
        }
    )
    text = json.dumps(offset.to_json())
    assert BatchOffset.from_json(json.loads(text)) == offset
    assert offset.topics["/data/ContactChangeEvent"].resting().gaps == ()


def test_spark_discovers_the_source_by_its_module_name() -> None:
    # What pyspark.sql.worker.lookup_data_sources does when a session first needs a Python
    # data source: top-level pyspark_* modules with a DefaultSource.
    found = {}
    for info in pkgutil.iter_modules():
        if info.name == "pyspark_salesforce":
            module = importlib.import_module(info.name)
            source = module.DefaultSource
            assert issubclass(source, DataSource)
            found[source.name()] = source
    assert found == {"salesforce": SalesforceSource}


def test_connection_options_override_a_pipeline_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text("connection:\n  source: emulator\n")
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    options = {
        "pipeline": str(conf / "pipeline.yml"),
        "connection.emulator.mode": "external",
        "connection.emulator.grpc_port": "7443",
        "connection.emulator.http_port": "7444",
        "topic": "/data/AccountChangeEvent",
    }
    parsed = parse_options(options, streaming=True)
    assert parsed.connection.emulator.mode == "external"
    assert parsed.connection.emulator.grpc_port == 7443


def test_replay_gaps_are_rows_for_silver_and_logged_for_raw_unless_asked() -> None:
    assert not parse_options(EMULATOR, streaming=True).gap_rows
    assert parse_options({**EMULATOR, "replayGaps": "ROWS"}, streaming=True).gap_rows
    assert parse_options({**EMULATOR, "decode": "silver"}, streaming=True).gap_rows
    with pytest.raises(ConfigError, match="replayGaps must be 'log' or 'rows'"):
        parse_options({**EMULATOR, "replayGaps": "drop"}, streaming=True)
    with pytest.raises(ConfigError, match="replayGaps=log applies to raw reads only"):
        parse_options({**EMULATOR, "decode": "silver", "replayGaps": "log"}, streaming=True)


def test_a_raw_gap_row_sits_before_the_event_it_preceded() -> None:
    from pipelines.spark_source.feed import Events
    from pipelines.spark_source.rows import RAW_GAPS_SCHEMA, raw_batch

    events = Events(
        replay_ids=[b"\x01", b"\x02"],
        event_ids=["e1", "e2"],
        schema_ids=["s", "s"],
        payloads=[b"p1", b"p2"],
        received_at=[1.0, 2.0],
        gaps=[GapMark(at=1, requested="after 01", resumed="latest", reason="purged")],
    )
    plain = raw_batch("/event/X__e", events)
    assert plain.num_rows == 2 and "replay_gap" not in plain.schema.names
    rows = raw_batch("/event/X__e", events, gap_rows=True).to_pylist()
    assert [r["event_id"] for r in rows] == ["e1", None, "e2"]
    assert rows[1]["replay_gap"].startswith(
        "replay gap on /event/X__e: the stored position after 01"
    )
    assert rows[1]["received_at"] == rows[2]["received_at"]
    nullable = {f.name for f in RAW_GAPS_SCHEMA.fields if f.nullable}
    assert nullable == {"replay_id", "event_id", "schema_id", "payload", "replay_gap"}
    only_gap = Events(gaps=[GapMark(at=0, requested="r", resumed="latest", reason="x")])
    assert raw_batch("/event/X__e", only_gap, gap_rows=True).num_rows == 1
    assert raw_batch("/event/X__e", Events(), gap_rows=True).num_rows == 0
