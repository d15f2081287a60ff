"""The REST resources of the Streaming API, on the emulator's HTTP(S) port.

=====================================================================  =========================
``POST   /services/data/vXX.X/sobjects/PushTopic``                      create (201 ``{"id"}``)
``GET | PATCH | DELETE .../sobjects/PushTopic/<id>``                    read, update, delete
``POST   .../sobjects/StreamingChannel``, ``GET | PATCH | DELETE /<id>``  the same
``GET | POST .../sobjects/StreamingChannel/<id>/push``                  subscribers, push events
``GET    .../sobjects/<Object>/describe``                               fields of any emulated
                                                                        object
``GET    .../query?q=SELECT ... FROM PushTopic|StreamingChannel ...``    setup records by SOQL
``POST   /cometd/<version>``                                            the Bayeux endpoint
=====================================================================  =========================

Every resource needs ``Authorization: Bearer <token>``; errors are Salesforce's list of
``{"message", "errorCode", "fields"}``. Queries of other objects are left to the query endpoint
of :mod:`ingest.emulator.rest`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ingest.emulator.cometd.bayeux import BayeuxServer
from ingest.emulator.cometd.fields import ObjectFields
from ingest.emulator.cometd.generic import StreamingChannels
from ingest.emulator.cometd.pushtopics import PushTopics, bind_condition
from ingest.emulator.cometd.sobjects import SObjectError
from ingest.emulator.cometd.soql import SoqlError, evaluate, parse_query
from ingest.emulator.oauth import GrantInfo, TokenStore
from ingest.emulator.routes import HttpAnswer, HttpRequest, json_answer

__all__ = ["CometdRoute", "SObjectsRoute"]

_DATA = re.compile(r"^/services/data/(v\d{2}\.\d)(/.*)?$")
_COMETD = re.compile(r"^/cometd(?:/(?P<version>[^/]*))?/?$")
_SETUP = ("PushTopic", "StreamingChannel")


class CometdRoute:
    """``/cometd/<version>`` to the Bayeux server."""

    def __init__(self, bayeux: BayeuxServer) -> None:
        self._bayeux = bayeux

    def answer(self, request: HttpRequest) -> HttpAnswer | None:
        match = _COMETD.match(request.path)
        if match is None:
            return None
        if request.method != "POST":
            return json_answer(405, [{"successful": False, "error": "405::Use POST"}])
        return self._bayeux.answer(request, match.group("version") or "")


class SObjectsRoute:
    """The ``sobjects`` resources and setup-object queries (see the module docstring)."""

    def __init__(
        self,
        *,
        tokens: TokenStore,
        push_topics: PushTopics,
        channels: StreamingChannels,
        object_fields: Callable[[str], ObjectFields | None],
        setup_fields: Mapping[str, ObjectFields],
    ) -> None:
        self._tokens = tokens
        self._topics = push_topics
        self._channels = channels
        self._fields = object_fields
        self._setup = setup_fields

    def answer(self, request: HttpRequest) -> HttpAnswer | None:
        match = _DATA.match(request.path)
        if match is None:
            return None
        version, rest = match.group(1), (match.group(2) or "").rstrip("/")
        parts = rest.split("/")[1:]
        if parts[:1] == ["query"] and len(parts) == 1:
            soql = request.query.get("q", "")
            if not re.search(r"\bFROM\s+(PushTopic|StreamingChannel)\b", soql, re.IGNORECASE):
                return None
        elif parts[:1] != ["sobjects"] or len(parts) < 2:
            return None
        grant = self._grant(request)
        if grant is None:
            return json_answer(
                401, [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}]
            )
        try:
            if parts[0] == "query":
                return json_answer(200, self._query(request.query["q"], version))
            return self._sobjects(request, version, parts[1:], grant)
        except SObjectError as exc:
            return json_answer(exc.status, exc.body())

    def _grant(self, request: HttpRequest) -> GrantInfo | None:
        scheme, _, token = request.header("authorization").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self._tokens.check(token.strip())

    def _sobjects(
        self, request: HttpRequest, version: str, parts: list[str], grant: GrantInfo
    ) -> HttpAnswer:
        obj = parts[0]
        method = request.method
        if len(parts) == 2 and parts[1] == "describe" and method == "GET":
            fields = self._setup.get(obj) or self._fields(obj)
            if fields is None:
                raise SObjectError(
                    "NOT_FOUND", f"The requested resource does not exist: sObject {obj}", status=404
                )
            return json_answer(200, fields.describe(version))
        store: PushTopics | StreamingChannels
        if obj == "PushTopic":
            store = self._topics
        elif obj == "StreamingChannel":
            store = self._channels
        else:
            raise SObjectError("NOT_FOUND", "The requested resource does not exist", status=404)
        if len(parts) == 1 and method == "POST":
            body = _body(request)
            if isinstance(store, StreamingChannels):
                record_id = store.create(body, owner_id=grant.user_id)
            else:
                record_id = store.create(body)
            return json_answer(201, {"id": record_id, "success": True, "errors": []})
        if len(parts) == 2:
            record_id = parts[1]
            if method == "GET":
                return json_answer(200, _shaped(obj, store.get(record_id), version))
            if method == "PATCH":
                store.update(record_id, _body(request))
                return HttpAnswer(204)
            if method == "DELETE":
                store.delete(record_id)
                return HttpAnswer(204)
        if len(parts) == 3 and parts[2] == "push" and isinstance(store, StreamingChannels):
            if method == "GET":
                return json_answer(200, store.subscribers(parts[1]))
            if method == "POST":
                return json_answer(200, store.push(parts[1], _body(request)))
        raise SObjectError(
            "METHOD_NOT_ALLOWED", f"HTTP method '{method}' not allowed here", status=405
        )

    def _query(self, soql: str, version: str) -> dict[str, Any]:
        try:
            query = parse_query(soql)
            obj = next((o for o in _SETUP if o.lower() == query.entity.lower()), None)
            if obj is None:
                raise SoqlError("INVALID_TYPE", f"sObject type '{query.entity}' is not supported")
            fields = self._setup[obj]
            chosen = []
            for name in query.fields:
                field = fields.get(name)
                if field is None:
                    raise SoqlError("INVALID_FIELD", f"No such column '{name}' on entity '{obj}'")
                chosen.append(field.name)
            where = bind_condition(query.where, fields)
        except SoqlError as exc:
            raise SObjectError(exc.code, exc.message) from exc
        source = self._topics if obj == "PushTopic" else self._channels
        records = []
        for record in source.records():
            if evaluate(where, record.get):
                shaped = {name: record.get(name) for name in chosen}
                records.append(_shaped(obj, {"Id": record["Id"], **shaped}, version, chosen))
        return {"totalSize": len(records), "done": True, "records": records}


def _body(request: HttpRequest) -> Any:
    try:
        return json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise SObjectError("JSON_PARSER_ERROR", f"the request body is not JSON: {exc}") from exc


def _shaped(
    obj: str, record: Mapping[str, Any], version: str, only: list[str] | None = None
) -> dict[str, Any]:
    keys = only if only is not None else list(record)
    out: dict[str, Any] = {
        "attributes": {
            "type": obj,
            "url": f"/services/data/{version}/sobjects/{obj}/{record['Id']}",
        }
    }
    out.update({k: record.get(k) for k in keys})
    return out
