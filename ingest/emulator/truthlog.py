"""The org's records on disk, next to the event log, so a restarted emulator still answers
REST and Bulk API queries for them.

The workload keeps the org's records in a :class:`~ingest.emulator.truth.GroundTruth` as it
generates change events. Gap events and overflows carry no values, so the records cannot be
rebuilt from the event log alone: :class:`TruthJournal` writes, before each batch of events
is appended to the log, one JSON line with every record the batch changed (its values, deleted
flag and pending gap events; :meth:`GroundTruth.drain_changes`). Loading replays the lines in
order and rewrites the file as a single line. The records are written before the events, as
Salesforce commits a record before it publishes the change: after a crash between the two the
records can be ahead of the log, never behind it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import IO

from ingest.emulator.truth import GroundTruth

__all__ = ["TRUTH_JOURNAL", "TruthJournal"]

logger = logging.getLogger(__name__)

TRUTH_JOURNAL = "truth.jsonl"


class TruthJournal:
    """Journal of a ground truth in ``state_dir`` (see the module docstring)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / TRUTH_JOURNAL
        self._handle: IO[str] | None = None

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> GroundTruth | None:
        """The truth the journal holds (``None`` when there is no journal); the file is
        compacted to one line. A last line cut short by a crash is dropped."""
        if not self.path.exists():
            return None
        with self.path.open(encoding="utf-8") as handle:
            lines = handle.read().split("\n")
        head = json.loads(lines[0]) if lines and lines[0] else {}
        truth = GroundTruth(org_id=str(head.get("org_id", "")))
        applied = 0
        for number, line in enumerate(lines[1:], start=2):
            if not line:
                continue
            try:
                changes = json.loads(line)
            except ValueError:
                logger.warning("%s: line %d is cut short; dropped it", self.path, number)
                break
            truth.apply_changes(changes)
            applied += 1
        truth.drain_changes()
        logger.info("ground truth reloaded from %s (%d batches): %r", self.path, applied, truth)
        self.start(truth)
        return truth

    def start(self, truth: GroundTruth) -> None:
        """Write ``truth`` whole as the journal's content, replacing any earlier journal;
        later changes are appended by :meth:`record`."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truth.drain_changes()
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(json.dumps({"org_id": truth.org_id}) + "\n")
            handle.write(_line(truth.all_changes()))
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)
        self._handle = self.path.open("a", encoding="utf-8")

    def record(self, truth: GroundTruth) -> None:
        """Append what changed in ``truth`` since the last call."""
        if self._handle is None:
            raise RuntimeError("the truth journal is not started: call start() or load() first")
        changes = truth.drain_changes()
        if any(c["records"] for c in changes.values()):
            self._handle.write(_line(changes))
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _line(changes: object) -> str:
    return json.dumps(changes, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
