"""Parts of landing that need no server: the committer's hand-over bound and failure path, the
Arrow columns of a batch, and choosing topics and the engine for `sfcdc ingest`."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from ingest.errors import ConfigError, LakeError
from ingest.replay import ReplayId
from pipelines.bronze.landing import _arrow, _Committer, _OpenBatch, _Sealed
from pipelines.bronze.tables import BRONZE_SCHEMA
from pipelines.commands.ingest import lake_engine, select_topics
from pipelines.engines import LocalEngine
from pipelines.spec import LakeSpec, load_conf

LOG = logging.getLogger("test")


def _sealed(batch_id: int) -> _Sealed:
    return _Sealed("/event/Order__e", batch_id, "keepalive", ReplayId(b"\x01"), _OpenBatch())


def test_one_batch_at_a_time_is_handed_to_the_committer() -> None:
    release = threading.Event()
    started = threading.Event()
    committed: list[int] = []

    def commit(sealed: _Sealed) -> None:
        started.set()
        release.wait(10)
        committed.append(sealed.batch_id)

    committer = _Committer(commit, logger=LOG)
    committer.start()
    committer.submit(_sealed(1))
    assert started.wait(10)
    second = threading.Thread(target=committer.submit, args=(_sealed(2),))
    second.start()
    second.join(0.3)
    # While batch 1 is being committed, handing over batch 2 waits: the receiver blocks.
    assert second.is_alive() and committed == []
    release.set()
    second.join(10)
    committer.wait_idle()
    committer.close()
    assert committed == [1, 2]


def test_a_failed_commit_surfaces_in_the_consuming_thread() -> None:
    def commit(sealed: _Sealed) -> None:
        raise LakeError(f"disk full while writing batch {sealed.batch_id}")

    committer = _Committer(commit, logger=LOG)
    committer.start()
    committer.submit(_sealed(7))
    with pytest.raises(LakeError, match="batch 7"):
        committer.wait_idle()
    with pytest.raises(LakeError, match="batch 7"):
        committer.submit(_sealed(8))
    committer.close()


def test_a_batch_becomes_bronze_rows_in_stream_order() -> None:
    batch = _OpenBatch()
    batch.replay_ids = [b"\x00\x01", b"\x00\x02", b"\x00\x03"]
    batch.event_ids = ["e1", "e2", "e3"]
    batch.schema_ids = ["s1", "s1", "s2"]
    batch.payloads = [b"a", b"bb", b""]
    batch.times = [1_700_000_000_000_000, 1_700_000_001_000_000]
    batch.counts = [2, 1]
    table = _arrow(_Sealed("/data/ChangeEvents", 4, "events", ReplayId(b"\x00\x03"), batch))
    assert table.schema.equals(BRONZE_SCHEMA)
    rows = table.to_pylist()
    assert [r["replay_id"] for r in rows] == [b"\x00\x01", b"\x00\x02", b"\x00\x03"]
    assert [r["payload"] for r in rows] == [b"a", b"bb", b""]
    assert [(r["batch_id"], r["batch_seq"]) for r in rows] == [(4, 0), (4, 1), (4, 2)]
    assert {r["topic"] for r in rows} == {"/data/ChangeEvents"}
    assert [r["received_at"].timestamp() for r in rows] == [1.7e9, 1.7e9, 1.7e9 + 1]
    # The lists are released once their columns exist.
    assert batch.payloads == [] and batch.event_ids == []


def _conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text("lake: {engine: local, location: ./lake}\n")
    files = {
        "account": "object: Account\nkind: change_events\n",
        "contact": "object: Contact\nkind: change_events\ntopic: /data/ChangeEvents\n",
        "opportunity": "object: Opportunity\nkind: change_events\ntopic: /data/ChangeEvents\n",
        "invoice": "object: Invoice__c\nkind: change_events\nenabled: false\n",
    }
    for name, text in files.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


def test_object_selection(tmp_path: Path) -> None:
    conf = load_conf(_conf(tmp_path))
    assert [t.topic for t in select_topics(conf, None)] == [
        "/data/AccountChangeEvent",
        "/data/ChangeEvents",
    ]
    # Contact shares its topic with Opportunity: the topic is landed whole.
    (shared,) = select_topics(conf, ["Contact"])
    assert shared.topic == "/data/ChangeEvents"
    assert [o.api_name for o in shared.objects] == ["Contact", "Opportunity"]
    with pytest.raises(ConfigError) as info:
        select_topics(conf, ["Acount", "Invoice__c"])
    assert info.value.problems[0].startswith("--objects: no object 'Acount'")
    assert "configured: Account, Contact, Invoice__c, Opportunity" in info.value.problems[0]
    assert "Invoice__c is disabled (enabled: false in" in info.value.problems[1]


def test_landing_uses_the_local_engine_without_spark(tmp_path: Path) -> None:
    for engine in ("local", "auto"):
        chosen = lake_engine(LakeSpec(engine=engine, location=str(tmp_path)), environ={})
        assert isinstance(chosen, LocalEngine)
        with pytest.raises(LakeError, match="without a Spark session"):
            _ = chosen.spark
