"""The HTTP side of the Streaming API client: ``POST <instance>/cometd/<version>`` over httpx.

One :class:`httpx.Client` carries every request of a subscription, so the cookies the server
sets (``BAYEUX_BROWSER`` and the load balancer's) are kept and sent back, as the guide
requires. Each request has ``Authorization: Bearer <token>`` and ``Content-Type:
application/json``. A network failure, a timeout or a server error (5xx) is a
:class:`~ingest.errors.StreamingUnavailableError`; any other answer is returned as it came for
the protocol layer to read. Tokens never appear in messages or logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from ingest.auth_flows import Credentials
from ingest.errors import StreamingUnavailableError

__all__ = ["BayeuxTransport", "RawAnswer"]


@dataclass(frozen=True, slots=True)
class RawAnswer:
    """An HTTP answer: status and body text."""

    status: int
    text: str


class BayeuxTransport:
    """Posts Bayeux bodies to one org's ``/cometd/<api_version>`` endpoint."""

    def __init__(self, http: httpx.Client, *, api_version: str) -> None:
        self._http = http
        self.api_version = api_version
        self.requests = 0

    def endpoint(self, credentials: Credentials) -> str:
        return f"{credentials.instance_url}/cometd/{self.api_version}"

    def post(
        self,
        credentials: Credentials,
        body: str,
        *,
        timeout: float,
        stage: str,
        idle_on_timeout: bool = False,
    ) -> RawAnswer | None:
        """``body``'s answer; ``None`` when ``idle_on_timeout`` and no answer came within
        ``timeout`` (a long poll that was asked to end sooner: nothing was waiting)."""
        url = self.endpoint(credentials)
        headers = {
            "Authorization": f"Bearer {credentials.access_token.reveal()}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        self.requests += 1
        try:
            response = self._http.post(
                url, content=body.encode("utf-8"), headers=headers, timeout=timeout
            )
        except httpx.TimeoutException as exc:
            if idle_on_timeout:
                return None
            raise StreamingUnavailableError(
                f"{stage}: no answer from {url} within {timeout:.0f} s ({type(exc).__name__})",
                channel=stage,
            ) from exc
        except httpx.HTTPError as exc:
            raise StreamingUnavailableError(
                f"{stage}: the request to {url} failed ({type(exc).__name__}: {exc})",
                channel=stage,
            ) from exc
        if response.status_code >= 500:
            raise StreamingUnavailableError(
                f"{stage}: {url} answered HTTP {response.status_code}; retrying later",
                code=response.status_code,
                channel=stage,
            )
        return RawAnswer(response.status_code, response.text)

    def close(self) -> None:
        self._http.close()
