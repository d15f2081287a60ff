"""Salesforce's Pub/Sub API errors as the emulator reports them.

Errors are reported the way Salesforce reports them: a gRPC status, a description ending in
`` rpcId: <uuid>``, and the trailers ``error-code`` (``sfdc.platform.eventbus.grpc.<code>``)
and ``rpc-id``. Every response message carries the call's ``rpc_id`` as well.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc

__all__ = ["ERROR_CODE_PREFIX", "RpcFailure", "abort_with", "failure"]

# The servicer's log lines stay under the service's logger, whichever module writes them.
logger = logging.getLogger("ingest.emulator.service")

ERROR_CODE_PREFIX = "sfdc.platform.eventbus.grpc."

_S = grpc.StatusCode
# code -> (status, description). Descriptions are Salesforce's where it documents one.
_ERRORS: dict[str, tuple[grpc.StatusCode, str]] = {
    "service.auth.error": (
        _S.UNAUTHENTICATED,
        "An authentication exception occurred. Provide valid authentication via metadata headers.",
    ),
    "service.auth.headers.invalid": (
        _S.UNAUTHENTICATED,
        "The auth headers value for the specified key is invalid. Provide valid auth headers. "
        "The auth headers can't be blank.",
    ),
    "service.unavailable": (_S.UNAVAILABLE, "The Pub/Sub API service is unavailable."),
    "subscription.internal.error": (
        _S.UNAVAILABLE,
        "The subscription encountered an internal error and can't continue. "
        "Try restarting the subscription.",
    ),
    "topic.not.found": (
        _S.NOT_FOUND,
        "The topic information for org CORE/prod/{org} and topic {topic} not found. "
        "Ensure the topic name is correct and that the topic exists.",
    ),
    "topic.validation.empty": (
        _S.INVALID_ARGUMENT,
        "An error occurred while validating the topic information provided. "
        "The topic can't be blank.",
    ),
    "schema.validation.failed": (
        _S.INVALID_ARGUMENT,
        "Schema validation failed. The schema ID can't be blank.",
    ),
    # Salesforce does not document the status for an unknown schema id; NOT_FOUND says what
    # happened and is not retried by clients that retry UNAVAILABLE/INTERNAL.
    "schema.meta.permission": (
        _S.NOT_FOUND,
        "An error occurred while getting the schema for schema ID {schema_id}. Possible reasons "
        "are an incorrect schema ID or incorrect credentials.",
    ),
    "schema.not.found": (
        _S.NOT_FOUND,
        "The schema for schema ID {schema_id} was not found.",
    ),
    "subscription.fetch.requested.events.invalid": (
        _S.INVALID_ARGUMENT,
        "The requested number of events in a fetch request must be greater than zero. "
        "Received: {n}.",
    ),
    "subscription.fetch.topic.mismatch": (
        _S.INVALID_ARGUMENT,
        "There is a mismatch of topic names between requests. "
        "Expected {expected}, received {received}.",
    ),
    "subscription.fetch.replayid.validation.failed": (
        _S.INVALID_ARGUMENT,
        "The Replay ID validation failed. Provide a Replay ID in the custom preset.",
    ),
    "subscription.fetch.replayid.corrupted": (
        _S.INVALID_ARGUMENT,
        "The Replay ID validation failed. Ensure that the Replay ID is valid.",
    ),
    "subscription.fetch.request.invalid": (
        _S.INVALID_ARGUMENT,
        "The fetch request is invalid: {detail}.",
    ),
    "publish.topic.validation.empty": (
        _S.INVALID_ARGUMENT,
        "An error occurred while validating the provided topic information. "
        "The topic can't be blank.",
    ),
    "publish.event.count.invalid": (_S.INVALID_ARGUMENT, "The request contains no events."),
    "publish.topic.mismatch": (
        _S.INVALID_ARGUMENT,
        "There is a mismatch of topic names between requests. "
        "Expected {expected}, received {received}.",
    ),
    "publish.auth.refresh.invalid": (
        _S.INVALID_ARGUMENT,
        "The refresh token shouldn't be provided in the initial request.",
    ),
    "managed.subscription.id.or.developer.name.empty": (
        _S.INVALID_ARGUMENT,
        "The first managed fetch request must set subscription_id or developer_name; "
        "both are blank.",
    ),
    "managed.subscription.subscription.id.invalid": (
        _S.INVALID_ARGUMENT,
        "The managed subscription ID must be a 15- or 18-character ID with key prefix 18x. "
        "Received: {sub_id}.",
    ),
    "managed.subscription.subscription.id.not.found": (
        _S.NOT_FOUND,
        "No managed subscription with ID {sub_id} exists in org {org}.",
    ),
    "managed.subscription.developer.name.not.found": (
        _S.NOT_FOUND,
        "No managed subscription with developer name {name} exists in org {org}.",
    ),
    "managed.subscription.config.stopped": (
        _S.FAILED_PRECONDITION,
        "The managed subscription {name} is in state STOP. Set its state to RUN to subscribe.",
    ),
    "managed.subscription.already.active": (
        _S.ALREADY_EXISTS,
        "The managed subscription {name} already has an active client. "
        "Only one client can subscribe at a time.",
    ),
    "managed.subscription.fetch.request.commit.request.restricted": (
        _S.INVALID_ARGUMENT,
        "A commit request isn't allowed in the first managed fetch request.",
    ),
    "managed.subscription.fetch.request.events.invalid": (
        _S.INVALID_ARGUMENT,
        "The requested number of events in a managed fetch request must be zero or greater. "
        "Received: {n}.",
    ),
    "managed.subscription.fetch.request.invalid": (
        _S.INVALID_ARGUMENT,
        "The managed fetch request is invalid: {detail}.",
    ),
    # Observed on Salesforce as DEADLINE_EXCEEDED with this text; the error-code trailer of
    # that close is not documented, so the emulator names it after the managed family.
    "managed.subscription.commit.timeout": (
        _S.DEADLINE_EXCEEDED,
        "No CommitReplayRequests sent in the last {seconds:g} seconds. "
        "Closing managed subscription.",
    ),
}


class RpcFailure(Exception):
    """A failure to report to the client as a gRPC status with Salesforce trailers."""

    def __init__(self, status: grpc.StatusCode, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def failure(code: str, **details: object) -> RpcFailure:
    """The :class:`RpcFailure` for a Salesforce error code (without its common prefix)."""
    status, template = _ERRORS[code]
    return RpcFailure(status, code, template.format(**details))


def abort_with(context: grpc.ServicerContext, rpc_id: str, error: RpcFailure) -> NoReturn:
    """End the call with ``error``: status, description ending ``rpcId: <id>``, trailers."""
    context.set_trailing_metadata(
        (("error-code", ERROR_CODE_PREFIX + error.code), ("rpc-id", rpc_id))
    )
    logger.info("rpc %s failed: %s %s", rpc_id, error.status.name, error.code)
    context.abort(error.status, f"{error.message} rpcId: {rpc_id}")
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover
