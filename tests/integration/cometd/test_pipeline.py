"""The Streaming API source end to end on the local engine (the layers are one definition
for both engines; ``test_bronze_landing`` lands on the spark engine too): PushTopic and generic
channels landed from the emulator over loopback HTTPS into bronze exactly once (the replay
checkpoint in step with the bronze commits), decoded into silver from the stored describe,
merged into gold by Id; malformed messages, fields the describe lacks and bodies that are not
JSON go to the quarantine while the channels go on; ``status`` and ``validate`` report the
channels."""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from ingest.emulator.server import Emulator
from pipelines.bronze.cometd import CometdLanding
from pipelines.bronze.cometd_tables import COMETD_BRONZE_SCHEMA, replay_number
from pipelines.bronze.landing import LandingResult
from pipelines.bronze.tables import bronze_app_id
from pipelines.cometd_pipeline import land_streams, run_cometd_pass
from pipelines.commands.status import format_status, read_status
from pipelines.commands.validate import describe
from pipelines.engines import LakeEngine, TableRef
from pipelines.engines.local import LocalEngine
from pipelines.ops.recorder import recorder_for
from pipelines.ops.table import OPS_TABLE
from pipelines.spec import Conf, load_conf
from tests.cometd_helpers import token_manager
from tests.integration.cometd.lake import (
    ACCTS,
    CREATED,
    account,
    checkpoints,
    inject,
    ordered,
    write_conf,
)

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

A = "001000000000001AAA"
B = "001000000000002AAA"
HARD = ACCTS.replace("/topic/Accts", "/topic/AcctsHard") + "gold: {deletes: hard}\n"
NEWS = "kind: streaming_api\nchannel: /u/News\n"
OBJECTS = {"accts": ACCTS, "accts_hard": HARD, "news": NEWS}
NOT_JSON = b"<html><body>502 Bad Gateway</body></html>"


class CorruptOneConnect(httpx.BaseTransport):
    """Real HTTPS to the emulator, except that the first ``/meta/connect`` reply carrying
    notifications is replaced by a body that is not JSON (a proxy's error page)."""

    def __init__(self, ca_file: Path) -> None:
        self._inner = httpx.HTTPTransport(verify=ssl.create_default_context(cafile=str(ca_file)))
        self.corrupted = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        body = response.read()
        if not self.corrupted and b"/meta/connect" in request.content and b'"data"' in body:
            self.corrupted += 1
            return httpx.Response(200, headers={"Content-Type": "text/html"}, content=NOT_JSON)
        return response

    def close(self) -> None:
        self._inner.close()


def _land(conf: Conf, engine: LakeEngine, emulator: Emulator, **options: Any) -> LandingResult:
    landing = CometdLanding(
        engine,
        conf.enabled_streams(),
        tokens=token_manager(emulator),
        ca_file=emulator.ca_cert_path,
        streaming=conf.pipeline.streaming_api,
        ingest=conf.pipeline.ingest,
        **options,
    )
    return landing.run(once=True)


def _by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["Id"]: r for r in rows}


def test_channels_land_once_decode_merge_and_quarantine(
    tmp_path: Path, tls_emulator: Emulator
) -> None:
    emu = tls_emulator
    channel_id = emu.streaming.create_channel("/u/News")
    conf = load_conf(write_conf(tmp_path, emu, OBJECTS))
    engine = LocalEngine(location=tmp_path / "lake")

    # The first landing makes the PushTopics and stores Account's describe.
    first = _land(conf, engine, emu)
    assert sum(t.events for t in first.topics) == 0
    names = {r["Name"] for r in emu.streaming.push_topics.records()}
    assert names == {"Accts", "AcctsHard"}

    account(emu, "CREATE", A, {"Name": "Acme", "Industry": "Energy", "NumberOfEmployees": 5})
    account(emu, "CREATE", B, {"Name": "Beta", "Industry": "Retail", "NumberOfEmployees": 7})
    account(emu, "UPDATE", A, {"Industry": "Banking"})
    unknown = inject(
        emu, "/topic/Accts", {"event": {"type": "updated"}, "sobject": {"Id": A, "Bogus__c": 1}}
    )
    no_sobject = inject(emu, "/topic/Accts", {"event": {"type": "updated"}})
    account(emu, "DELETE", B)
    emu.streaming.push(channel_id, "plain text, not JSON", '{"a": 1}')
    account(emu, "UPDATE", A, {"NumberOfEmployees": 9})

    transport = CorruptOneConnect(emu.ca_cert_path)
    with httpx.Client(transport=transport, timeout=30) as http:
        second = _land(conf, engine, emu, http=http)
    assert transport.corrupted == 1
    landed = {t.topic: t.events for t in second.topics}
    assert landed == {
        "streaming:/topic/Accts": 7,
        "streaming:/topic/AcctsHard": 5,
        "streaming:/u/News": 2,
    }

    # Bronze: every notification once, in replay id order; the body that was not JSON kept.
    accts = ordered(
        engine, TableRef("bronze", "streaming_accts"), "replay_id", "channel", "malformed"
    )
    good = [r["replay_id"] for r in accts if r["malformed"] is None]
    assert good == [1, 2, 3, 4, 5, 6, 7]
    bad = [r for r in accts if r["malformed"] is not None]
    assert [(r["replay_id"], r["channel"]) for r in bad] == [(None, None)]
    for table, count in (("streaming_accts_hard", 5), ("streaming_news", 2)):
        ids = [r["replay_id"] for r in ordered(engine, TableRef("bronze", table), "replay_id")]
        assert ids == list(range(1, count + 1)), table

    # The checkpoint rows follow the bronze commits batch for batch and end at the last id.
    for spec in conf.enabled_streams():
        rows = checkpoints(engine, spec.key)
        assert [r["batch_id"] for r in rows] == list(range(1, len(rows) + 1))
        bronze = TableRef("bronze", spec.tables.bronze)
        assert engine.txn_version(bronze, bronze_app_id(spec.key)) == rows[-1]["batch_id"]
        assert replay_number(rows[-1]["replay_id"]) == landed_last(second, spec.key)

    # A new landing resumes after the checkpoints: nothing comes twice.
    third = _land(conf, engine, emu)
    assert sum(t.events for t in third.topics) == 0
    assert engine.read_arrow(TableRef("bronze", "streaming_accts")).num_rows == len(accts)

    passed = run_cometd_pass(engine, conf)
    quarantined = {s.stream: s.quarantined for s in passed.silver.streams}
    assert quarantined == {
        "streaming:/topic/Accts": 3,
        "streaming:/topic/AcctsHard": 0,
        "streaming:/u/News": 0,
    }

    # Silver: typed from the describe, the event type kept.
    silver = engine.read_arrow(TableRef("silver", "accts"))
    assert silver.schema.field("NumberOfEmployees").type == pa.int32()
    assert silver.schema.field("Name").type == pa.string()
    rows = sorted(silver.to_pylist(), key=lambda r: r["_cdc_replay_number"])
    assert [
        (r["_cdc_replay_number"], r["_cdc_event_type"], r["_cdc_change_type"]) for r in rows
    ] == [
        (1, "created", "CREATE"),
        (2, "created", "CREATE"),
        (3, "updated", "UPDATE"),
        (6, "deleted", "DELETE"),
        (7, "updated", "UPDATE"),
    ]
    assert rows[-1]["NumberOfEmployees"] == 9

    # Generic payloads are strings, with their replay id and createdDate.
    news = sorted(
        engine.read_arrow(TableRef("silver", "news")).to_pylist(),
        key=lambda r: r["_cdc_replay_number"],
    )
    assert [r["payload"] for r in news] == ["plain text, not JSON", '{"a": 1}']
    assert all(r["_cdc_channel"] == "/u/News" and r["_cdc_created_date"] for r in news)

    # Quarantine: reason and replay id of each bad message; the others went on.
    bad_rows = engine.read_arrow(
        TableRef("silver", "sfcdc_quarantine"), where=[("bronze_table", "=", "streaming_accts")]
    ).to_pylist()
    got = {(r["reason_kind"], r["replay_id"]) for r in bad_rows}
    assert got == {
        ("unknown_field", str(unknown).encode()),
        ("malformed_message", str(no_sobject).encode()),
        ("not_json", None),
    }
    reasons = {r["reason_kind"]: r["reason"] for r in bad_rows}
    assert "Bogus__c" in reasons["unknown_field"]
    assert "data.sobject" in reasons["malformed_message"]
    assert "not JSON" in reasons["not_json"]
    assert any(r["payload"] == NOT_JSON for r in bad_rows)

    # Gold: merged by Id in replay id order; deletes soft or hard as each file says.
    soft = _by_id(engine.read_arrow(TableRef("gold", "accts")).to_pylist())
    assert soft[A]["Industry"] == "Banking"
    assert soft[A]["NumberOfEmployees"] == 9
    assert soft[A]["_cdc_is_deleted"] is False
    assert soft[B]["_cdc_is_deleted"] is True
    assert soft[B]["Name"] == "Beta"
    hard = _by_id(engine.read_arrow(TableRef("gold", "accts_hard")).to_pylist())
    assert set(hard) == {A}
    assert (hard[A]["Industry"], hard[A]["NumberOfEmployees"]) == ("Banking", 9)

    # status and validate cover the channels.
    status = read_status(engine, conf)
    topics = {t.topic: t for t in status.topics}
    assert topics["streaming:/topic/Accts"].replay_id == "7"
    assert topics["streaming:/topic/Accts"].quarantined == 3
    assert topics["streaming:/u/News"].events_landed == 2
    objects = {o.object: o for o in status.objects}
    assert objects["streaming:/topic/AcctsHard"].gold_table == "gold.accts_hard"
    assert objects["streaming:/topic/Accts"].bronze_lag == 0
    assert objects["streaming:/u/News"].gold_table is None
    text = "\n".join(describe(conf))
    assert "/topic/Accts" in text
    assert "gold.accts_hard (hard deletes)" in text
    assert "/u/News" in text


def landed_last(result: LandingResult, key: str) -> int | None:
    by_key: Mapping[str, Any] = {t.topic: t for t in result.topics}
    last = by_key[key].last_replay_id
    return int(last) if last is not None else None


def test_land_streams_resumes_from_the_checkpoint_after_new_notifications(
    tmp_path: Path, tls_emulator: Emulator
) -> None:
    emu = tls_emulator
    conf = load_conf(write_conf(tmp_path, emu, {"accts": ACCTS}))
    engine = LocalEngine(location=tmp_path / "lake")
    tokens = token_manager(emu)
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True)
    account(emu, "CREATE", A, {"Name": "Acme", "Industry": "Energy"})
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True)
    account(emu, "UPDATE", A, {"Industry": "Banking"})
    account(emu, "UPDATE", A, {"Name": "Acme Corp"})
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True)
    rows = ordered(engine, TableRef("bronze", "streaming_accts"), "replay_id", "event_type")
    assert [(r["replay_id"], r["event_type"]) for r in rows] == [
        (1, "created"),
        (2, "updated"),
        (3, "updated"),
    ]


def _late(replay_id: int, industry: str, batch_id: int, seq: int) -> dict[str, Any]:
    """A bronze row of an ``updated`` notification on A, as landing writes it."""
    message = {
        "channel": "/topic/Accts",
        "data": {
            "event": {"createdDate": CREATED, "replayId": replay_id, "type": "updated"},
            "sobject": {"Id": A, "Name": "Acme", "Industry": industry, "NumberOfEmployees": 5},
        },
    }
    return {
        "replay_id": replay_id,
        "channel": "/topic/Accts",
        "event_type": "updated",
        "created_date": CREATED,
        "event_uuid": None,
        "raw": json.dumps(message),
        "malformed": None,
        "received_at": datetime.now(timezone.utc),
        "batch_id": batch_id,
        "batch_seq": seq,
    }


def test_gold_applies_notifications_in_replay_id_order_whatever_their_arrival(
    tmp_path: Path, tls_emulator: Emulator
) -> None:
    emu = tls_emulator
    conf = load_conf(write_conf(tmp_path, emu, {"accts": ACCTS}))
    engine = LocalEngine(location=tmp_path / "lake")
    tokens = token_manager(emu)
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True)
    account(emu, "CREATE", A, {"Name": "Acme", "Industry": "Energy", "NumberOfEmployees": 5})
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True)
    bronze = TableRef("bronze", "streaming_accts")

    # Two notifications of one record arriving newest first, in one batch ...
    rows = [_late(21, "Newest", 90, 0), _late(20, "Older", 90, 1)]
    engine.append(bronze, pa.Table.from_pylist(rows, schema=COMETD_BRONZE_SCHEMA))
    run_cometd_pass(engine, conf)
    (gold,) = engine.read_arrow(TableRef("gold", "accts")).to_pylist()
    assert (gold["Industry"], gold["_cdc_last_replay_id"]) == ("Newest", b"21")

    # ... and an older one arriving in a later pass: neither overwrites the newest.
    late = [_late(19, "Oldest", 91, 0)]
    engine.append(bronze, pa.Table.from_pylist(late, schema=COMETD_BRONZE_SCHEMA))
    run_cometd_pass(engine, conf)
    (gold,) = engine.read_arrow(TableRef("gold", "accts")).to_pylist()
    assert (gold["Industry"], gold["_cdc_last_replay_id"]) == ("Newest", b"21")


def test_commits_table_gives_the_channels_lag_rate_and_health(
    tmp_path: Path, tls_emulator: Emulator
) -> None:
    emu = tls_emulator
    conf = load_conf(write_conf(tmp_path, emu, {"accts": ACCTS, "news": NEWS}))
    engine = LocalEngine(location=tmp_path / "lake")
    tokens = token_manager(emu)
    channel_id = emu.streaming.create_channel("/u/News")
    ops = recorder_for(engine, conf)
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True, ops=ops)
    account(emu, "CREATE", A, {"Name": "Acme", "Industry": "Energy"})
    account(emu, "UPDATE", A, {"Industry": "Banking"})
    emu.streaming.push(channel_id, "hello")
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True, ops=ops)
    run_cometd_pass(engine, conf, on_commit=ops.record)
    ops.flush()

    commits = engine.read_arrow(OPS_TABLE).to_pylist()
    landed = {
        (r["topic"], r["table_name"]): r["events"]
        for r in commits
        if r["layer"] == "bronze" and r["kind"] == "commit"
    }
    assert landed == {
        ("streaming:/topic/Accts", "bronze.streaming_accts"): 2,
        ("streaming:/u/News", "bronze.streaming_news"): 1,
    }
    # An empty connect after the last commit: both channels were caught up.
    caught = {r["topic"] for r in commits if r["layer"] == "bronze" and r["kind"] == "caught_up"}
    assert caught == {"streaming:/topic/Accts", "streaming:/u/News"}
    applied = {
        (r["layer"], r["table_name"]): (r["events"], r["newest_commit_at"] is not None)
        for r in commits
        if r["layer"] in ("silver", "gold")
    }
    assert applied == {
        ("silver", "silver.accts"): (2, True),
        ("silver", "silver.news"): (1, True),
        ("gold", "gold.accts"): (2, True),
    }

    status = read_status(engine, conf)
    objects = {o.object: o for o in status.objects}
    accts = objects["streaming:/topic/Accts"]
    assert [h.layer for h in accts.layers] == ["bronze", "silver", "gold"]
    assert all(h.behind_seconds is not None for h in accts.layers)
    assert accts.behind_seconds is not None and accts.behind_seconds < 300
    assert accts.state == "OK", accts.reasons
    news = objects["streaming:/u/News"]
    assert [h.layer for h in news.layers] == ["bronze", "silver"]
    assert news.state == "OK", news.reasons
    assert "lag unknown" not in "\n".join(format_status(status))


def test_a_channel_drained_with_its_batch_open_is_caught_up(
    tmp_path: Path, tls_emulator: Emulator
) -> None:
    # The batch never ages out during the run: the empty connect that ends a --once landing
    # finds the notifications still open, and the landing commits them as it stops. That
    # commit is when the channel was caught up; without a caught_up row its lag is measured
    # from the notifications' own commit times, on the org's clock, alone.
    emu = tls_emulator
    slow = "{max_events: 100, max_bytes: 1MiB, max_age_seconds: 600}"
    conf = load_conf(write_conf(tmp_path, emu, {"accts": ACCTS}, batching=slow))
    engine = LocalEngine(location=tmp_path / "lake")
    tokens = token_manager(emu)
    ops = recorder_for(engine, conf)
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True, ops=ops)
    account(emu, "CREATE", A, {"Name": "Acme", "Industry": "Energy"})
    account(emu, "UPDATE", A, {"Industry": "Banking"})
    started = datetime.now(timezone.utc)
    land_streams(conf, engine=engine, tokens=tokens, ca_file=emu.ca_cert_path, once=True, ops=ops)
    run_cometd_pass(engine, conf, on_commit=ops.record)
    ops.flush()

    commits = engine.read_arrow(OPS_TABLE).to_pylist()
    landed = [r for r in commits if r["layer"] == "bronze" and r["kind"] == "commit"]
    assert [r["events"] for r in landed] == [2]
    caught = [
        r["visible_at"]
        for r in commits
        if r["layer"] == "bronze" and r["kind"] == "caught_up" and r["visible_at"] >= started
    ]
    assert caught, "the channel drained in the second landing is not recorded caught up"
    (accts,) = read_status(engine, conf).objects
    assert accts.behind_seconds is not None and accts.behind_seconds < 300, accts.layers
    assert accts.state == "OK", accts.reasons
