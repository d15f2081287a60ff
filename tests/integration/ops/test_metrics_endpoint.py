"""The Prometheus endpoint of a continuous run, scraped over HTTP while it runs: landing
figures from the live stream, silver and gold figures from their commits, conventional
names (``_total`` counters, ``_seconds`` units, a commit duration histogram)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.ops.metrics import PipelineMetrics, serve_metrics
from pipelines.run import Pipeline
from pipelines.spec import load_conf
from tests.integration.cli.conftest import write_conf

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    text = httpx.get(url, timeout=5).text
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


_GOLD_ACCOUNT = (("layer", "gold"), ("table", "gold.account"))


def _has_all_layers(samples: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> bool:
    """Whether a scrape shows the whole stream landed, committed to silver and to
    gold.account."""
    landed = samples.get("sfcdc_events_landed_total", {})
    commits = samples.get("sfcdc_commits_total", {})
    silver = samples.get("sfcdc_commit_duration_seconds_count", {})
    return (
        sum(landed.values()) >= 60
        and commits.get(_GOLD_ACCOUNT, 0) >= 1
        and silver.get((("layer", "silver"),), 0) >= 1
    )


def test_a_continuous_run_serves_its_metrics(tmp_path: Path) -> None:
    conf = load_conf(write_conf(tmp_path, events=60, platform_events=10))
    metrics = PipelineMetrics()
    pipeline = Pipeline(conf, metrics=metrics, report=lambda _line: None)
    port = _free_port()
    result: list[object] = []
    with serve_metrics(metrics, port=port) as server:
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        runner = threading.Thread(
            target=lambda: result.append(pipeline.run_continuous(interval=0.5, duration=120)),
            daemon=True,
        )
        runner.start()
        # Scrape until every figure asserted below has appeared (a loaded machine takes its
        # time; the run's own duration is only a backstop).
        deadline = time.monotonic() + 110
        samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        while time.monotonic() < deadline:
            samples = _scrape(server.url)
            if _has_all_layers(samples):
                break
            time.sleep(0.3)
        pipeline.stop()
        runner.join(timeout=60)
    assert result, "the run did not end"

    account = (("topic", "/data/AccountChangeEvent"),)
    assert samples["sfcdc_events_landed_total"][account] > 0
    assert samples["sfcdc_landed_bytes_total"][account] > 0
    assert samples["sfcdc_flow_control_window_events"][account] == 100
    assert samples["sfcdc_reconnects_total"][account] == 0
    assert account in samples["sfcdc_pending_request_events"]
    assert (("layer", "bronze"), ("table", "bronze.account_change_event")) in samples[
        "sfcdc_lag_seconds"
    ]
    gold = _GOLD_ACCOUNT
    assert samples["sfcdc_commits_total"][gold] >= 1
    assert samples["sfcdc_rows_written_total"][gold] >= 1
    assert samples["sfcdc_newest_commit_timestamp_seconds"][gold] > 0
    assert samples["sfcdc_quarantined_rows_total"][(("table", "silver.account"),)] == 0
    assert samples["sfcdc_errors_total"][(("layer", "gold"),)] == 0
    # A histogram per layer: cumulative buckets, a count and a sum.
    buckets = samples["sfcdc_commit_duration_seconds_bucket"]
    assert (
        buckets[(("layer", "silver"), ("le", "+Inf"))]
        == samples["sfcdc_commit_duration_seconds_count"][(("layer", "silver"),)]
        >= 1
    )
    assert buckets[(("layer", "bronze"), ("le", "+Inf"))] >= 1
    # The endpoint is closed with the block.
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url, timeout=2)
