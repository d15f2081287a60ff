"""Retry policy for long-lived streams: exponential backoff with full jitter, bounded.

Salesforce asks clients to retry failed streams with exponential backoff and a bounded number
of attempts (seed "Retry Long-Lived RPC Calls"). Full jitter (a uniform draw between zero and
the exponential cap) keeps many subscribers that failed together from reconnecting in step.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from ingest.auth import TokenManager
from ingest.client.errors import classify

__all__ = ["RetryPolicy", "call_refreshing"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to reopen a failed stream.

    ``max_attempts`` counts consecutive failed attempts; the count resets once events flow
    again. ``auth_retries`` bounds consecutive credential rejections (each one refreshes the
    token first), after which the rejection is raised. ``first_contact`` bounds the seconds a
    subscription that has never reached its server keeps trying: a first connection that
    fails (a name that does not resolve, a refused connection, a login endpoint that cannot be
    reached) is raised, naming the address and the cause, within that time instead of after
    every attempt; once the server has answered, outages are retried as the attempts allow.
    """

    max_attempts: int = 10
    initial_backoff: float = 0.5
    max_backoff: float = 30.0
    multiplier: float = 2.0
    auth_retries: int = 3
    first_contact: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 (got {self.max_attempts})")
        if self.initial_backoff < 0 or self.max_backoff < self.initial_backoff:
            raise ValueError(
                "backoffs must satisfy 0 <= initial_backoff <= max_backoff (got "
                f"initial_backoff={self.initial_backoff}, max_backoff={self.max_backoff})"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1 (got {self.multiplier})")
        if self.auth_retries < 0:
            raise ValueError(f"auth_retries must be >= 0 (got {self.auth_retries})")
        if self.first_contact < 0:
            raise ValueError(f"first_contact must be >= 0 seconds (got {self.first_contact})")

    def first_contact_over(self, waited: float, delay: float) -> bool:
        """Whether a subscription that never reached its server, failing after ``waited``
        seconds of trying, must give up rather than wait ``delay`` more."""
        return waited + delay > self.first_contact

    def cap(self, attempt: int) -> float:
        """The upper bound of the delay before attempt ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        # Avoid float overflow for long outages: stop growing once past max_backoff.
        cap = self.initial_backoff
        for _ in range(exponent):
            cap *= self.multiplier
            if cap >= self.max_backoff:
                return self.max_backoff
        return min(cap, self.max_backoff)

    def delay(self, attempt: int, *, rand: Callable[[], float] = random.random) -> float:
        """A full-jitter delay for attempt ``attempt``: uniform in ``[0, cap(attempt)]``."""
        return rand() * self.cap(attempt)


def call_refreshing(tokens: TokenManager | None, call: Callable[[], T], action: str) -> T:
    """Run a unary call; when the server rejects its credentials (the call then did
    nothing), refresh the token and run it again, at most twice. Any other failure, or a
    third rejection, raises the classified :mod:`ingest.errors` exception naming ``action``."""
    rejections = 0
    while True:
        credentials = tokens.current() if tokens is not None else None
        try:
            return call()
        except grpc.RpcError as exc:
            failure = classify(exc)
            if failure.disposition == "auth" and tokens is not None and rejections < 2:
                rejections += 1
                tokens.invalidate(credentials)
                continue
            raise failure.exception(action) from None
