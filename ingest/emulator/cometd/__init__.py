"""The emulator's Streaming API (Bayeux/CometD long polling), on its HTTP(S) port.

``/cometd/<version>`` serves PushTopic channels (``/topic/<Name>``, evaluated against the
record changes of the change events on the bus), generic channels (``/u/<name>``, fed by the
Streaming Channel Push resource) and the platform event and change event channels
(``/event/...``, ``/data/...``: the gRPC side's events as JSON). See ``docs/streaming-api.md``.
"""

from ingest.emulator.cometd.bayeux import BROWSER_COOKIE, ERRORS, CometdSettings
from ingest.emulator.cometd.server import CometdApi

__all__ = ["BROWSER_COOKIE", "ERRORS", "CometdApi", "CometdSettings"]
