"""A small client of Salesforce's REST API: SOQL queries, page by page, counts, describes and
single resources.

:meth:`RestClient.query` sends ``GET <instance>/services/data/<version>/query?q=<SOQL>`` with the
bearer token of an injected :class:`~ingest.auth.TokenManager` and yields the records of every
page, following ``nextRecordsUrl`` until ``done``. :meth:`RestClient.query_all` does the same
with ``queryAll``, which also returns records in the recycle bin (``IsDeleted = true``).
:meth:`RestClient.count` answers ``SELECT COUNT() ...`` with the query's ``totalSize``,
:meth:`RestClient.describe` returns ``sobjects/<Object>/describe``, and :meth:`RestClient.send`
is the one request path every call (and :mod:`ingest.bulk`'s Bulk API 2.0 jobs) goes through.
:meth:`~RestClient.get`, :meth:`~RestClient.post` and :meth:`~RestClient.patch` reach one
resource (a setup record such as a PushTopic).

Failures are :class:`~ingest.errors.RestError` (with the HTTP status and Salesforce's
``errorCode``); a token the server rejects (``INVALID_SESSION_ID``) is refreshed once and the
call repeated, and if that fails too it is an :class:`~ingest.errors.AuthError`. Server errors
and network failures are retried with a backoff (the injected ``sleep``) and end as
:class:`~ingest.errors.RestUnavailableError`. Access tokens never appear in messages or logs.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx

from ingest.auth import Credentials, TokenManager, http_client
from ingest.client import TlsSettings
from ingest.errors import AuthError, AuthUnavailableError, RestError, RestUnavailableError
from ingest.tls import trusted_roots, untrusted_message, verification_failure

__all__ = ["RestClient"]

_log = logging.getLogger(__name__)
_VERSION = re.compile(r"^v\d{2}\.\d$")
_RETRY_STATUSES = frozenset({500, 502, 503, 504})


def _errors(response: httpx.Response) -> tuple[str, str]:
    """``(errorCode, message)`` of Salesforce's error body ``[{"message", "errorCode"}]``."""
    try:
        body = response.json()
    except ValueError:
        return "", response.text[:300]
    if isinstance(body, list) and body and isinstance(body[0], Mapping):
        first = body[0]
        return str(first.get("errorCode", "")), str(first.get("message", "")).strip()
    if isinstance(body, Mapping):
        return str(body.get("error", body.get("errorCode", ""))), str(
            body.get("error_description", body.get("message", ""))
        )
    return "", str(body)[:300]


class RestClient:
    """SOQL over Salesforce's REST API (see the module docstring).

    ``tokens`` supplies the access token and instance URL; ``tls`` says which CA to trust
    (``ca_file``: the emulator's own; otherwise the public roots). ``batch_size`` asks for
    pages of that many records (Salesforce accepts 200 to 2,000). ``http`` replaces the HTTP
    client (its verification settings are then the caller's); ``sleep`` waits between
    retries, so tests never wait.
    """

    def __init__(
        self,
        tokens: TokenManager,
        *,
        api_version: str = "v62.0",
        tls: TlsSettings | None = None,
        batch_size: int | None = None,
        max_attempts: int = 4,
        backoff_seconds: float = 0.5,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        logger: logging.Logger | None = None,
    ) -> None:
        if _VERSION.fullmatch(api_version) is None:
            raise ValueError(f"api_version must look like 'v62.0' (got {api_version!r})")
        if batch_size is not None and not 200 <= batch_size <= 2000:
            raise ValueError(f"batch_size must be between 200 and 2000 (got {batch_size})")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 (got {max_attempts})")
        self._tokens = tokens
        self.api_version = api_version
        self._batch_size = batch_size
        self._attempts = max_attempts
        self._backoff = backoff_seconds
        self._owns_http = http is None
        ca = tls.ca_file if tls is not None else None
        self._http = http if http is not None else http_client(ca_file=ca)
        self._trusted = trusted_roots(ca) if http is None else None
        self._sleep = sleep
        self._log = logger or _log
        self.requests = 0

    def query(self, soql: str) -> Iterator[dict[str, Any]]:
        """Every record ``soql`` selects (live ones only), page after page."""
        return self._pages("query", soql)

    def query_all(self, soql: str) -> Iterator[dict[str, Any]]:
        """Every record ``soql`` selects, deleted ones (``IsDeleted``) included."""
        return self._pages("queryAll", soql)

    def _pages(self, kind: str, soql: str) -> Iterator[dict[str, Any]]:
        if not isinstance(soql, str) or not soql.strip():
            raise ValueError(f"expected a SOQL query (got {soql!r})")
        path: str | None = f"/services/data/{self.api_version}/{kind}"
        params: dict[str, str] | None = {"q": soql}
        page = 0
        while path is not None:
            body = self._get(path, params)
            page += 1
            records = body.get("records")
            if not isinstance(records, list):
                raise RestError(
                    f"REST {kind}: expected a 'records' list in page {page} (got "
                    f"{type(records).__name__})"
                )
            self._log.debug("REST %s page %d: %d records", kind, page, len(records))
            yield from records
            if body.get("done", True):
                return
            next_url = body.get("nextRecordsUrl")
            if not isinstance(next_url, str) or not next_url.startswith("/services/data/"):
                raise RestError(
                    f"REST {kind}: page {page} says done=false but has no usable nextRecordsUrl "
                    f"(got {next_url!r})"
                )
            path, params = next_url, None

    def count(self, soql: str, *, include_deleted: bool = True) -> int:
        """The number of records ``soql`` (``SELECT COUNT() FROM ...``) counts; with
        ``include_deleted`` those in the recycle bin too (``queryAll``)."""
        if not isinstance(soql, str) or not soql.strip():
            raise ValueError(f"expected a SOQL query (got {soql!r})")
        kind = "queryAll" if include_deleted else "query"
        body = self._get(f"/services/data/{self.api_version}/{kind}", {"q": soql})
        total = body.get("totalSize")
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise RestError(f"REST {kind} of a COUNT(): expected a totalSize (got {total!r})")
        return total

    def describe(self, sobject: str) -> dict[str, Any]:
        """``GET sobjects/<sobject>/describe``: the object's fields, with their types and the
        compound field each part belongs to (``compoundFieldName``)."""
        if not isinstance(sobject, str) or not sobject.isidentifier():
            raise ValueError(f"expected an sObject API name such as 'Account' (got {sobject!r})")
        return self._get(f"/services/data/{self.api_version}/sobjects/{sobject}/describe", None)

    def get(self, path: str) -> dict[str, Any]:
        """``GET <instance><path>`` (``/services/data/v62.0/sobjects/Account/describe``): the
        JSON object answered."""
        return self.json("GET", path)

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST`` a JSON ``body`` (a record create): the JSON object answered."""
        return self.json("POST", path, body=dict(body))

    def patch(self, path: str, body: Mapping[str, Any]) -> None:
        """``PATCH`` a JSON ``body`` (a record update, answered with 204)."""
        self.send("PATCH", path, body=dict(body))

    def _get(self, path: str, params: Mapping[str, str] | None) -> dict[str, Any]:
        return self.json("GET", path, params=params)

    def json(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """:meth:`send` a request and return its JSON object body."""
        response = self.send(method, path, params=params, body=body)
        what = urlsplit(path).path
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise RestError(
                f"REST {method} {what}: expected a JSON object (got "
                f"{type(payload).__name__ if payload is not None else response.text[:100]!r})",
                status=response.status_code,
            )
        return payload

    def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        accept: str = "application/json",
    ) -> httpx.Response:
        """Send ``method path`` (a path under the instance URL) with the access token and
        return the successful (2xx) response. ``body`` goes as JSON.

        A rejected token is refreshed once; server errors and network failures are retried
        with the backoff; any other status raises :class:`~ingest.errors.RestError` with
        Salesforce's ``errorCode`` and message.
        """
        what = f"{method} {urlsplit(path).path}"
        rejected_once = False
        attempt = 0
        while True:
            attempt += 1
            try:
                credentials = self._tokens.current()
            except AuthUnavailableError as exc:
                if attempt >= self._attempts:
                    raise
                self._log.warning("REST %s: login endpoint unavailable (%s); retrying", what, exc)
                self._sleep(self._backoff * 2 ** (attempt - 1))
                continue
            try:
                response = self._send(
                    credentials, method, path, params=params, body=body, accept=accept
                )
            except httpx.HTTPError as exc:
                reason = verification_failure(exc)
                if reason is not None:
                    # Not an outage: the same certificate fails every attempt.
                    raise RestError(
                        f"REST {what}: "
                        + untrusted_message(
                            urlsplit(credentials.instance_url).netloc,
                            reason,
                            checked_against=self._trusted,
                        )
                    ) from exc
                if attempt >= self._attempts:
                    raise RestUnavailableError(
                        f"REST {what}: no answer from {credentials.instance_url} after "
                        f"{attempt} attempts ({type(exc).__name__}: {exc})"
                    ) from exc
                self._sleep(self._backoff * 2 ** (attempt - 1))
                continue
            self.requests += 1
            if 200 <= response.status_code < 300:
                return response
            code, message = _errors(response)
            if response.status_code == 401:
                if rejected_once:
                    raise AuthError(
                        f"REST {what}: the server rejected a freshly obtained token "
                        f"({code or 'HTTP 401'}: {message}); check the connected app's OAuth "
                        "scopes (api) and the user's API permission"
                    )
                rejected_once = True
                self._tokens.invalidate(credentials)
                continue
            if response.status_code in _RETRY_STATUSES or code == "SERVER_UNAVAILABLE":
                if attempt >= self._attempts:
                    raise RestUnavailableError(
                        f"REST {what}: HTTP {response.status_code} {code} after {attempt} "
                        f"attempts: {message}",
                        status=response.status_code,
                        error_code=code,
                    )
                self._sleep(self._backoff * 2 ** (attempt - 1))
                continue
            raise RestError(
                f"REST {what}: HTTP {response.status_code} {code}: {message}",
                status=response.status_code,
                error_code=code,
            )

    def _send(
        self,
        credentials: Credentials,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        body: Any,
        accept: str,
    ) -> httpx.Response:
        headers = {
            "Authorization": f"Bearer {credentials.access_token.reveal()}",
            "Accept": accept,
        }
        if self._batch_size is not None:
            headers["Sforce-Query-Options"] = f"batchSize={self._batch_size}"
        return self._http.request(
            method,
            f"{credentials.instance_url}{path}",
            params=params,
            headers=headers,
            json=body,
        )

    def close(self) -> None:
        """Close the HTTP client this client created."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> RestClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RestClient({self.api_version}, tokens={self._tokens!r})"
