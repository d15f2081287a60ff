"""Pure decoding functions: Avro payloads, field bitmaps, diff-encoded text, schema cache.

No Spark here: the same functions run in the Pub/Sub client, inside silver's Spark executors and
in gold's diff reconstruction.

- :class:`EventDecoder` / :func:`compile_decoder`: Avro binary payload -> record (equal to
  fastavro's result), per event or as columns (:class:`DecodedBatch`), with generated code
  specialised per schema.
- :func:`field_names`: a changedFields / nulledFields / diffFields bitmap -> field names.
- :func:`apply_diff`: rebuild a diff-encoded long text value and verify its SHA-256.
- :class:`DecoderCache`: schema id -> parsed schema and decoder, loaded once per id.
- :class:`ChangeEvent`: a decoded change event with its header and expanded bitmaps.
- :func:`event_time_ms`: when an event was committed (change event header or ``CreatedDate``).
"""

from ingest.decoding.avro import DecodedBatch, EventDecoder, compile_decoder
from ingest.decoding.bitmap import BitmapExpander, expander_for, field_names
from ingest.decoding.cache import DecoderCache
from ingest.decoding.diff import apply_diff, diff_sha256, is_diff
from ingest.decoding.event import ChangeEvent
from ingest.decoding.event_time import event_time_ms

__all__ = [
    "BitmapExpander",
    "ChangeEvent",
    "DecodedBatch",
    "DecoderCache",
    "EventDecoder",
    "apply_diff",
    "compile_decoder",
    "diff_sha256",
    "event_time_ms",
    "expander_for",
    "field_names",
    "is_diff",
]
