"""The ``salesforce`` Spark data source: batch and streaming reads of Pub/Sub API topics.

Streaming uses pyspark's :class:`~pyspark.sql.datasource.SimpleDataSourceStreamReader`:
Spark runs it in one Python process per query on the driver for as long as the query runs,
so the subscription (:class:`~pipelines.spark_source.feed.Feed`) stays open between
micro-batches, and ``read`` both takes the next events and says where they end. A
partitioned :class:`~pyspark.sql.datasource.DataSourceStreamReader` would have to name the
end offset before reading, which opaque replay ids cannot do, and would re-subscribe in
every task. Spark re-reads a micro-batch that was planned but not committed with
``readBetweenOffsets`` (see :mod:`pipelines.spark_source.offsets`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from ingest.client import SchemaCache
from pipelines.connect import Source, connect, secret_resolver
from pipelines.spark_source.bounded import read_between, read_until_quiet
from pipelines.spark_source.feed import Events, Feed
from pipelines.spark_source.offsets import BatchOffset, TopicOffset
from pipelines.spark_source.options import SourceOptions, parse_options
from pipelines.spark_source.rows import (
    RAW_GAPS_SCHEMA,
    RAW_SCHEMA,
    SilverDecoding,
    gap_detail,
    raw_batch,
    silver_decoding,
)

__all__ = ["SalesforceSource"]

_log = logging.getLogger(__name__)


def _open(options: SourceOptions) -> Source:
    return connect(options.connection, secrets=secret_resolver(), logger=_log)


class _Rows:
    """Turns the events a read took into Arrow batches of the query's columns."""

    def __init__(self, options: SourceOptions, silver: SilverDecoding | None) -> None:
        self.options = options
        self.silver = silver
        self._source: Source | None = None
        self._cache: SchemaCache | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles readers to other processes; connections are opened where they read.
        state = dict(self.__dict__)
        for key in [k for k in state if k.startswith("_")]:
            state[key] = None
        return state

    def source(self) -> Source:
        if self._source is None:
            self._source = _open(self.options)
        return self._source

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
        self._source = None
        self._cache = None

    def batches(self, taken: Mapping[str, Events]) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        for topic, events in taken.items():
            if events.gaps:
                _log.warning(
                    "%s: replay gap%s in this micro-batch: %s",
                    topic,
                    "s" if len(events.gaps) > 1 else "",
                    "; ".join(gap_detail(topic, g) for g in events.gaps),
                )
            if not len(events) and not (events.gaps and self.options.gap_rows):
                continue
            if self.silver is None:
                out.append(raw_batch(topic, events, gap_rows=self.options.gap_rows))
                continue
            if self._cache is None:
                source = self.source()
                self._cache = SchemaCache(source.channel, tokens=source.tokens)
            out.extend(b for b in self.silver.batches(topic, events, self._cache) if b.num_rows)
        return out


class _TopicPartition(InputPartition):
    def __init__(self, topic: str) -> None:
        super().__init__(topic)
        self.topic = topic


class _BatchReader(_Rows, DataSourceReader):
    """A batch read: each topic (one partition each) from its start until it goes quiet."""

    def partitions(self) -> list[InputPartition]:
        return [_TopicPartition(t) for t in self.options.topics]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _TopicPartition)
        topic = partition.topic
        try:
            events = read_until_quiet(
                self.source(),
                topic,
                self.options.starting[topic],
                on_corrupted=self.options.on_corrupted,
                quiet_seconds=self.options.batch_idle_seconds,
                max_events=self.options.max_events,
                num_requested=self.options.num_requested,
            )
            yield from self.batches({topic: events})
        finally:
            self.close()


def _positions(offsets: Mapping[str, TopicOffset]) -> str:
    return json.dumps({t: o.resting().to_json() for t, o in sorted(offsets.items())})


class _StreamReader(_Rows, SimpleDataSourceStreamReader):
    """A streaming read whose offsets are replay ids (see the module docstring)."""

    def __init__(self, options: SourceOptions, silver: SilverDecoding | None) -> None:
        super().__init__(options, silver)
        self._feed: Feed | None = None
        self._feed_at: str | None = None

    def initialOffset(self) -> dict[str, Any]:
        return BatchOffset(self.options.starting).to_json()

    def _feed_from(self, offsets: Mapping[str, TopicOffset]) -> Feed:
        at = _positions(offsets)
        if self._feed is not None and self._feed_at == at:
            return self._feed
        if self._feed is not None:
            self._feed.close()
        _log.info("subscribing to %s at %s", ", ".join(offsets), at)
        self._feed = Feed(
            self.source(),
            {t: o.resting() for t, o in offsets.items()},
            on_corrupted=self.options.on_corrupted,
            num_requested=self.options.num_requested,
            buffer_events=max(2 * self.options.max_events_per_trigger, 1000),
            logger=_log,
        )
        self._feed_at = at
        return self._feed

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Any], dict[str, Any]]:
        offsets = BatchOffset.from_json(start).topics
        feed = self._feed_from(offsets)
        taken, ends = feed.take(
            offsets, self.options.max_events_per_trigger, self.options.max_wait_seconds
        )
        if all(
            ends[t].count == 0
            and not ends[t].gaps
            and ends[t].after == o.after
            and ends[t].start == o.start
            for t, o in offsets.items()
        ):
            return iter([]), start
        self._feed_at = _positions(ends)
        rows = self.batches(taken)
        events = sum(len(e) for e in taken.values())
        _log.info("micro-batch: %d events from %s", events, ", ".join(sorted(taken)))
        return iter(rows), BatchOffset(ends).to_json()

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Any]:
        first = BatchOffset.from_json(start).topics
        last = BatchOffset.from_json(end).topics
        try:
            taken = {
                topic: read_between(
                    self.source(),
                    topic,
                    first[topic],
                    offset,
                    on_corrupted=self.options.on_corrupted,
                    num_requested=self.options.num_requested,
                )
                for topic, offset in last.items()
                if offset.count or offset.gaps
            }
            for topic, events in taken.items():
                # The micro-batch's replay gaps are the ones its end offset recorded.
                events.gaps = list(last[topic].gaps)
            return iter(self.batches(taken))
        finally:
            self.close()

    def commit(self, end: dict[str, Any]) -> None:
        # Subscribe keeps no server-side position: Spark's checkpoint is the replay
        # checkpoint, so there is nothing to acknowledge.
        return None

    def close(self) -> None:
        if self._feed is not None:
            self._feed.close()
        self._feed = None
        self._feed_at = None
        super().close()


class SalesforceSource(DataSource):
    """``spark.read.format("salesforce")`` / ``spark.readStream.format("salesforce")``:
    Salesforce Pub/Sub API topics (or the emulator's). Options: see docs/spark-source.md."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._silver: SilverDecoding | None = None

    @classmethod
    def name(cls) -> str:
        return "salesforce"

    def _options(self, *, streaming: bool) -> SourceOptions:
        return parse_options(self.options, streaming=streaming)

    def schema(self) -> StructType:
        options = self._options(streaming=False)
        if options.decode == "raw":
            return RAW_GAPS_SCHEMA if options.gap_rows else RAW_SCHEMA
        with _open(options) as source:
            cache = SchemaCache(source.channel, tokens=source.tokens)
            self._silver = silver_decoding(cache, options.topics[0])
        return self._silver.struct()

    def _decoding(self, options: SourceOptions) -> SilverDecoding | None:
        if options.decode == "raw":
            return None
        if self._silver is None:
            self.schema()
        return self._silver

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options(streaming=False)
        return _BatchReader(options, self._decoding(options))

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        options = self._options(streaming=True)
        return _StreamReader(options, self._decoding(options))
