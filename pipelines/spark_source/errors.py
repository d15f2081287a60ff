"""The data source's own failures, in sfcdc's error tree::

SfcdcError
├── DecodeError
│   └── SchemaChangedError   a writer schema adds columns the query's schema lacks
└── CheckpointError
    └── ReplayMismatchError  a batch re-read did not find the events its offsets name
"""

from __future__ import annotations

from ingest.errors import CheckpointError, DecodeError

__all__ = ["ReplayMismatchError", "SchemaChangedError"]


class SchemaChangedError(DecodeError):
    """An event was written with a schema whose fields the query's columns do not hold."""


class ReplayMismatchError(CheckpointError):
    """Re-reading a micro-batch between its offsets did not yield the events it had."""
