"""The protocol side of sfcdc: Salesforce Pub/Sub API client, decoding helpers and emulator.

Nothing in this package imports Spark, Delta or ``pipelines``.
"""

from ingest.errors import (
    AuthError,
    AuthRejectedError,
    AuthUnavailableError,
    BitmapError,
    CheckpointError,
    ConfigError,
    DecodeError,
    DiffError,
    LakeError,
    PermanentError,
    PubSubError,
    ReplayIdError,
    SfcdcError,
    TransientError,
)
from ingest.replay import After, Earliest, Latest, ReplayId, StartPosition, parse_start

__all__ = [
    "After",
    "AuthError",
    "AuthRejectedError",
    "AuthUnavailableError",
    "BitmapError",
    "CheckpointError",
    "ConfigError",
    "DecodeError",
    "DiffError",
    "Earliest",
    "LakeError",
    "Latest",
    "PermanentError",
    "PubSubError",
    "ReplayId",
    "ReplayIdError",
    "SfcdcError",
    "StartPosition",
    "TransientError",
    "parse_start",
]
