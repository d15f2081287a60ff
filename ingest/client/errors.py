"""What a failed Pub/Sub API call means, and what to do about it.

Salesforce reports a failure twice: as a gRPC status (``UNAVAILABLE``, ``INVALID_ARGUMENT``)
and, more precisely, in an ``error-code`` trailer (``sfdc.platform.eventbus.grpc.
subscription.fetch.replayid.corrupted``) next to an ``rpc-id`` trailer for support cases.
:func:`classify` reads both (the trailer wins when present) and sorts the failure into one
of four dispositions:

- ``transient``: retry the call after a backoff (service unavailable, internal errors, reset
  streams, deadlines, protection limits);
- ``auth``: refresh the token, then retry at once (expired or revoked session);
- ``replay``: the replay id is unknown, malformed or expired: apply the corrupted-replay policy;
- ``permanent``: retrying cannot help (unknown topic, missing permission, licence, limits,
  a server certificate that fails verification); the message says what to fix.

A certificate that fails verification surfaces as ``UNAVAILABLE`` like an outage; the channel
of :func:`ingest.client.channel.connect` replaces such a failure by an
:class:`UntrustedServerError` that names the cause (see :mod:`ingest.tls`), and a status text
that carries ``CERTIFICATE_VERIFY_FAILED`` is recognised here as well.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import grpc

from ingest.errors import (
    AuthRejectedError,
    PermanentError,
    PubSubError,
    ReplayIdError,
    TransientError,
)
from ingest.tls import untrusted_message, verification_failure

__all__ = [
    "ERROR_CODE_PREFIX",
    "Disposition",
    "Failure",
    "UntrustedServerError",
    "classify",
    "classify_status",
]

ERROR_CODE_PREFIX = "sfdc.platform.eventbus.grpc."

Disposition = Literal["transient", "auth", "replay", "permanent"]

# Keyed by the error code without ERROR_CODE_PREFIX. The text says what to fix.
_BY_CODE: dict[str, tuple[Disposition, str]] = {
    "service.unavailable": ("transient", "the Pub/Sub API service is unavailable"),
    "subscription.internal.error": ("transient", "the subscription hit an internal error"),
    "schema.api.unavailable": ("transient", "the schema service is unavailable"),
    "topic.api.unavailable": ("transient", "the topic service is unavailable"),
    "service.protection.triggered": (
        "transient",
        "the service is shedding connections (too many connections or requests)",
    ),
    "service.protection.stream.limit.triggered": (
        "transient",
        "too many requests on one stream",
    ),
    "subscription.fetch.replay.repeated": (
        "transient",
        "the server saw an older replay id than before (internal); resubscribing",
    ),
    "publish.stream.sweeper.timeout": (
        "transient",
        "the publish stream was idle too long and was closed",
    ),
    "managed.subscription.already.active": (
        "transient",
        "another client holds this managed subscription (after an unclean disconnect the "
        "server keeps the slot for several minutes); stop the other client or wait",
    ),
    "service.auth.error": ("auth", "the access token was rejected (expired or revoked)"),
    "service.auth.headers.invalid": (
        "auth",
        "the accesstoken / instanceurl / tenantid headers were rejected",
    ),
    "service.auth.refresh.invalid": ("auth", "the auth refresh value was rejected"),
    "subscription.fetch.replayid.corrupted": (
        "replay",
        "the replay id is unknown, malformed or older than the retention window (72 h)",
    ),
    "subscription.fetch.replayid.validation.failed": (
        "replay",
        "the replay id failed validation (a CUSTOM start needs a replay id)",
    ),
    "topic.not.found": (
        "permanent",
        "the topic does not exist for this org: check the name (case-sensitive: "
        "/data/AccountChangeEvent, /data/Invoice__ChangeEvent, /event/Order__e) and that "
        "Change Data Capture is enabled for the object",
    ),
    "topic.meta.permission": (
        "permanent",
        "the user cannot read the topic's metadata: check the topic name and that the "
        "integration user may read the object or event",
    ),
    "topic.validation.empty": ("permanent", "the topic name is blank"),
    "subscription.topic.cannot.subscribe": (
        "permanent",
        "the user may not subscribe to this topic: grant the integration user read access "
        "to the object (and 'View All Data' or the event's permission set)",
    ),
    "service.tenant.license": (
        "permanent",
        "the org is not licensed for the Pub/Sub API: ask Salesforce to enable it",
    ),
    "subscription.limit.exceeded": (
        "permanent",
        "the org exhausted its 24-hour event delivery allocation: wait for the rolling "
        "window or raise the allocation",
    ),
    "concurrent.client.limit.exceeded": (
        "permanent",
        "the org has too many concurrent Pub/Sub API clients: stop other subscribers",
    ),
    "schema.meta.permission": (
        "permanent",
        "the schema cannot be read: check the schema id and the user's access",
    ),
    "schema.validation.failed": (
        "permanent",
        "the schema id is blank (GetTopic on a multi-entity channel has no schema; decode "
        "each event with its own schema id)",
    ),
    "subscription.fetch.topic.mismatch": (
        "permanent",
        "a later FetchRequest named another topic than the first",
    ),
    "subscription.fetch.requested.events.invalid": (
        "permanent",
        "num_requested must be greater than zero",
    ),
    "subscription.fetch.overflow": ("permanent", "too many events were requested"),
    "subscription.fetch.request.invalid": ("permanent", "the FetchRequest was malformed"),
    "publish.event.count.invalid": ("permanent", "a publish request had no events"),
    "publish.topic.mismatch": ("permanent", "a later PublishRequest named another topic"),
    "publish.auth.refresh.invalid": ("permanent", "auth_refresh is not allowed there"),
    "publish.topic.validation.empty": ("permanent", "the publish topic is blank"),
    "managed.subscription.config.stopped": (
        "permanent",
        "the managed subscription is stopped: set its state to RUN",
    ),
    "managed.subscription.config.deleted": (
        "permanent",
        "the managed subscription was deleted",
    ),
    "managed.subscription.developer.name.not.found": (
        "permanent",
        "no ManagedEventSubscription has this developer name",
    ),
    "managed.subscription.subscription.id.not.found": (
        "permanent",
        "no ManagedEventSubscription has this id",
    ),
    "managed.subscription.subscription.id.invalid": (
        "permanent",
        "the managed subscription id is malformed (an 18x... record id)",
    ),
    "managed.subscription.id.or.developer.name.empty": (
        "permanent",
        "a managed subscription needs an id or a developer name",
    ),
    "managed.subscription.fetch.events.invalid": ("permanent", "num_requested was invalid"),
    "managed.subscription.fetch.request.invalid": (
        "permanent",
        "the ManagedFetchRequest was malformed",
    ),
    "managed.subscription.fetch.request.commit.request.restricted": (
        "permanent",
        "a commit is not allowed in the first ManagedFetchRequest",
    ),
    "managed.subscription.fetch.request.auth.request.restricted": (
        "permanent",
        "auth_refresh is not allowed in the first ManagedFetchRequest",
    ),
    "managed.subscription.commit.timeout": (
        "transient",
        "nothing was committed for 30 minutes, so the server closed the stream; commit "
        "keepalive replay ids too",
    ),
}

_BY_STATUS: dict[str, Disposition] = {
    "UNAVAILABLE": "transient",
    "DEADLINE_EXCEEDED": "transient",
    "INTERNAL": "transient",  # how grpc reports RST_STREAM and torn connections
    "UNKNOWN": "transient",
    "ABORTED": "transient",
    "CANCELLED": "transient",  # server-side RST_STREAM CANCEL; our own cancels never get here
    "RESOURCE_EXHAUSTED": "transient",
    "ALREADY_EXISTS": "transient",
    "UNAUTHENTICATED": "auth",
    "PERMISSION_DENIED": "permanent",
    "NOT_FOUND": "permanent",
    "INVALID_ARGUMENT": "permanent",
    "FAILED_PRECONDITION": "permanent",
    "OUT_OF_RANGE": "permanent",
    "UNIMPLEMENTED": "permanent",
    "OK": "transient",  # a stream the server ended without an error: open a new one
}

_EXCEPTIONS: dict[Disposition, type[PubSubError]] = {
    "transient": TransientError,
    "auth": AuthRejectedError,
    "replay": ReplayIdError,
    "permanent": PermanentError,
}


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified failure: what the server said and what it means."""

    disposition: Disposition
    status: str
    error_code: str
    rpc_id: str
    description: str
    meaning: str

    @property
    def short_code(self) -> str:
        """The error code without Salesforce's common prefix (``service.unavailable``)."""
        return self.error_code.removeprefix(ERROR_CODE_PREFIX)

    def summary(self) -> str:
        """Status, error code, rpc id (never payloads or secrets)."""
        code = f" {self.short_code}" if self.error_code else ""
        rpc = f" rpc-id {self.rpc_id}" if self.rpc_id else ""
        return f"{self.status}{code}{rpc}"

    def line(self) -> str:
        """One line for a warning: :meth:`summary` and what the server or the network said
        (the address and the cause of a connection that failed; never payloads or secrets)."""
        return f"{self.summary()}: {self.description}" if self.description else self.summary()

    def exception(self, action: str) -> PubSubError:
        """The :mod:`ingest.errors` exception for this failure; ``action`` names what failed
        (``"Subscribe to /data/AccountChangeEvent"``)."""
        detail = f": {self.description}" if self.description else ""
        code = f" [{self.error_code}]" if self.error_code else ""
        message = f"{action} failed with {self.status}{code}{detail}; {self.meaning}"
        if self.rpc_id and self.rpc_id not in message:
            message += f" (rpc-id {self.rpc_id})"
        return _EXCEPTIONS[self.disposition](
            message, status=self.status, error_code=self.error_code, rpc_id=self.rpc_id
        )


class UntrustedServerError(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[type-arg]
    """A call that failed because the server's certificate did not verify.

    gRPC reports it as ``UNAVAILABLE``, often naming another address that refused the
    connection; this error keeps that status and says the real cause (``message``, from
    :func:`ingest.tls.untrusted_message`). It is a finished call, so it can stand wherever
    gRPC hands out a failed call or raises one.
    """

    def __init__(self, message: str, original: grpc.RpcError | None = None) -> None:
        super().__init__(message)
        self.message = message
        code = original.code() if isinstance(original, grpc.Call) else None
        self._code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNAVAILABLE

    def __str__(self) -> str:
        return self.message

    # grpc.Call
    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    # The stubs of RpcError and Call disagree on the element type; there are none either way.
    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:  # type: ignore[override]
        return ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self.message

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    # grpc.Future
    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> NoReturn:
        raise self

    def exception(self, timeout: float | None = None) -> UntrustedServerError:
        return self

    def traceback(self, timeout: float | None = None) -> types.TracebackType | None:
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)

    # a response iterator that ends at once with this failure
    def __iter__(self) -> UntrustedServerError:
        return self

    def __next__(self) -> NoReturn:
        raise self


def classify_status(
    status: str,
    *,
    error_code: str = "",
    rpc_id: str = "",
    description: str = "",
) -> Failure:
    """Classify from the pieces of a gRPC error (``status`` is the status code name)."""
    short = error_code.removeprefix(ERROR_CODE_PREFIX)
    untrusted = verification_failure(description) if status == "UNAVAILABLE" else None
    if short in _BY_CODE:
        disposition, meaning = _BY_CODE[short]
    elif untrusted is not None:
        disposition = "permanent"
        meaning = untrusted_message("the server", untrusted)
        description = ""
    elif status == "RESOURCE_EXHAUSTED" and "larger than max" in description:
        disposition = "permanent"
        meaning = "a message exceeded the gRPC size limit; raise max_receive_bytes"
    elif _looks_like_replay_failure(status, description):
        # Some servers and proxies drop trailers; the description is documented text.
        disposition, meaning = _BY_CODE["subscription.fetch.replayid.corrupted"]
    else:
        disposition = _BY_STATUS.get(status, "permanent")
        meaning = _status_meaning(status, disposition)
    return Failure(disposition, status, error_code, rpc_id, description, meaning)


def classify(exc: BaseException) -> Failure:
    """Classify an exception raised by a gRPC call (``grpc.RpcError``) or stream.

    Anything that is not a gRPC error is classified as permanent with its type name, so that
    programming errors are never retried.
    """
    if isinstance(exc, UntrustedServerError):
        return Failure("permanent", exc.code().name, "", "", "", exc.message)
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        code = exc.code()
        status = code.name if isinstance(code, grpc.StatusCode) else str(code)
        trailers = _metadata(exc.trailing_metadata())
        return classify_status(
            status,
            error_code=trailers.get("error-code", ""),
            rpc_id=trailers.get("rpc-id", ""),
            description=exc.details() or "",
        )
    return Failure(
        "permanent", type(exc).__name__, "", "", str(exc), "an unexpected local error occurred"
    )


def _metadata(pairs: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in pairs or ():
        out[key.lower()] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out


def _looks_like_replay_failure(status: str, description: str) -> bool:
    return status == "INVALID_ARGUMENT" and "replay id validation failed" in description.lower()


def _status_meaning(status: str, disposition: Disposition) -> str:
    if disposition == "transient":
        return "the connection or service failed temporarily; retrying"
    if disposition == "auth":
        return "the credentials were rejected; refreshing them"
    if status == "PERMISSION_DENIED":
        return "the user lacks a permission for this call"
    if status == "NOT_FOUND":
        return "the named topic, schema or subscription does not exist"
    return "retrying cannot help; check the request"
