"""The Streaming API of one emulated org: channels, PushTopics, generic channels, the Bayeux
endpoint and the REST resources, wired to the event bus the gRPC side serves.

:class:`CometdApi` is what :class:`~ingest.emulator.server.Emulator` exposes as
``emu.streaming``. Change events appended to the bus are decoded into record changes
(:mod:`ingest.emulator.cometd.records`) and evaluated against every PushTopic; platform
and change events are served on their own channels from the bus itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ingest.emulator.cometd.bayeux import ERRORS, BayeuxServer, CometdSettings
from ingest.emulator.cometd.busjson import BusJson
from ingest.emulator.cometd.channels import Hub, channel_kind
from ingest.emulator.cometd.fields import ObjectFields
from ingest.emulator.cometd.generic import STREAMING_CHANNEL_FIELDS, StreamingChannels
from ingest.emulator.cometd.pushtopics import PUSH_TOPIC_FIELDS, PushTopics
from ingest.emulator.cometd.records import RecordState
from ingest.emulator.cometd.rest import CometdRoute, SObjectsRoute
from ingest.emulator.eventlog import EventBus
from ingest.emulator.faults import Faults
from ingest.emulator.oauth import TokenStore
from ingest.emulator.routes import Route
from ingest.emulator.topics import Catalogue

__all__ = ["CometdApi"]

logger = logging.getLogger(__name__)


class CometdApi:
    """See the module docstring. Tests reach the stores (``push_topics``, ``channels``), the
    sessions (``bayeux``) and the knobs (:attr:`batch_size`, :attr:`poll_timeout`)."""

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        tokens: TokenStore,
        faults: Faults,
        settings: CometdSettings,
        clock: Callable[[], float],
        bus: Callable[[], EventBus],
        secure_cookies: bool,
    ) -> None:
        self._catalogue = catalogue
        self._bus = bus
        self._faults = faults
        self._fields: dict[str, tuple[tuple[Any, ...], ObjectFields]] = {}
        self.hub = Hub(
            clock=clock,
            retention=settings.retention,
            bus=bus,
            bus_json=BusJson(catalogue),
            bus_channels=lambda: [t.name for t in catalogue],
        )
        self.push_topics = PushTopics(self.hub, self.object_fields)
        self.bayeux = BayeuxServer(
            self.hub,
            tokens=tokens,
            faults=faults,
            settings=settings,
            clock=clock,
            channel_error=self._channel_error,
            secure_cookies=secure_cookies,
        )
        self.channels = StreamingChannels(
            self.hub, clock=clock, online_users=self.bayeux.online_users
        )
        setup = {
            "PushTopic": ObjectFields.plain("PushTopic", PUSH_TOPIC_FIELDS),
            "StreamingChannel": ObjectFields.plain("StreamingChannel", STREAMING_CHANNEL_FIELDS),
        }
        self.routes: tuple[Route, ...] = (
            CometdRoute(self.bayeux),
            SObjectsRoute(
                tokens=tokens,
                push_topics=self.push_topics,
                channels=self.channels,
                object_fields=self.object_fields,
                setup_fields=setup,
            ),
        )
        self._records = RecordState(catalogue)
        self._pump_lock = threading.Lock()
        self._cursors: dict[str, int] = {}
        self._bound: EventBus | None = None
        self._listening: list[str] = []

    # -- knobs -----------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """Most events one ``/meta/connect`` reply delivers (changeable while running)."""
        return self.bayeux.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"batch_size must be an int >= 1 (got {value!r})")
        self.bayeux.batch_size = value

    @property
    def poll_timeout(self) -> float:
        """Real seconds a ``/meta/connect`` is held when nothing is waiting."""
        return self.bayeux.poll_timeout

    @poll_timeout.setter
    def poll_timeout(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"poll_timeout must be > 0 seconds (got {seconds!r})")
        self.bayeux.poll_timeout = float(seconds)

    # -- conveniences for tests and scripts ------------------------------------------------

    def create_push_topic(self, name: str, query: str, **fields: Any) -> str:
        """Create a PushTopic as ``POST sobjects/PushTopic`` would; returns its id."""
        return self.push_topics.create(
            {"Name": name, "Query": query, "ApiVersion": fields.pop("ApiVersion", 62.0), **fields}
        )

    def create_channel(self, name: str, description: str | None = None) -> str:
        """Create a StreamingChannel (``/u/<name>``); returns its id."""
        return self.channels.create({"Name": name, "Description": description}, owner_id="")

    def push(self, channel_id: str, *payloads: str, user_ids: Iterable[str] = ()) -> None:
        """Push generic events as ``POST .../push`` would."""
        users = list(user_ids)
        self.channels.push(
            channel_id, {"pushEvents": [{"payload": p, "userIds": users} for p in payloads]}
        )

    def expire_session(self, client_id: str | None = None) -> int:
        """Forget one client's session (or all): its next connect gets ``403::Unknown
        client``. Returns how many were forgotten."""
        return self.bayeux.expire(client_id)

    def revoke(self, client_id: str | None = None) -> None:
        """Invalidate one session's authentication (or all): its next connect gets
        ``401::Authentication invalid``."""
        self.bayeux.revoke(client_id)

    @property
    def unapplied_diffs(self) -> int:
        """Diffs the record state behind PushTopic notifications could not apply (its record
        lacked the value the diff was made against; the field keeps its previous value)."""
        return self._records.unapplied_diffs

    def sessions_left_open(self) -> int:
        """CometD sessions that ended without a ``/meta/disconnect`` (they expired) plus those
        still open: after a client stopped, anything above zero is a session it left for the
        server to expire, holding one of the org's concurrent clients meanwhile."""
        return self.bayeux.left_open()

    def purge(self, channel: str, *, through: int) -> int:
        """Drop a PushTopic or generic channel's messages up to replay id ``through`` (their
        ids become invalid for replay). Bus channels: use ``emu.faults.purge``."""
        return self.hub.purge(channel, through=through)

    # -- objects and channels ------------------------------------------------------------------

    def object_fields(self, entity: str) -> ObjectFields | None:
        """The fields of an emulated object (its change event topic's current schema) or
        platform event (its schema): what ``describe`` answers."""
        for topic in self._catalogue:
            schema = topic.current_schema
            if topic.kind not in ("change_events", "platform_event") or schema is None:
                continue
            if schema.entity_name.lower() != entity.lower():
                continue
            formulas = self._catalogue.formulas_of(schema.entity_name)
            retyped = self._catalogue.retyped_of(schema.entity_name)
            key = (schema.schema_id, formulas, retyped)
            cached = self._fields.get(schema.entity_name)
            if cached is None or cached[0] != key:
                cached = (key, ObjectFields.of_schema(schema, formulas, dict(retyped)))
                self._fields[schema.entity_name] = cached
            return cached[1]
        return None

    def _channel_error(self, channel: str) -> str | None:
        kind = channel_kind(channel)
        if kind == "generic":
            if self.hub.exists(channel):
                return None
            if self.channels.differs_by_case(channel):
                return ERRORS["case"]
            return ERRORS["unknown_channel"]
        if kind is not None and self.hub.exists(channel):
            return None
        return ERRORS["no_channel"].format(v=channel)

    # -- the bus ---------------------------------------------------------------------------

    def bind(self, bus: EventBus) -> None:
        """Follow ``bus``: events already on it update the record state without notifying
        (they were evaluated when appended, or predate the PushTopics); later ones notify."""
        self.unbind()
        with self._pump_lock:
            if bus is not self._bound:
                self._cursors = {}
                self._bound = bus
                self._pump(bus, notify=False)
        for topic in self._catalogue:
            bus.listen(topic.name, self._appended)
            self._listening.append(topic.name)
        self.bayeux.reopen()

    def unbind(self) -> None:
        bus = self._bound
        if bus is not None:
            for name in self._listening:
                bus.unlisten(name, self._appended)
        self._listening = []

    def close(self) -> None:
        """Stop following the bus and end every waiting long poll."""
        self.unbind()
        self.bayeux.close()

    def _appended(self) -> None:
        with self._pump_lock:
            if self._bound is not None:
                self._pump(self._bound, notify=True)
        self.hub.wake()

    def _pump(self, bus: EventBus, *, notify: bool) -> None:
        for topic in self._catalogue:
            if topic.kind != "change_events":
                continue
            seq = max(self._cursors.get(topic.name, 0), bus.start(topic.name))
            while True:
                events, seq = bus.read(topic.name, seq, 500, 1 << 62)
                if not events:
                    break
                for event in events:
                    for change in self._records.apply(event):
                        if notify:
                            self.push_topics.evaluate(change)
            self._cursors[topic.name] = seq
