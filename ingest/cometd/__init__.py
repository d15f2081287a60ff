"""The Salesforce Streaming API client (Bayeux/CometD long polling over httpx).

Typical use::

    tokens = TokenManager(ClientCredentials("https://acme.my.salesforce.com", ...))
    with CometdSubscription(
        tokens,
        {"/topic/InvoiceUpdates": REPLAY_ALL, "/data/AccountChangeEvent": REPLAY_NEW},
        durable_position=store.replay_id,  # channel -> last stored replay id
        on_corrupted="earliest",
    ) as sub:
        for item in sub:
            ...  # NotificationBatch, IdleConnect, Reconnected, ReplayGap, MalformedMessage
"""

from ingest.cometd.messages import (
    REPLAY_ALL,
    REPLAY_NEW,
    ChannelKind,
    IdleConnect,
    MalformedMessage,
    Notification,
    NotificationBatch,
    Reconnected,
    ReplayGap,
    StreamItem,
    channel_kind,
    parse_notification,
    split_messages,
)
from ingest.cometd.protocol import MAX_REQUEST_BYTES, Advice, classify, pack
from ingest.cometd.subscriber import CometdSubscription, CorruptedReplayPolicy

__all__ = [
    "MAX_REQUEST_BYTES",
    "REPLAY_ALL",
    "REPLAY_NEW",
    "Advice",
    "ChannelKind",
    "CometdSubscription",
    "CorruptedReplayPolicy",
    "IdleConnect",
    "MalformedMessage",
    "Notification",
    "NotificationBatch",
    "Reconnected",
    "ReplayGap",
    "StreamItem",
    "channel_kind",
    "classify",
    "pack",
    "parse_notification",
    "split_messages",
]
