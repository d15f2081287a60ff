"""A poll's record rows as silver rows: the pure batch function silver runs over a polled
object's bronze rows (in this process, or on Spark executors).

A polled row becomes a row of the same silver table a change event object has (``Id``, the
``_cdc_*`` header, the typed fields), whose header says what it is: a full record as Salesforce
holds it, read by a poll. Its fields are typed by :func:`pipelines.snapshot_rows.rest_row`, the
function that types a snapshot's records, so a polled row and a snapshot row of one record are
the same values. The header:

=========================  ======================================================================
``_cdc_change_type``       ``POLLED``, or ``POLLED_DELETED`` for a record in the Recycle Bin
``_cdc_commit_timestamp``  the record's ``SystemModstamp`` (when Salesforce last saved it)
``_cdc_event_id``          ``poll:<Id>:<SystemModstamp in ms>:<describe>`` (the first characters
                           of the describe's fingerprint): the same for a record read twice
                           unchanged under one describe, so gold knows it has applied it
``_cdc_schema_id``         the fingerprint of the describe the record was read with
``_cdc_change_origin``     ``sfcdc poll (rest)`` or ``sfcdc poll (bulk)``
``_cdc_changed_fields``    empty: every field is given (a full image)
=========================  ======================================================================

The commit number, transaction key, sequence number, replay id and commit user are null. A
record whose values do not fit their columns goes to the quarantine (``bad_value``) with the
record's JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ingest.errors import RestError
from ingest.schema import FieldInfo
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.silver.columns import POLLED, POLLED_DELETED, SilverLayout
from pipelines.silver.quarantine import ERROR_COLUMNS
from pipelines.snapshot_rows import rest_row

__all__ = ["BRONZE_COLUMNS", "PolledRows", "decoded_schema"]

# The bronze columns the batch function reads.
BRONZE_COLUMNS = (
    "kind",
    "record_id",
    "system_modstamp",
    "is_deleted",
    "payload",
    "fingerprint",
    "api",
    "batch_id",
    "batch_seq",
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
# How much of the describe's fingerprint an event id carries.
_DESCRIBE_CHARS = 12


def decoded_schema(layout: SilverLayout) -> T.StructType:
    """The silver columns, then the error columns the quarantine split reads."""
    fields = list(layout.silver_schema().fields)
    fields += [
        T.StructField("_cdc_error", T.StringType()),
        T.StructField("_cdc_error_kind", T.StringType()),
        T.StructField("_cdc_payload", T.BinaryType()),
    ]
    assert tuple(f.name for f in fields[-3:]) == ERROR_COLUMNS
    return T.StructType(fields)


class PolledRows:
    """Bronze rows of a polled object -> silver rows (and error columns) of ``layout``;
    rows that are not records (describes, watermarks) are left out. ``infos`` says which name
    fields the REST API gives as parts (:func:`~pipelines.polled.layout.record_infos_of`)."""

    def __init__(self, layout: SilverLayout, infos: Mapping[str, FieldInfo]) -> None:
        self.layout = layout
        self.infos = dict(infos)
        self.schema = spark_schema_to_arrow(decoded_schema(layout))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            records = batch.filter(pc.equal(batch.column("kind"), "record"))
            if records.num_rows:
                yield self._rows(records)

    def _rows(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        entity = self.layout.entity
        names = self.schema.names
        out: list[dict[str, Any]] = []
        for r in batch.to_pylist():
            record_id = r["record_id"]
            stamp: datetime = r["system_modstamp"]
            ms = (stamp - _EPOCH) // _MS if stamp is not None else None
            row: dict[str, Any] = dict.fromkeys(names)
            row.update(
                {
                    "Id": record_id,
                    "_cdc_change_type": POLLED_DELETED if r["is_deleted"] else POLLED,
                    "_cdc_entity": entity,
                    "_cdc_commit_timestamp": stamp,
                    "_cdc_change_origin": f"sfcdc poll ({r['api']})",
                    "_cdc_event_id": f"poll:{record_id}:{ms}:{r['fingerprint'][:_DESCRIBE_CHARS]}",
                    "_cdc_schema_id": r["fingerprint"],
                    "_cdc_changed_fields": [],
                    "_cdc_nulled_fields": [],
                    "_cdc_diff_fields": [],
                    "_cdc_record_count": 1,
                    "_cdc_is_wildcard": False,
                    "_cdc_bronze_batch_id": r["batch_id"],
                    "_cdc_bronze_batch_seq": r["batch_seq"],
                }
            )
            try:
                row.update(rest_row(self.layout, self.infos, json.loads(r["payload"])))
            except (RestError, ValueError, TypeError) as exc:
                row["_cdc_error"] = f"a polled record of {entity} does not fit its columns: {exc}"
                row["_cdc_error_kind"] = "bad_value"
                row["_cdc_payload"] = (r["payload"] or "").encode()
            out.append(row)
        return pa.RecordBatch.from_pylist(out, schema=self.schema)
