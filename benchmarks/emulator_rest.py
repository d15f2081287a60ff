"""A REST client and a Bulk API 2.0 reader logged in to an in-process emulator, as the
benchmarks that read records through Salesforce's query APIs use them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from ingest.auth import ClientCredentials, Secret, TokenManager
from ingest.bulk import BulkQueryClient
from ingest.client import TlsSettings
from ingest.emulator.server import DEFAULT_CLIENT, Emulator
from ingest.rest import RestClient
from pipelines.snapshot_read import BulkRecords


@contextmanager
def rest_and_bulk(emulator: Emulator) -> Iterator[tuple[RestClient, BulkRecords]]:
    """The emulator's default client logged in over OAuth, and a Bulk reader over it."""
    tokens = TokenManager(
        ClientCredentials(
            emulator.http_url,
            client_id=DEFAULT_CLIENT.client_id,
            client_secret=Secret(DEFAULT_CLIENT.client_secret),
        )
    )
    # Long reads: a result set of a million-record job is one large answer.
    http = httpx.Client(timeout=httpx.Timeout(1800.0, connect=10.0))
    with http, RestClient(tokens, tls=TlsSettings(enabled=False), http=http) as rest:
        # The emulator runs a Bulk job in the background from its creation, as Salesforce
        # does: the client polls it with its own pauses, as sfcdc does.
        yield rest, BulkRecords(BulkQueryClient(rest), describe=rest.describe)
