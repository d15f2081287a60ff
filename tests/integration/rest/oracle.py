"""Gold against the emulator's ground truth after a bootstrap or a re-sync: every record, every
column, nothing flagged."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ingest.emulator.server import Emulator
from ingest.emulator.truth import GroundTruth
from pipelines.engines import LakeEngine, TableRef
from pipelines.formulas import formula_columns
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.polled import polled_layout
from pipelines.silver.job import read_registry, silver_layout
from pipelines.spec import Conf
from tests.integration.gold.test_oracle import expected_row


def write_conf(
    root: Path,
    emulator: Emulator,
    objects: dict[str, str],
    *,
    start: str,
    engine: str = "local",
    bodies: Mapping[str, str] | None = None,
) -> Path:
    """A conf/ reaching ``emulator`` (external, no TLS) for ``objects`` (file -> API name),
    into a lake of the ``engine``; ``bodies`` (file -> YAML) replaces an object file's
    ``kind: change_events`` with its own text (``kind: polled``, ``formulas``...)."""
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              emulator:
                mode: external
                grpc_port: {emulator.grpc_port}
                http_port: {emulator.http_port}
                tls: {{enabled: false}}
            lake: {{engine: {engine}, location: {root / "lake"}}}
            defaults:
              replay: {{start: {start}, on_corrupted: fail}}
              batching: {{max_events: 5000, max_bytes: 8MiB, max_age_seconds: 0.2}}
            ingest:
              retry: {{max_attempts: 5, initial_backoff_seconds: 0.05, max_backoff_seconds: 0.2}}
              progress_interval_seconds: 1
              maintain_every_commits: 0
            """
        )
    )
    for name, api_name in objects.items():
        body = (bodies or {}).get(name, "kind: change_events\n")
        (conf / "objects" / f"{name}.yml").write_text(f"object: {api_name}\n{body}")
    return conf


def assert_gold_equals_truth(
    engine: LakeEngine, conf: Conf, truth: GroundTruth, *, tolerated: frozenset[str] = frozenset()
) -> str:
    """Every object of ``conf``: gold holds exactly the truth's records, deleted flags and
    values, and none is flagged for re-sync nor has an open re-sync row, except records
    flagged only for ``tolerated`` reasons (their values are compared all the same). A record
    hard-deleted from the Recycle Bin (``truth.purged``) may keep its gold row, deleted."""
    registry = read_registry(engine)
    resync = engine.read_arrow(RESYNC_TABLE).to_pylist() if engine.exists(RESYNC_TABLE) else []
    report = []
    for obj in conf.objects:
        entity = obj.api_name
        if obj.kind == "polled":
            found = polled_layout(engine, obj)
            assert found is not None, f"{entity} was never polled"
            fields = found[0].fields
        else:
            fields = silver_layout(obj, registry).fields
        assert fields, f"{entity}: no columns to compare"
        formulas = formula_columns(engine, obj)
        assert bool(formulas) == (obj.formulas.refresh_every is not None), (
            f"{entity}: formula columns {formulas}, refresh_every {obj.formulas.refresh_every}"
        )
        gold = {
            r["Id"]: r for r in engine.read_arrow(TableRef("gold", obj.tables.gold)).to_pylist()
        }
        records = truth.records(entity)
        deleted = truth.deleted(entity)
        purged = {r: gold.pop(r) for r in truth.purged(entity) if r in gold}
        kept_live = [r for r, row in purged.items() if not row["_cdc_is_deleted"]]
        assert not kept_live, f"{entity}: hard-deleted records live in gold: {kept_live[:5]}"
        assert set(gold) == set(records), (
            f"{entity}: {len(set(records) - set(gold))} records missing from gold, "
            f"{len(set(gold) - set(records))} unknown to the truth"
        )
        wrong = [r for r, row in gold.items() if row["_cdc_is_deleted"] != (r in deleted)]
        assert not wrong, f"{entity}: deleted flag differs for {wrong[:5]}"
        flagged = {
            r: row["_cdc_resync_reason"]
            for r, row in gold.items()
            if row["_cdc_needs_resync"]
            and not set(row["_cdc_resync_reason"].split(",")) <= tolerated
        }
        assert not flagged, f"{entity}: {len(flagged)} records still flagged: {flagged}"
        still_open = [
            r
            for r in resync
            if r["object"] == entity and r["resolved_at"] is None and r["reason"] not in tolerated
        ]
        assert not still_open, f"{entity}: {len(still_open)} re-sync rows open: {still_open[:2]}"
        mismatches: list[tuple[str, str, Any, Any]] = []
        for record_id, record in records.items():
            want = expected_row(fields, record)
            if formulas:
                values = truth.formula_values(entity, record_id)
                want.update({name: values[name] for name in formulas})
            got = gold[record_id]
            mismatches.extend((record_id, c, v, got[c]) for c, v in want.items() if got[c] != v)
        assert not mismatches, (
            f"{entity}: {len(mismatches)} cells differ from the truth, e.g. "
            + "; ".join(f"{r}.{c}: want {w!r}, got {g!r}" for r, c, w, g in mismatches[:5])
        )
        report.append(
            f"{entity} ({obj.kind}): {len(records)} records ({len(deleted)} deleted, "
            f"{len(purged)} hard-deleted{', formulas ' + ', '.join(formulas) if formulas else ''})"
        )
    return "; ".join(report)
