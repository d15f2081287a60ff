"""The Salesforce Pub/Sub API client: channel, Subscribe, ManagedSubscribe, Publish.

Typical use::

    tokens = TokenManager(ClientCredentials("https://acme.my.salesforce.com", ...))
    channel = connect(DEFAULT_ENDPOINT, tokens=tokens)
    with Subscription(channel, "/data/AccountChangeEvent", start=Latest(), tokens=tokens,
                      durable_position=store.position) as sub:
        for item in sub:
            ...  # EventBatch, Keepalive, Resubscribed, ReplayGap
"""

from ingest.client.channel import DEFAULT_ENDPOINT, TlsSettings, connect, is_loopback
from ingest.client.errors import (
    Disposition,
    Failure,
    UntrustedServerError,
    classify,
    classify_status,
)
from ingest.client.managed import ManagedSubscription
from ingest.client.multi import MultiSubscription
from ingest.client.publisher import Publisher, PublishOutcome
from ingest.client.retry import RetryPolicy
from ingest.client.schemas import SchemaCache, TopicInfo
from ingest.client.stream import (
    MAX_REQUESTED,
    CommitFailed,
    EventBatch,
    EventColumns,
    FlowWindow,
    Item,
    Keepalive,
    ReceivedEvent,
    ReplayGap,
    Resubscribed,
    StreamStats,
    TopicFailed,
)
from ingest.client.subscriber import CorruptedReplayPolicy, Subscription, fetch_request

__all__ = [
    "DEFAULT_ENDPOINT",
    "MAX_REQUESTED",
    "CommitFailed",
    "CorruptedReplayPolicy",
    "Disposition",
    "EventBatch",
    "EventColumns",
    "Failure",
    "FlowWindow",
    "Item",
    "Keepalive",
    "ManagedSubscription",
    "MultiSubscription",
    "PublishOutcome",
    "Publisher",
    "ReceivedEvent",
    "ReplayGap",
    "Resubscribed",
    "RetryPolicy",
    "SchemaCache",
    "StreamStats",
    "Subscription",
    "TlsSettings",
    "TopicFailed",
    "TopicInfo",
    "UntrustedServerError",
    "classify",
    "classify_status",
    "connect",
    "fetch_request",
    "is_loopback",
]
