"""Prometheus metrics of a running pipeline, served at ``http://HOST:PORT/metrics``.

``sfcdc ingest`` and ``sfcdc run --continuous`` serve them when ``ops.prometheus.port`` (or
``--metrics-port``) is set. Nothing is counted per event: the landing figures are read from
the landing's snapshot when Prometheus scrapes (the same snapshot a continuous run gets from
its landing child every second), and silver and gold figures are added once per commit from
the records the jobs report.

====================================================  =======  ===============================
metric                                                type     labels
====================================================  =======  ===============================
``sfcdc_events_received_total``                       counter  topic
``sfcdc_events_landed_total``                         counter  topic
``sfcdc_landed_bytes_total`` (Avro payload bytes)     counter  topic
``sfcdc_replay_gaps_total``                           counter  topic
``sfcdc_reconnects_total`` (streams reopened)         counter  topic
``sfcdc_flow_control_window_events``                  gauge    topic
``sfcdc_pending_request_events`` (asked, not yet      gauge    topic
received)
``sfcdc_buffered_events`` (received, not yet landed)  gauge    topic
``sfcdc_commits_total``                               counter  layer, table
``sfcdc_rows_written_total``                          counter  layer, table
``sfcdc_quarantined_rows_total``                      counter  table
``sfcdc_resync_rows_total``                           counter  table
``sfcdc_errors_total``                                counter  layer
``sfcdc_commit_duration_seconds``                     histo.   layer
``sfcdc_newest_commit_timestamp_seconds``             gauge    layer, table
``sfcdc_lag_seconds``                                 gauge    layer, table
``sfcdc_drift_records`` (the last reconcile's drift)   gauge    object, kind
``sfcdc_drift_repaired_total``                        counter  object
====================================================  =======  ===============================

``sfcdc_newest_commit_timestamp_seconds`` is the Salesforce commit time of the newest event a
table holds, or the last moment its topic was known to be caught up, whichever is later;
``sfcdc_lag_seconds`` is the scrape time minus it (``time() - sfcdc_newest_...`` in PromQL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingest.errors import SfcdcError
from pipelines.ops.durations import COMMIT_SECONDS_BUCKETS, Durations, DurationsSnapshot
from pipelines.ops.table import CommitRecord

if TYPE_CHECKING:
    from pipelines.bronze.landing_state import LandingResult
    from pipelines.reconcile import ReconcileResult

__all__ = ["MetricsServer", "PipelineMetrics", "serve_metrics"]

_NO_DURATIONS = DurationsSnapshot((0,) * (len(COMMIT_SECONDS_BUCKETS) + 1), 0.0)


@dataclass
class _Table:
    commits: int = 0
    rows: int = 0
    quarantined: int = 0
    resync: int = 0
    watermark: float | None = None


@dataclass
class _Layer:
    tables: dict[str, _Table] = field(default_factory=dict)
    durations: Durations = field(default_factory=Durations)
    errors: int = 0


class PipelineMetrics:
    """The figures ``/metrics`` shows; a Prometheus collector.

    :meth:`record` takes the commit records of silver and gold (and errors of any layer);
    :meth:`watch_landing` names the function that returns the landing's latest snapshot.
    ``clock`` (epoch seconds) is the "now" of the lag gauges."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._layers: dict[str, _Layer] = {}
        self._landing: Callable[[], LandingResult | None] | None = None
        # object -> (missing, extra, stale) of its last reconcile, and what reconciles repaired.
        self._drift: dict[str, tuple[int, int, int]] = {}
        self._repaired: dict[str, int] = {}

    def record_reconcile(self, result: ReconcileResult) -> None:
        """Show the drift one reconcile of one object found and repaired."""
        with self._lock:
            self._drift[result.object] = (
                result.drift_missing,
                result.drift_extra,
                result.drift_stale,
            )
            self._repaired[result.object] = self._repaired.get(result.object, 0) + result.repaired

    def watch_landing(self, snapshot: Callable[[], LandingResult | None]) -> None:
        """Read the landing's figures from ``snapshot()`` at each scrape."""
        self._landing = snapshot

    def record(self, record: CommitRecord) -> None:
        """Count one commit record (landing commits are read from its snapshot instead)."""
        with self._lock:
            layer = self._layers.setdefault(record.layer, _Layer())
            if record.kind == "error":
                layer.errors += 1
                return
            if record.layer == "bronze" or record.kind != "commit" or record.table is None:
                return
            table = layer.tables.setdefault(record.table, _Table())
            table.commits += 1
            table.rows += record.rows
            table.quarantined += record.quarantined
            table.resync += record.resync_rows
            if record.newest_commit_at is not None:
                stamp = record.newest_commit_at.timestamp()
                table.watermark = max(table.watermark or stamp, stamp)
        if record.duration_seconds is not None:
            layer.durations.observe(record.duration_seconds)

    # -- the Prometheus collector protocol ------------------------------------------------

    def describe(self) -> list[Any]:
        # Families are built at scrape time; registering needs no description.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        now = self._clock()
        snapshot = self._landing() if self._landing is not None else None
        topics = snapshot.topics if snapshot is not None else ()

        def topic_counter(name: str, doc: str, value: Callable[[Any], float]) -> Any:
            family = CounterMetricFamily(name, doc, labels=["topic"])
            for t in topics:
                family.add_metric([t.topic], value(t))
            return family

        def topic_gauge(name: str, doc: str, value: Callable[[Any], float]) -> Any:
            family = GaugeMetricFamily(name, doc, labels=["topic"])
            for t in topics:
                family.add_metric([t.topic], value(t))
            return family

        yield topic_counter(
            "sfcdc_events_received", "Events received from the Pub/Sub API.", lambda t: t.received
        )
        yield topic_counter(
            "sfcdc_events_landed", "Events committed to bronze.", lambda t: t.events
        )
        yield topic_counter(
            "sfcdc_landed_bytes",
            "Avro payload bytes committed to bronze.",
            lambda t: t.payload_bytes,
        )
        yield topic_counter(
            "sfcdc_replay_gaps",
            "Replay gaps recorded (rejected replay ids).",
            lambda t: t.replay_gaps,
        )
        yield topic_counter(
            "sfcdc_reconnects",
            "Subscription streams reopened after a failure.",
            lambda t: t.reconnects,
        )
        yield topic_gauge(
            "sfcdc_flow_control_window_events",
            "Events asked for at most per FetchRequest (num_requested).",
            lambda t: t.window,
        )
        yield topic_gauge(
            "sfcdc_pending_request_events",
            "Events requested from the server and not yet received.",
            lambda t: t.outstanding,
        )
        yield topic_gauge(
            "sfcdc_buffered_events",
            "Events received and not yet taken by landing.",
            lambda t: t.buffered,
        )

        with self._lock:
            layers = {
                name: (
                    {key: _Table(**vars(table)) for key, table in layer.tables.items()},
                    layer.durations.snapshot(),
                    layer.errors,
                )
                for name, layer in self._layers.items()
            }

        commits = CounterMetricFamily(
            "sfcdc_commits", "Commits made to the layer's tables.", labels=["layer", "table"]
        )
        rows = CounterMetricFamily(
            "sfcdc_rows_written", "Rows written to the layer's tables.", labels=["layer", "table"]
        )
        quarantined = CounterMetricFamily(
            "sfcdc_quarantined_rows", "Rows silver quarantined.", labels=["table"]
        )
        resync = CounterMetricFamily(
            "sfcdc_resync_rows", "Re-sync rows gold recorded or resolved.", labels=["table"]
        )
        newest = GaugeMetricFamily(
            "sfcdc_newest_commit_timestamp_seconds",
            "Salesforce commit time of the newest event the table holds, or the last time its "
            "topic was known to be caught up (epoch seconds).",
            labels=["layer", "table"],
        )
        lag = GaugeMetricFamily(
            "sfcdc_lag_seconds",
            "Seconds the table is behind Salesforce (now minus the newest commit timestamp).",
            labels=["layer", "table"],
        )
        errors = CounterMetricFamily("sfcdc_errors", "Failed layer runs.", labels=["layer"])
        durations = HistogramMetricFamily(
            "sfcdc_commit_duration_seconds",
            "How long commits take, per layer.",
            labels=["layer"],
        )

        bronze = _NO_DURATIONS
        for t in topics:
            commits.add_metric(["bronze", t.table], t.commits)
            rows.add_metric(["bronze", t.table], t.events)
            watermark = max(
                (w for w in (t.newest_commit_at, t.caught_up_at) if w is not None), default=None
            )
            if watermark is not None:
                newest.add_metric(["bronze", t.table], watermark)
                lag.add_metric(["bronze", t.table], max(0.0, now - watermark))
            if t.commit_seconds:
                bronze = _add(
                    bronze, DurationsSnapshot(tuple(t.commit_seconds), t.commit_seconds_total)
                )
        for layer_name, (tables, _durations, _errors) in sorted(layers.items()):
            for table_name, table in sorted(tables.items()):
                commits.add_metric([layer_name, table_name], table.commits)
                rows.add_metric([layer_name, table_name], table.rows)
                if layer_name == "silver":
                    quarantined.add_metric([table_name], table.quarantined)
                if layer_name == "gold":
                    resync.add_metric([table_name], table.resync)
                if table.watermark is not None:
                    newest.add_metric([layer_name, table_name], table.watermark)
                    lag.add_metric([layer_name, table_name], max(0.0, now - table.watermark))
        for layer_name in ("bronze", "silver", "gold"):
            found = layers.get(layer_name)
            errors.add_metric([layer_name], found[2] if found else 0)
            shown = bronze if layer_name == "bronze" else (found[1] if found else _NO_DURATIONS)
            durations.add_metric([layer_name], buckets=shown.cumulative(), sum_value=shown.total)
        yield from (commits, rows, quarantined, resync, newest, lag, errors, durations)
        with self._lock:
            drift_now, repaired_now = dict(self._drift), dict(self._repaired)
        drift = GaugeMetricFamily(
            "sfcdc_drift_records",
            "Records the last reconcile found missing from gold, extra in gold or stale.",
            labels=["object", "kind"],
        )
        for name, counts in sorted(drift_now.items()):
            for kind, count in zip(("missing", "extra", "stale"), counts, strict=True):
                drift.add_metric([name, kind], count)
        repaired = CounterMetricFamily(
            "sfcdc_drift_repaired", "Drifting records reconcile repaired.", labels=["object"]
        )
        for name, count in sorted(repaired_now.items()):
            repaired.add_metric([name], count)
        yield from (drift, repaired)


def _add(a: DurationsSnapshot, b: DurationsSnapshot) -> DurationsSnapshot:
    return DurationsSnapshot(
        tuple(x + y for x, y in zip(a.counts, b.counts, strict=True)), a.total + b.total
    )


class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def serve_metrics(metrics: PipelineMetrics, *, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``metrics`` (and only them: a registry of its own) at ``host:port``."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise SfcdcError(
            f"cannot serve Prometheus metrics on {host}:{port} ({exc.strerror or exc}); choose "
            "another ops.prometheus.port (or --metrics-port), or stop what uses it"
        ) from exc
    bound = server.server_address[1] if port == 0 else port
    return MetricsServer(server, thread, host, int(bound))
