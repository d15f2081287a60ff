"""Landing in one process: exact contents, batching, keepalives, reconnects, replay gaps,
managed subscriptions and clean stops, against the emulator and real Delta tables."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from ingest.emulator.eventlog import encode_replay_id
from ingest.emulator.server import Emulator
from ingest.errors import ReplayIdError
from pipelines.bronze import BronzeLanding
from pipelines.bronze.bookkeeping import BOOKKEEPING as BRONZE_BOOKKEEPING
from pipelines.commands.ingest import land
from pipelines.connect import connect, secret_resolver
from pipelines.engines import LocalEngine, TableRef
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.bronze.conftest import (
    ACCOUNT,
    CHANNEL,
    CONTACT,
    MANAGED,
    ORDER_OBJECT,
    ORDERS,
    checkpoint_rows,
    expected,
    landed,
    wait_for,
    write_conf,
)
from tests.integration.client.conftest import fill

pytestmark = pytest.mark.integration


def test_every_topic_lands_exactly_with_schemas_and_checkpoints(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    fill(emulator, 250, ACCOUNT)
    fill(emulator, 120, CONTACT)
    fill(emulator, 230, ORDERS)
    conf_dir = write_conf(tmp_path, emulator, engine=lake_kind)
    result = land(load_conf(conf_dir), once=True)

    assert result.stopped.startswith("drained")
    # The first landing of a lake creates every bronze bookkeeping table, written to or not.
    reader = LocalEngine(location=tmp_path / "lake")
    assert [t.table for t in BRONZE_BOOKKEEPING if not reader.exists(t.table)] == []
    for topic in (ACCOUNT, CHANNEL, ORDERS):
        assert landed(conf_dir, topic) == expected(emulator, topic), topic
    assert {t.topic: t.events for t in result.topics} == {ACCOUNT: 250, CHANNEL: 370, ORDERS: 230}

    rows = checkpoint_rows(conf_dir, ACCOUNT)
    events = [r for r in rows if r["kind"] == "events"]
    assert [r["batch_id"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(r["event_count"] <= 100 for r in events)
    assert sum(r["event_count"] for r in events) == 250
    assert rows[-1]["replay_id"] is not None
    # Every schema the bronze rows use is in the registry, once.
    engine = LocalEngine(location=tmp_path / "lake")
    registry = engine.read_arrow(TableRef("bronze", "sfcdc_schemas")).to_pylist()
    used = set()
    for table in ("account_change_event", "change_events", "order_shipped__e"):
        rows = engine.read_arrow(TableRef("bronze", table), columns=["schema_id"])
        used |= set(rows.column("schema_id").to_pylist())
    assert sorted(r["schema_id"] for r in registry) == sorted(used)
    assert {r["topic"] for r in registry} <= {ACCOUNT, CHANNEL, ORDERS}

    # A second run resumes after the checkpoints: only the new events land, nothing twice.
    fill(emulator, 40, ACCOUNT, start=250)
    again = land(load_conf(conf_dir), once=True)
    assert {t.topic: t.events for t in again.topics} == {ACCOUNT: 40, CHANNEL: 40, ORDERS: 0}
    assert landed(conf_dir, ACCOUNT) == expected(emulator, ACCOUNT)
    assert landed(conf_dir, CHANNEL) == expected(emulator, CHANNEL)
    assert len(engine.read_arrow(TableRef("bronze", "sfcdc_schemas"))) == len(registry)


def test_keepalive_only_periods_advance_the_checkpoint(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    conf_dir = write_conf(tmp_path, emulator, engine=lake_kind, objects={"order": ORDER_OBJECT})
    first = land(load_conf(conf_dir), once=True)
    assert first.events == 0
    (row,) = checkpoint_rows(conf_dir, ORDERS)
    assert row["kind"] == "keepalive" and row["event_count"] == 0
    assert row["replay_id"] == bytes.fromhex(first.topics[0].last_replay_id or "")

    # Quiet again: the checkpoint moves on to a newer keepalive position.
    land(load_conf(conf_dir), once=True)
    rows = checkpoint_rows(conf_dir, ORDERS)
    assert [r["kind"] for r in rows] == ["keepalive", "keepalive"]
    assert rows[1]["replay_id"] != rows[0]["replay_id"]

    # Resuming after a keepalive position delivers exactly the events appended since.
    fill(emulator, 7, ORDERS)
    land(load_conf(conf_dir), once=True)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)


def test_stream_cuts_resume_after_the_durable_position(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    fill(emulator, 600, ACCOUNT)
    fill(emulator, 300, ORDERS)
    emulator.faults.cut_streams(37, repeat=True)
    conf_dir = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"account": "object: Account\nkind: change_events\n", "order": ORDER_OBJECT},
        batching="{max_events: 50, max_bytes: 1MiB, max_age_seconds: 0.1}",
    )
    result = land(load_conf(conf_dir), once=True)
    assert landed(conf_dir, ACCOUNT) == expected(emulator, ACCOUNT)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)
    # Events received but not committed when a stream was cut came again and landed once.
    assert sum(t.received for t in result.topics) >= 900


def test_batches_commit_by_age_on_a_quiet_topic(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    conf_dir = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"order": ORDER_OBJECT},
        batching="{max_events: 10000, max_bytes: 64MiB, max_age_seconds: 0.3}",
    )
    conf = load_conf(conf_dir)
    with connect(conf.pipeline.connection, secrets=secret_resolver()) as source:
        landing = BronzeLanding(
            engine_for(conf.pipeline.lake),
            conf.topics(),
            channel=source.channel,
            tokens=source.tokens,
            ingest=conf.pipeline.ingest,
        )
        runner = threading.Thread(target=landing.run)
        runner.start()
        try:
            fill(emulator, 5, ORDERS)
            # No further item arrives for this batch: its age alone commits it.
            wait_for(lambda: landing.snapshot().events == 5, what="the aged batch to commit")
            assert runner.is_alive()
        finally:
            landing.stop()
            runner.join(timeout=20)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)


def test_stop_commits_the_open_batch(emulator: Emulator, tmp_path: Path, lake_kind: str) -> None:
    conf_dir = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"order": ORDER_OBJECT},
        batching="{max_events: 10000, max_bytes: 64MiB, max_age_seconds: 600}",
    )
    conf = load_conf(conf_dir)
    fill(emulator, 42, ORDERS)
    with connect(conf.pipeline.connection, secrets=secret_resolver()) as source:
        landing = BronzeLanding(
            engine_for(conf.pipeline.lake),
            conf.topics(),
            channel=source.channel,
            tokens=source.tokens,
            ingest=conf.pipeline.ingest,
        )
        results = []
        runner = threading.Thread(target=lambda: results.append(landing.run()))
        runner.start()
        try:
            wait_for(
                lambda: sum(t.received for t in landing.snapshot().topics) == 42,
                what="42 events received",
            )
            assert landing.snapshot().events == 0  # still in the open batch
        finally:
            landing.stop("test says stop")
            runner.join(timeout=20)
    (result,) = results
    assert result.stopped == "test says stop"
    assert result.events == 42
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)


def _purge_after_landing(emulator: Emulator, conf_dir: Path) -> None:
    fill(emulator, 20, ORDERS)
    land(load_conf(conf_dir), once=True)
    # The checkpointed position (and everything before it) leaves the retention window.
    emulator.faults.purge(through=encode_replay_id(emulator.bus.position))
    fill(emulator, 10, ORDERS, start=20)


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_a_purged_checkpoint_follows_the_policy_and_records_the_gap(
    emulator: Emulator,
    tmp_path: Path,
    policy: str,
    caplog: pytest.LogCaptureFixture,
    lake_kind: str,
) -> None:
    conf_dir = write_conf(tmp_path, emulator, engine=lake_kind, objects={"order": ORDER_OBJECT})
    _purge_after_landing(emulator, conf_dir)
    stored = checkpoint_rows(conf_dir, ORDERS)[-1]["replay_id"]
    (conf_dir / "objects" / "order.yml").write_text(
        ORDER_OBJECT + f"replay: {{on_corrupted: {policy}}}\n"
    )
    with caplog.at_level(logging.WARNING, logger="pipelines.bronze.landing"):
        result = land(load_conf(conf_dir), once=True)

    gap = next(r for r in checkpoint_rows(conf_dir, ORDERS) if r["kind"] == "replay_gap")
    assert gap["gap_requested"] == f"after:{stored.hex()}"
    assert gap["gap_resumed"] == policy
    assert gap["replay_id"] is None and "rejected" in gap["detail"]
    assert result.topics[0].replay_gaps == 1
    assert any("REPLAY GAP" in r.getMessage() for r in caplog.records)
    assert len(expected(emulator, ORDERS)) == 10  # the first twenty were purged
    bronze = landed(conf_dir, ORDERS)
    if policy == "earliest":
        # Everything still retained after the gap is landed, once.
        assert bronze[20:] == expected(emulator, ORDERS)
    else:
        # Latest skips what was published before resubscribing; later events land.
        assert len(bronze) == 20
        fill(emulator, 5, ORDERS, start=30)
        land(load_conf(conf_dir), once=True)
        assert landed(conf_dir, ORDERS)[20:] == expected(emulator, ORDERS)[-5:]


def test_a_purged_checkpoint_with_policy_fail_stops_with_the_reason(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    conf_dir = write_conf(tmp_path, emulator, engine=lake_kind, objects={"order": ORDER_OBJECT})
    _purge_after_landing(emulator, conf_dir)
    before = checkpoint_rows(conf_dir, ORDERS)
    with pytest.raises(ReplayIdError, match=r"rejected replay id .* on_corrupted='earliest'"):
        land(load_conf(conf_dir), once=True)
    assert checkpoint_rows(conf_dir, ORDERS) == before
    assert len(landed(conf_dir, ORDERS)) == 20


def test_managed_subscription_commits_only_after_delta(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    orders = fill(emulator, 400, ORDERS)
    conf_dir = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"order": ORDER_OBJECT + f"managed_subscription: {MANAGED}\n"},
        batching="{max_events: 60, max_bytes: 1MiB, max_age_seconds: 0.1}",
    )
    sub_id = emulator.managed.by_name(MANAGED).config.subscription_id  # type: ignore[union-attr]
    reader = LocalEngine(None, location=tmp_path / "lake")
    checkpoints = TableRef("bronze", "sfcdc_checkpoints")
    seen: list[bytes] = []
    violations: list[bytes] = []
    done = threading.Event()

    def watch() -> None:
        # Whatever position the server holds must already be a Delta checkpoint.
        while not done.is_set():
            committed = emulator.managed.committed(sub_id)
            if committed is not None and (not seen or seen[-1] != committed):
                seen.append(committed)
                stored = reader.read_arrow(checkpoints, columns=["replay_id"])
                if committed not in set(stored.column("replay_id").to_pylist()):
                    violations.append(committed)
            done.wait(0.005)

    # Cut the first stream: commits made while reconnecting never reach the server, so its
    # position lags the Delta checkpoint and it delivers landed events again.
    emulator.faults.cut_streams(130)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = land(load_conf(conf_dir), once=True)
    finally:
        done.set()
        watcher.join()
    assert violations == []
    assert len(seen) >= 3
    assert [rid for rid, _ in landed(conf_dir, ORDERS)] == orders
    assert emulator.managed.committed(sub_id) == checkpoint_rows(conf_dir, ORDERS)[-1]["replay_id"]
    assert result.topics[0].received >= 400

    # A new process resumes from the server's position; nothing is landed twice.
    emulator.faults.clear()
    more = fill(emulator, 30, ORDERS, start=400)
    land(load_conf(conf_dir), once=True)
    assert [rid for rid, _ in landed(conf_dir, ORDERS)] == orders + more


def test_progress_lines_and_periodic_maintenance(
    emulator: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture, lake_kind: str
) -> None:
    fill(emulator, 300, ORDERS)
    conf_dir = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"order": ORDER_OBJECT},
        batching="{max_events: 50, max_bytes: 1MiB, max_age_seconds: 0.2}",
        ingest={"progress_interval_seconds": 0.05, "maintain_every_commits": 2},
    )
    with caplog.at_level(logging.INFO, logger="pipelines"):
        land(load_conf(conf_dir), once=True)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress ")]
    assert progress, "no progress line"
    assert all(f"progress {ORDERS}: " in line and "events/s" in line for line in progress)
    assert any("pending at the server" in line and "last replay id" in line for line in progress)
    # Compactions and log checkpoints ran between commits; contents are unchanged by them.
    engine = LocalEngine(location=tmp_path / "lake")
    operations = {h.operation for h in engine.history(TableRef("bronze", "order_shipped__e"))}
    assert "OPTIMIZE" in operations
    log_dir = engine.path(TableRef("bronze", "order_shipped__e")) / "_delta_log"
    assert list(log_dir.glob("*.checkpoint.parquet"))
    assert list(
        (engine.path(TableRef("bronze", "sfcdc_checkpoints")) / "_delta_log").glob(
            "*.checkpoint.parquet"
        )
    )
    # A later run still resumes exactly: the transactions survive compaction and checkpoints.
    fill(emulator, 20, ORDERS, start=300)
    land(load_conf(conf_dir), once=True)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)


def test_an_earliest_recovery_lands_no_event_twice(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    # The stored position is rejected while the events before it are still retained (the
    # emulator refuses the replay id without purging): EARLIEST delivers every landed event
    # again, and landing skips them.
    conf_dir = write_conf(tmp_path, emulator, engine=lake_kind, objects={"order": ORDER_OBJECT})
    fill(emulator, 20, ORDERS)
    land(load_conf(conf_dir), once=True)
    emulator.faults.reject_replay_ids(through=encode_replay_id(emulator.bus.position))
    fill(emulator, 10, ORDERS, start=20)
    (conf_dir / "objects" / "order.yml").write_text(
        ORDER_OBJECT + "replay: {on_corrupted: earliest}\n"
    )
    result = land(load_conf(conf_dir), once=True)

    assert result.topics[0].replay_gaps == 1
    assert result.topics[0].events == 10
    assert result.topics[0].redelivered_skipped == 20
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)
    # The next run resumes after the last landed event.
    fill(emulator, 5, ORDERS, start=30)
    land(load_conf(conf_dir), once=True)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)


def test_once_finishes_under_steady_traffic_and_loses_nothing(
    emulator: Emulator, tmp_path: Path, lake_kind: str
) -> None:
    # Events keep arriving faster than the keepalive interval, so no keepalive ever comes:
    # --once stops once every topic received what was published before it started. (Batches
    # large enough that a Spark commit per batch still outpaces 50 events/s.)
    conf_dir = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"order": ORDER_OBJECT},
        batching="{max_events: 10000, max_bytes: 8MiB, max_age_seconds: 0.5}",
    )
    before = fill(emulator, 300, ORDERS)
    stop = threading.Event()
    produced = [300]

    def produce() -> None:
        while not stop.wait(0.02):  # 50 events/s
            fill(emulator, 1, ORDERS, start=produced[0])
            produced[0] += 1

    producer = threading.Thread(target=produce)
    producer.start()
    landings: list[BronzeLanding] = []
    results = []
    runner = threading.Thread(
        target=lambda: results.append(land(load_conf(conf_dir), once=True, started=landings.append))
    )
    try:
        runner.start()
        runner.join(timeout=60 if lake_kind == "local" else 240)
        finished = not runner.is_alive()
        if not finished:
            landings[0].stop("the test gave up waiting")
            runner.join(timeout=30)
        assert finished, "--once did not finish under steady traffic"
        assert results[0].stopped.startswith("drained")
        rids = [rid for rid, _ in landed(conf_dir, ORDERS)]
        assert rids[: len(before)] == before
        # A second --once under the same traffic resumes right after the first.
        land(load_conf(conf_dir), once=True)
    finally:
        stop.set()
        producer.join()
    land(load_conf(conf_dir), once=True)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)
