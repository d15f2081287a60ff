"""Every error sfcdc raises on purpose, in one tree.

::

    SfcdcError
    ├── ConfigError            bad YAML or settings; lists every problem with file and key path
    ├── AuthError              a token could not be obtained or refreshed
    │   └── AuthUnavailableError   the token endpoint was unreachable or failed (5xx): retry later
    ├── PubSubError            a Pub/Sub API call failed (gRPC status, error-code trailer, rpc id)
    │   ├── TransientError         worth retrying after a backoff (UNAVAILABLE, ...)
    │   ├── AuthRejectedError      UNAUTHENTICATED / service.auth.error: refresh the token, retry
    │   ├── ReplayIdError          the replay id is unknown, malformed or expired
    │   └── PermanentError         retrying cannot help (topic not found, no permission, licence)
    ├── StreamingError         a Streaming API (CometD) exchange failed (Bayeux error, channel)
    │   ├── StreamingUnavailableError  no usable answer (network, 5xx, timeout): retry later
    │   ├── StreamingAuthError     401::Authentication invalid / Request requires authentication
    │   ├── HandshakeDeniedError   403::Handshake denied, with ext.sfdc.failureReason
    │   ├── UnknownClientError     403::Unknown client / Client has not completed handshake
    │   ├── StreamingReplayError   400 invalid replayId (outside the retention window)
    │   ├── ChannelError           the channel is missing, unknown, misspelt or not allowed
    │   ├── StreamingLimitError    an org, channel or connection allocation is exhausted
    │   ├── RequestTooLargeError   413 Maximum Request Size Exceeded (32,768-byte bodies)
    │   └── StreamingProtocolError API version, connection type, cookies, unexpected answers
    ├── DecodeError            an event payload, bitmap or diff could not be decoded
    │   ├── BitmapError            a bitmap names a field the schema does not have
    │   └── DiffError              a diff-encoded value cannot be rebuilt or fails its SHA-256
    ├── RestError              a REST API call failed (HTTP status, Salesforce errorCode)
    │   ├── RestUnavailableError   the server could not answer (5xx, network): retry later
    │   └── BulkJobError           a Bulk API 2.0 query job failed, was aborted, timed out, or
    │                              its results can no longer be read
    ├── CheckpointError        the replay checkpoint in Delta is inconsistent or unwritable
    │   └── LeaseHeldError         another landing holds (or took over) the topic's lease
    └── LakeError              a Delta table operation failed (engine, commit conflict, schema)
        └── ConcurrentWriteError   another writer changed the table during the commit

Messages name the stage, what was expected and what was received, and the fix when there is
one. They never contain secrets or event payloads.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "AuthRejectedError",
    "AuthUnavailableError",
    "BitmapError",
    "BulkJobError",
    "ChannelError",
    "CheckpointError",
    "ConcurrentWriteError",
    "ConfigError",
    "DecodeError",
    "DiffError",
    "HandshakeDeniedError",
    "LakeError",
    "LeaseHeldError",
    "PermanentError",
    "PubSubError",
    "ReplayIdError",
    "RequestTooLargeError",
    "RestError",
    "RestUnavailableError",
    "SfcdcError",
    "StreamingAuthError",
    "StreamingError",
    "StreamingLimitError",
    "StreamingProtocolError",
    "StreamingReplayError",
    "StreamingUnavailableError",
    "TransientError",
    "UnknownClientError",
]


class SfcdcError(Exception):
    """Base class of every error sfcdc raises on purpose."""


class ConfigError(SfcdcError):
    """Configuration is invalid. ``problems`` holds one line per problem, each naming its place."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems: list[str] = list(problems or [])
        if self.problems:
            message = message + "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class AuthError(SfcdcError):
    """Authentication against Salesforce (or the emulator) failed."""


class AuthUnavailableError(AuthError):
    """The token endpoint could not be reached or answered with a server error.

    Unlike a rejected login, this may succeed later, so long-running subscribers retry it with
    their backoff instead of stopping.
    """


class PubSubError(SfcdcError):
    """A Pub/Sub API call failed.

    ``status`` is the gRPC status name (``"UNAVAILABLE"``), ``error_code`` the Salesforce
    ``error-code`` trailer (``"sfdc.platform.eventbus.grpc.service.unavailable"``) when the
    server sent one, and ``rpc_id`` the server's trace id for support cases.
    """

    def __init__(
        self,
        message: str,
        *,
        status: str = "",
        error_code: str = "",
        rpc_id: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.rpc_id = rpc_id


class TransientError(PubSubError):
    """The call may succeed if retried after a backoff."""


class AuthRejectedError(PubSubError):
    """The server rejected the credentials; refresh the token and retry."""


class ReplayIdError(PubSubError):
    """The replay id sent to the server is invalid or no longer retained."""


class PermanentError(PubSubError):
    """Retrying cannot help; the message says what to fix."""


class StreamingError(SfcdcError):
    """A Streaming API (Bayeux/CometD) exchange failed.

    ``error`` is the Bayeux ``error`` field as the server sent it (``"403::Unknown client"``),
    ``code`` its numeric part (0 when none came), ``channel`` the meta channel or subscription
    concerned, and ``failure_reason`` the ``ext.sfdc.failureReason`` of a denied handshake.
    """

    def __init__(
        self,
        message: str,
        *,
        error: str = "",
        code: int = 0,
        channel: str = "",
        failure_reason: str = "",
    ) -> None:
        super().__init__(message)
        self.error = error
        self.code = code
        self.channel = channel
        self.failure_reason = failure_reason


class StreamingUnavailableError(StreamingError):
    """No usable answer came (network failure, server error, timeout): retry after a backoff."""


class StreamingAuthError(StreamingError):
    """The token was missing or rejected (401): log in again, then handshake again."""


class HandshakeDeniedError(StreamingError):
    """``403::Handshake denied``; :attr:`failure_reason` says why (API version, limits, auth)."""


class UnknownClientError(StreamingError):
    """The server no longer knows the client session (it expired or was never made): a new
    handshake and subscriptions are needed."""


class StreamingReplayError(StreamingError):
    """A subscribe's replay id is not inside the channel's retention window."""


class ChannelError(StreamingError):
    """The channel cannot be subscribed: not specified, not found, different case, restricted
    or not readable by the user. Fix the channel name or the user's permissions."""


class StreamingLimitError(StreamingError):
    """An allocation is exhausted: concurrent clients, daily events, subscribers of a channel,
    generic channels, or simultaneous connections of a server."""


class RequestTooLargeError(StreamingError):
    """A request body over the Streaming API's limit of 32,768 bytes."""


class StreamingProtocolError(StreamingError):
    """The exchange broke the protocol: missing or unsupported API version, connection type,
    absent session cookie, or an answer that is not a Bayeux reply."""


class DecodeError(SfcdcError):
    """An event could not be decoded. ``replay_id`` (hex) locates it in its topic when known."""

    def __init__(self, message: str, *, replay_id: str = "") -> None:
        super().__init__(message)
        self.replay_id = replay_id


class BitmapError(DecodeError):
    """A changedFields / nulledFields / diffFields bitmap does not fit the event's schema."""


class DiffError(DecodeError):
    """A diff-encoded text value cannot be reconstructed or does not match its SHA-256."""


class RestError(SfcdcError):
    """A call to Salesforce's REST API failed.

    ``status`` is the HTTP status (0 when no response arrived) and ``error_code`` the
    ``errorCode`` of Salesforce's error body (``"MALFORMED_QUERY"``, ``"INVALID_FIELD"``).
    """

    def __init__(self, message: str, *, status: int = 0, error_code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


class RestUnavailableError(RestError):
    """The REST API could not answer (a server error or a network failure): retry later."""


class BulkJobError(RestError):
    """A Bulk API 2.0 query job did not deliver its records: it failed (the message carries
    Salesforce's ``errorMessage``), was aborted, ran past the timeout, or its results (or a
    locator of them) are no longer valid. ``job_id`` and ``state`` name the job."""

    def __init__(
        self,
        message: str,
        *,
        job_id: str,
        state: str,
        status: int = 0,
        error_code: str = "",
    ) -> None:
        super().__init__(message, status=status, error_code=error_code)
        self.job_id = job_id
        self.state = state


class CheckpointError(SfcdcError):
    """The replay checkpoint could not be read or written consistently."""


class LakeError(SfcdcError):
    """A Delta table operation failed."""


class LeaseHeldError(CheckpointError):
    """Another landing holds the lease of a topic in this lake (or took it over after this
    one's lease expired); two landings of one topic cannot run at once."""


class ConcurrentWriteError(LakeError):
    """Another writer committed to the table while this commit was prepared, in a way Delta
    cannot reconcile; the commit did not happen."""
