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
    ├── DecodeError            an event payload, bitmap or diff could not be decoded
    │   ├── BitmapError            a bitmap names a field the schema does not have
    │   └── DiffError              a diff-encoded value cannot be rebuilt or fails its SHA-256
    ├── RestError              a REST API call failed (HTTP status, Salesforce errorCode)
    │   └── RestUnavailableError   the server could not answer (5xx, network): retry later
    ├── CheckpointError        the replay checkpoint in Delta is inconsistent or unwritable
    └── LakeError              a Delta table operation failed (engine, commit conflict, schema)

Messages name the stage, what was expected and what was received, and the fix when there is
one. They never contain secrets or event payloads.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "AuthRejectedError",
    "AuthUnavailableError",
    "BitmapError",
    "CheckpointError",
    "ConfigError",
    "DecodeError",
    "DiffError",
    "LakeError",
    "PermanentError",
    "PubSubError",
    "ReplayIdError",
    "RestError",
    "RestUnavailableError",
    "SfcdcError",
    "TransientError",
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


class CheckpointError(SfcdcError):
    """The replay checkpoint could not be read or written consistently."""


class LakeError(SfcdcError):
    """A Delta table operation failed."""
