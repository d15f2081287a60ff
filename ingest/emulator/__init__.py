"""A Salesforce Pub/Sub API emulator: a real gRPC server of ``eventbus.v1.PubSub`` with an
OAuth endpoint, a realistic change event generator and fault injection."""

from ingest.emulator.topics import (
    CHANGE_EVENTS_CHANNEL,
    Catalogue,
    EmittedEvent,
    TopicDef,
    TopicKind,
)

__all__ = ["CHANGE_EVENTS_CHANNEL", "Catalogue", "EmittedEvent", "TopicDef", "TopicKind"]
