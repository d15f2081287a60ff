"""A small Pub/Sub API server for client tests: real gRPC over a loopback socket.

It speaks ``eventbus.v1.PubSub`` as the reference documents it (auth headers and trailers,
10-byte replay ids, at most 100 pending per stream, keepalives, replay presets, corrupted
replay ids, ManagedSubscribe commits, Publish/PublishStream with the 1 MB per-event limit)
and injects the faults the client must survive. Every event it ever appended stays in
``log(topic)``, the ground truth the tests compare against.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from ingest.pubsub import pb2, pb2_grpc
from ingest.schema import EventSchema

PREFIX = "sfdc.platform.eventbus.grpc."
MAX_EVENT_BYTES = 1024 * 1024


@dataclass
class Faults:
    fail_every: int = 0  # end a Subscribe stream with UNAVAILABLE after this many events
    latency: float = 0.0  # seconds added before every Subscribe response
    keepalive_interval: float = 0.2
    idle_close: float = 5.0


@dataclass
class Managed:
    topic: str
    default_replay: str = "LATEST"
    committed: bytes = b""


@dataclass
class _Topic:
    name: str
    schema: EventSchema | None
    events: list[pb2.ConsumerEvent] = field(default_factory=list)


class FakeBus(pb2_grpc.PubSubServicer):
    def __init__(self, *, tokens: dict[str, str] | None = None) -> None:
        self._lock = threading.Condition()
        self._topics: dict[str, _Topic] = {}
        self._schemas: dict[str, EventSchema] = {}
        self._counter = 1000
        self.auth = tokens is not None
        self.tokens = dict(tokens or {})  # token -> tenant id
        self.faults = Faults()
        self.managed: dict[str, Managed] = {}
        self.streams_opened = 0
        self.first_requests: list[pb2.FetchRequest] = []
        self.max_pending_seen = 0
        self.fetch_requests = 0
        self.trace_ids: list[str] = []
        self.purged: set[bytes] = set()
        self._server: grpc.Server | None = None
        self.port = 0

    # -- control --

    def start(self) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        pb2_grpc.add_PubSubServicer_to_server(self, server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait()

    def add_topic(self, name: str, schema: EventSchema | None) -> None:
        with self._lock:
            self._topics[name] = _Topic(name, schema)
            if schema is not None:
                self._schemas[schema.schema_id] = schema

    def add_schema(self, topic: str, schema: EventSchema) -> None:
        with self._lock:
            self._topics[topic].schema = schema
            self._schemas[schema.schema_id] = schema

    def append(
        self, topic: str, payload: bytes, *, schema_id: str | None = None, event_id: str = ""
    ) -> bytes:
        with self._lock:
            t = self._topics[topic]
            sid = schema_id or (t.schema.schema_id if t.schema else "")
            self._counter += 3  # replay ids have gaps, like Salesforce's
            rid = self._counter.to_bytes(8, "big") + b"\x00\x00"
            t.events.append(
                pb2.ConsumerEvent(
                    event=pb2.ProducerEvent(
                        id=event_id or str(uuid.uuid4()), schema_id=sid, payload=payload
                    ),
                    replay_id=rid,
                )
            )
            self._lock.notify_all()
            return rid

    def log(self, topic: str) -> list[pb2.ConsumerEvent]:
        with self._lock:
            return list(self._topics[topic].events)

    def purge_before(self, topic: str, count: int) -> None:
        """Forget the first ``count`` events: their replay ids become unknown."""
        with self._lock:
            t = self._topics[topic]
            for e in t.events[:count]:
                self.purged.add(e.replay_id)
            del t.events[:count]

    def expire_tokens(self) -> None:
        with self._lock:
            self.tokens.clear()
            self._lock.notify_all()

    # -- helpers --

    def _abort(
        self, context: grpc.ServicerContext, status: grpc.StatusCode, code: str, text: str
    ) -> None:
        rpc = str(uuid.uuid4())
        context.set_trailing_metadata((("error-code", PREFIX + code), ("rpc-id", rpc)))
        context.abort(status, f"{text} rpcId: {rpc}")

    def _check_auth(self, context: grpc.ServicerContext) -> None:
        md = dict(context.invocation_metadata())
        if "x-client-trace-id" in md:
            self.trace_ids.append(str(md["x-client-trace-id"]))
        if not self.auth:
            return
        token = md.get("accesstoken")
        with self._lock:
            ok = token in self.tokens and md.get("tenantid") == self.tokens[str(token)]
        if not ok or not md.get("instanceurl"):
            self._abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "service.auth.error",
                "An authentication exception occurred. Provide valid authentication via "
                "metadata headers.",
            )

    def _token_ok(self, context: grpc.ServicerContext) -> bool:
        if not self.auth:
            return True
        md = dict(context.invocation_metadata())
        with self._lock:
            return md.get("accesstoken") in self.tokens

    def _topic(self, name: str, context: grpc.ServicerContext) -> _Topic:
        with self._lock:
            t = self._topics.get(name)
        if t is None:
            self._abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                "topic.not.found",
                f"The topic information for org CORE/prod/00D and topic {name} not found.",
            )
        assert t is not None
        return t

    def _start_index(self, t: _Topic, req: Any, context: grpc.ServicerContext) -> int:
        with self._lock:
            if req.replay_preset == pb2.ReplayPreset.EARLIEST:
                return 0
            if req.replay_preset == pb2.ReplayPreset.CUSTOM:
                for i, e in enumerate(t.events):
                    if e.replay_id == req.replay_id:
                        return i + 1
                self._abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "subscription.fetch.replayid.corrupted",
                    "The Replay ID validation failed. Ensure that the Replay ID is valid.",
                )
            return len(t.events)

    # -- RPCs --

    def GetTopic(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check_auth(context)
        t = self._topic(request.topic_name, context)
        return pb2.TopicInfo(
            topic_name=t.name,
            tenant_guid="00Dfake",
            can_publish=t.name.startswith("/event/"),
            can_subscribe=True,
            schema_id=t.schema.schema_id if t.schema else "",
            rpc_id=str(uuid.uuid4()),
        )

    def GetSchema(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check_auth(context)
        self.schema_calls = getattr(self, "schema_calls", 0) + 1
        with self._lock:
            s = self._schemas.get(request.schema_id)
        if s is None:
            code = "schema.validation.failed" if not request.schema_id else "schema.meta.permission"
            self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, code, "Schema error.")
        assert s is not None
        return pb2.SchemaInfo(schema_json=s.json, schema_id=s.schema_id, rpc_id="r")

    def Subscribe(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self._check_auth(context)
        first = next(request_iterator)
        self.first_requests.append(first)
        self.streams_opened += 1
        t = self._topic(first.topic_name, context)
        position = self._start_index(t, first, context)
        yield from self._serve(t, position, first.num_requested, request_iterator, context, None)

    def _serve(
        self,
        t: _Topic,
        position: int,
        initial: int,
        request_iterator: Iterator[Any],
        context: grpc.ServicerContext,
        managed: Managed | None,
    ) -> Iterator[Any]:
        state = {"pending": min(100, initial), "last": time.monotonic(), "done": False}
        commits: list[Any] = []
        bad: list[str] = []

        def read() -> None:
            try:
                for req in request_iterator:
                    with self._lock:
                        if managed is not None and req.HasField("commit_replay_id_request"):
                            commits.append(req.commit_replay_id_request)
                        if req.num_requested < 0 or (req.num_requested == 0 and managed is None):
                            bad.append("subscription.fetch.requested.events.invalid")
                        if req.num_requested > 0:
                            self.fetch_requests += 1
                        state["pending"] = min(100, state["pending"] + req.num_requested)
                        self.max_pending_seen = max(self.max_pending_seen, state["pending"])
                        state["last"] = time.monotonic()
                        self._lock.notify_all()
            except Exception:
                pass
            with self._lock:
                state["done"] = True
                self._lock.notify_all()

        threading.Thread(target=read, daemon=True).start()
        delivered = 0
        last_sent = time.monotonic()
        next_rid = t.events[position - 1].replay_id if position > 0 else None
        while context.is_active():
            with self._lock:
                if bad:
                    break
                if not self._token_ok(context):
                    break
                idx = self._index_after(t, next_rid, position)
                available = len(t.events) - idx
                pending = state["pending"]
                commit_batch = list(commits)
                commits.clear()
                if pending > 0 and available > 0:
                    n = min(pending, available, 100)
                    if self.faults.fail_every:
                        n = min(n, self.faults.fail_every - delivered)
                    batch = t.events[idx : idx + n]
                    state["pending"] = pending - n
                elif not commit_batch:
                    now = time.monotonic()
                    if pending == 0 and now - state["last"] > self.faults.idle_close:
                        break
                    if pending > 0 and now - last_sent >= self.faults.keepalive_interval:
                        batch = []
                    else:
                        self._lock.wait(timeout=0.02)
                        continue
                else:
                    batch = []
                pending_after = state["pending"]
            if self.faults.latency:
                time.sleep(self.faults.latency)
            latest = batch[-1].replay_id if batch else self._latest(t)
            if batch:
                next_rid = batch[-1].replay_id
                position = -1
            if managed is None:
                yield pb2.FetchResponse(
                    events=batch,
                    latest_replay_id=latest,
                    rpc_id=str(uuid.uuid4()),
                    pending_num_requested=pending_after,
                )
            else:
                resp = pb2.ManagedFetchResponse(
                    events=batch,
                    latest_replay_id=latest,
                    rpc_id=str(uuid.uuid4()),
                    pending_num_requested=pending_after,
                )
                if commit_batch:
                    last = commit_batch[-1]
                    known = {e.replay_id for e in t.events}
                    if last.replay_id in known or last.replay_id == self._latest(t):
                        managed.committed = last.replay_id
                        resp.commit_response.CopyFrom(
                            pb2.CommitReplayResponse(
                                commit_request_id=last.commit_request_id,
                                replay_id=last.replay_id,
                                process_time=int(time.time() * 1000),
                            )
                        )
                    else:
                        resp.commit_response.CopyFrom(
                            pb2.CommitReplayResponse(
                                commit_request_id=last.commit_request_id,
                                replay_id=last.replay_id,
                                error=pb2.Error(code=pb2.ErrorCode.COMMIT, msg="invalid replay id"),
                            )
                        )
                yield resp
            last_sent = time.monotonic()
            delivered += len(batch)
            if self.faults.fail_every and delivered >= self.faults.fail_every:
                self._abort(
                    context,
                    grpc.StatusCode.UNAVAILABLE,
                    "service.unavailable",
                    "The Pub/Sub API service is unavailable.",
                )
        if bad:
            self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, bad[0], "Invalid fetch.")
        if not self._token_ok(context):
            self._abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "service.auth.error",
                "An authentication exception occurred.",
            )
        if context.is_active() and not state["done"]:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "idle stream closed")

    def _index_after(self, t: _Topic, rid: bytes | None, position: int) -> int:
        if position >= 0 and rid is None:
            return position
        for i in range(len(t.events) - 1, -1, -1):
            if t.events[i].replay_id == rid:
                return i + 1
        return 0

    def _latest(self, t: _Topic) -> bytes:
        return (self._counter).to_bytes(8, "big") + b"\x00\x00"

    def ManagedSubscribe(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext
    ) -> Any:
        self._check_auth(context)
        first = next(request_iterator)
        key = first.developer_name or first.subscription_id
        m = self.managed.get(key)
        if m is None:
            self._abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                "managed.subscription.developer.name.not.found",
                f"Managed subscription {key} not found.",
            )
        assert m is not None
        self.streams_opened += 1
        t = self._topic(m.topic, context)
        if m.committed:
            with self._lock:
                ids = [e.replay_id for e in t.events]
            position = ids.index(m.committed) + 1 if m.committed in ids else len(ids)
        else:
            position = 0 if m.default_replay == "EARLIEST" else len(t.events)
        yield from self._serve(t, position, first.num_requested, request_iterator, context, m)

    def _publish(self, request: Any, context: grpc.ServicerContext) -> Any:
        t = self._topic(request.topic_name, context)
        results = []
        for ev in request.events:
            key = ev.id or str(uuid.uuid4())
            if len(ev.payload) > MAX_EVENT_BYTES:
                results.append(
                    pb2.PublishResult(
                        error=pb2.Error(code=pb2.ErrorCode.PUBLISH, msg="event exceeds 1 MB"),
                        correlation_key=key,
                    )
                )
                continue
            rid = self.append(t.name, ev.payload, schema_id=ev.schema_id, event_id=key)
            results.append(pb2.PublishResult(replay_id=rid, correlation_key=key))
        # Results in reverse order: clients must correlate by key, not by position.
        return pb2.PublishResponse(
            results=list(reversed(results)),
            schema_id=t.schema.schema_id if t.schema else "",
            rpc_id=str(uuid.uuid4()),
        )

    def Publish(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check_auth(context)
        return self._publish(request, context)

    def PublishStream(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self._check_auth(context)
        for request in request_iterator:
            yield self._publish(request, context)
