"""What the emulator published, as the tests' oracle: each event decoded independently with
fastavro and its own writer schema, and the generator's log of what each event says."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections import Counter
from typing import Any

from fastavro import parse_schema, schemaless_reader

from ingest.emulator.server import Emulator
from ingest.emulator.workload import Workload


def decoded(emulator: Emulator, topic: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """event id -> (schema id, record) decoded by fastavro with the event's own schema."""
    out = {}
    for e in emulator.log(topic):
        parsed = parse_schema(json.loads(emulator.catalogue.schema(e.schema_id).json))
        out[e.event_id] = (e.schema_id, schemaless_reader(io.BytesIO(e.payload), parsed, None))
    return out


def timestamp(ms: int | None) -> dt.datetime | None:
    """Epoch milliseconds as Spark collects a TIMESTAMP in a UTC session (naive)."""
    if ms is None:
        return None
    return dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)


def expected_rows(workload: Workload, entity: str, event_ids: set[str]) -> Counter[Any]:
    """One (event id, record id, change type, changed, nulled) per silver row to expect."""
    out: Counter[Any] = Counter()
    for g in workload.log:
        if g.entity != entity or g.event_id not in event_ids:
            continue
        for record_id in g.record_ids or (None,):
            out[(g.event_id, record_id, g.change_type, g.changed, g.nulled)] += 1
    return out


def silver_rows(rows: list[Any]) -> Counter[Any]:
    """The same tuples from silver rows (Spark rows or dicts)."""
    return Counter(
        (
            r["_cdc_event_id"],
            r["Id"],
            r["_cdc_change_type"],
            tuple(r["_cdc_changed_fields"]),
            tuple(r["_cdc_nulled_fields"]),
        )
        for r in rows
    )
