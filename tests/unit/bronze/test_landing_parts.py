"""Parts of landing that need no server: the committer's rounds, hand-over bounds and failure
path, the Arrow columns of a batch, and choosing topics and the engine for `sfcdc ingest`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.errors import ConfigError, LakeError
from ingest.replay import ReplayId
from pipelines.bronze.batches import OpenBatch, SealedBatch, bronze_rows
from pipelines.bronze.cometd_batches import CometdOpenBatch, CometdSealedBatch
from pipelines.bronze.cometd_commit import CometdCommitter
from pipelines.bronze.commit_thread import CommitThread
from pipelines.bronze.committer import BatchCommitter, Maintainer
from pipelines.bronze.tables import BRONZE_SCHEMA
from pipelines.commands.ingest import select_topics
from pipelines.engines import LocalEngine, TableRef
from pipelines.spec import LakeSpec, load_conf

LOG = logging.getLogger("test")


def _sealed(batch_id: int, topic: str = "/event/Order__e", nbytes: int = 0) -> SealedBatch:
    batch = OpenBatch()
    batch.nbytes = nbytes
    return SealedBatch(topic, batch_id, "keepalive", ReplayId(b"\x01"), batch)


def _committer(
    commit: Callable[[list[SealedBatch]], None], *, limit: int = 1, max_bytes: int | None = None
) -> CommitThread[SealedBatch]:
    """The committer thread as the Pub/Sub landing makes it."""
    return CommitThread(
        commit,
        stream=BatchCommitter.stream,
        describe=BatchCommitter.describe,
        name="sfcdc-committer",
        logger=LOG,
        limit=limit,
        max_bytes=max_bytes,
    )


def _submitting(committer: CommitThread[SealedBatch], sealed: SealedBatch) -> threading.Thread:
    thread = threading.Thread(target=committer.submit, args=(sealed,))
    thread.start()
    thread.join(0.3)
    return thread


def test_a_batch_may_wait_while_a_round_commits_and_the_next_hand_over_blocks() -> None:
    release = threading.Event()
    started = threading.Event()
    rounds: list[list[int]] = []

    def commit(round_: list[SealedBatch]) -> None:
        started.set()
        release.wait(10)
        rounds.append([s.batch_id for s in round_])

    committer = _committer(commit)
    committer.start()
    committer.submit(_sealed(1))
    assert started.wait(10)
    # While batch 1 is being committed, batch 2 may wait in the committer...
    assert not _submitting(committer, _sealed(2)).is_alive()
    # ...and handing over batch 3 waits: the receiver blocks, memory stays bounded.
    third = _submitting(committer, _sealed(3))
    assert third.is_alive() and rounds == []
    release.set()
    third.join(10)
    committer.wait_idle()
    committer.close()
    assert rounds == [[1], [2], [3]]


def test_a_round_takes_the_oldest_waiting_batch_of_each_topic() -> None:
    release = threading.Event()
    started = threading.Event()
    rounds: list[list[tuple[str, int]]] = []

    def commit(round_: list[SealedBatch]) -> None:
        started.set()
        release.wait(10)
        rounds.append([(s.topic[-1], s.batch_id) for s in round_])

    committer = _committer(commit, limit=3, max_bytes=100)
    committer.start()
    committer.submit(_sealed(1, "/event/A"))
    assert started.wait(10)
    for sealed in (_sealed(2, "/event/A"), _sealed(1, "/event/B"), _sealed(3, "/event/A")):
        assert not _submitting(committer, sealed).is_alive()
    # Three are waiting (the limit): the next hand-over waits.
    blocked = _submitting(committer, _sealed(2, "/event/B"))
    assert blocked.is_alive()
    release.set()
    blocked.join(10)
    committer.wait_idle()
    committer.close()
    assert rounds[:2] == [[("A", 1)], [("A", 2), ("B", 1)]]
    # A3 and B2 follow, together or apart (B2 was handed over while they committed).
    assert sorted(x for r in rounds[2:] for x in r) == [("A", 3), ("B", 2)]
    assert all(len({topic for topic, _ in r}) == len(r) for r in rounds)


def test_waiting_batches_are_bounded_by_bytes_too() -> None:
    release = threading.Event()
    started = threading.Event()

    def commit(round_: list[SealedBatch]) -> None:
        started.set()
        release.wait(10)

    committer = _committer(commit, limit=10, max_bytes=100)
    committer.start()
    committer.submit(_sealed(1, "/event/A", nbytes=80))
    assert started.wait(10)
    assert not _submitting(committer, _sealed(1, "/event/B", nbytes=80)).is_alive()
    # 80 bytes wait (under 100): one more may join them; then 160 wait and hand-overs block.
    assert not _submitting(committer, _sealed(1, "/event/C", nbytes=80)).is_alive()
    blocked = _submitting(committer, _sealed(1, "/event/D", nbytes=1))
    assert blocked.is_alive()
    release.set()
    blocked.join(10)
    committer.wait_idle()
    committer.close()


def test_a_failed_commit_surfaces_in_the_consuming_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def commit(round_: list[SealedBatch]) -> None:
        raise LakeError(f"disk full while writing batch {round_[0].batch_id}")

    committer = _committer(commit)
    committer.start()
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        committer.submit(_sealed(7))
        with pytest.raises(LakeError, match="batch 7"):
            committer.wait_idle()
    with pytest.raises(LakeError, match="batch 7"):
        committer.submit(_sealed(8))
    committer.close()
    assert caplog.messages == [
        "committing /event/Order__e batch 7 failed: disk full while writing batch 7"
    ]


def test_each_landing_names_a_failed_round_its_own_way() -> None:
    pubsub = [_sealed(3, "/event/A"), _sealed(5, "/event/B")]
    assert BatchCommitter.describe(pubsub) == "committing /event/A batch 3, /event/B batch 5"
    streaming = [
        CometdSealedBatch("Account", 1, "events", 4, CometdOpenBatch()),
        CometdSealedBatch("Contact", 2, "events", 9, CometdOpenBatch()),
    ]
    assert CometdCommitter.describe(streaming) == ("streaming: committing ['Account', 'Contact']")
    assert [CometdCommitter.stream(s) for s in streaming] == ["Account", "Contact"]


def test_a_batch_becomes_bronze_rows_in_stream_order() -> None:
    batch = OpenBatch()
    batch.replay_ids = [b"\x00\x01", b"\x00\x02", b"\x00\x03"]
    batch.event_ids = ["e1", "e2", "e3"]
    batch.schema_ids = ["s1", "s1", "s2"]
    batch.payloads = [b"a", b"bb", b""]
    batch.times = [1_700_000_000_000_000, 1_700_000_001_000_000]
    batch.counts = [2, 1]
    table = bronze_rows(
        SealedBatch("/data/ChangeEvents", 4, "events", ReplayId(b"\x00\x03"), batch)
    )
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


def test_the_local_engine_runs_without_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    from pipelines.session import engine_for

    # ``auto`` outside Databricks and outside an active Spark session (another test in the
    # same process may have started the shared one) is the local engine.
    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    for engine in ("local", "auto"):
        chosen = engine_for(LakeSpec(engine=engine, location=str(tmp_path)), environ={})
        assert isinstance(chosen, LocalEngine)
        with pytest.raises(LakeError, match="without a Spark session"):
            _ = chosen.spark


def test_maintenance_runs_beside_the_commits_once_per_waiting_table_and_failures_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    started = threading.Event()
    done: list[str] = []
    a, b = TableRef("bronze", "a"), TableRef("bronze", "b")

    def maintain(table: TableRef) -> None:
        started.set()
        release.wait(10)
        if table == b:
            raise LakeError("disk full")
        done.append(table.name)

    maintainer = Maintainer(maintain, logger=LOG)
    maintainer.request(a)  # returns at once: the caller (the committer) goes on
    assert started.wait(10)
    for table in (b, a, b):  # asked for while waiting: once each
        maintainer.request(table)
    with caplog.at_level(logging.ERROR, logger="test"):
        release.set()
        deadline = threading.Event()
        while len(done) < 2 and not deadline.wait(0.01):
            pass
        maintainer.close()
    assert done == ["a", "a"]
    assert any(
        "maintenance of bronze.b failed (landing goes on): disk full" in r.getMessage()
        for r in caplog.records
    )


def test_closing_the_maintainer_finishes_what_waits_then_ignores_requests() -> None:
    release = threading.Event()
    started = threading.Event()
    done: list[str] = []

    def maintain(table: TableRef) -> None:
        started.set()
        release.wait(10)
        done.append(table.name)

    maintainer = Maintainer(maintain, logger=LOG)
    maintainer.request(TableRef("bronze", "a"))
    assert started.wait(10)
    maintainer.request(TableRef("bronze", "b"))
    closing = threading.Thread(target=maintainer.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # the maintenance under way, then the waiting one, finish first
    release.set()
    closing.join(10)
    assert not closing.is_alive()
    assert done == ["a", "b"]
    maintainer.request(TableRef("bronze", "c"))  # after close: ignored
    assert done == ["a", "b"]
