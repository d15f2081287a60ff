"""The drift a reconcile found, as Prometheus shows it: a gauge per object and kind (the last
reconcile's counts) and a counter of the records it repaired."""

from __future__ import annotations

from datetime import datetime, timezone

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pipelines.ops.metrics import PipelineMetrics, serve_metrics
from pipelines.reconcile import ReconcileResult


def _result(missing: int, extra: int, stale: int, repaired: int) -> ReconcileResult:
    return ReconcileResult(
        object="Account",
        run_id="r",
        api="bulk",
        salesforce_records=100,
        salesforce_deleted=3,
        gold_records=99,
        in_flight=0,
        drift_missing=missing,
        drift_extra=extra,
        drift_stale=stale,
        repaired=repaired,
        duration_s=0.5,
    )


def test_drift_gauges_show_the_last_reconcile_and_repairs_add_up() -> None:
    metrics = PipelineMetrics(clock=lambda: 0.0)
    metrics.record_reconcile(_result(1, 2, 3, 6))
    metrics.record_reconcile(_result(0, 0, 1, 1))
    with serve_metrics(metrics, port=0) as server:
        text = httpx.get(server.url, timeout=5).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("sfcdc_drift_records", (("kind", "missing"), ("object", "Account")))] == 0
    assert samples[("sfcdc_drift_records", (("kind", "stale"), ("object", "Account")))] == 1
    assert samples[("sfcdc_drift_repaired_total", (("object", "Account"),))] == 7
    record = _result(1, 2, 3, 6).commit_record(datetime(2025, 1, 1, tzinfo=timezone.utc))
    assert (record.kind, record.rows, record.resync_rows, record.events) == ("reconcile", 6, 6, 100)
