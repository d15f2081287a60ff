"""Generic streaming: ``StreamingChannel`` records and the Streaming Channel Push resource.

A StreamingChannel's ``Name`` is its channel (``/u/<name>``: at most 80 characters of letters,
digits, ``_`` and ``/``, unique). ``POST sobjects/StreamingChannel/<id>/push`` with
``{"pushEvents": [{"payload": "...", "userIds": [...]}]}`` appends one message per push event
(``data``: ``{"payload": ..., "event": {"createdDate", "replayId"}}``); an empty ``userIds``
broadcasts (``fanoutCount`` -1), otherwise only those users' sessions receive it and the answer
says which of them were subscribed. ``GET .../push`` lists the users subscribed now.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from ingest.emulator.cometd.busjson import iso_datetime
from ingest.emulator.cometd.channels import Hub
from ingest.emulator.cometd.sobjects import SObjectError, check_body, new_id
from ingest.emulator.managed import salesforce_id_18

__all__ = ["STREAMING_CHANNEL_FIELDS", "StreamingChannels"]

STREAMING_CHANNEL_FIELDS: dict[str, tuple[str, str]] = {
    "Id": ("id", "id"),
    "Name": ("string", "string"),
    "Description": ("string", "string"),
    "IsDynamic": ("boolean", "boolean"),
    "IsDeleted": ("boolean", "boolean"),
    "OwnerId": ("id", "reference"),
}
_WRITABLE: dict[str, type | tuple[type, ...]] = {"Name": str, "Description": str}
_NAME = re.compile(r"^/u/[A-Za-z0-9_/]+$")
_MAX_PAYLOAD = 3000


class StreamingChannels:
    """The org's StreamingChannel records (see the module docstring)."""

    def __init__(
        self,
        hub: Hub,
        *,
        clock: Callable[[], float],
        online_users: Callable[[str], set[str]],
    ) -> None:
        self._hub = hub
        self._clock = clock
        self._online = online_users
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = {}

    def create(self, body: object, *, owner_id: str) -> str:
        values = check_body("StreamingChannel", body, _WRITABLE)
        record: dict[str, Any] = {
            "Name": None,
            "Description": None,
            "IsDynamic": False,
            "IsDeleted": False,
            "OwnerId": owner_id,
        }
        record.update(values)
        with self._lock:
            self._validate(record, exclude=None)
            record["Id"] = new_id("0M6")
            self._records[record["Id"]] = record
            self._hub.open(record["Name"])
            return str(record["Id"])

    def update(self, record_id: str, body: object) -> None:
        values = check_body("StreamingChannel", body, _WRITABLE)
        with self._lock:
            current = self._get(record_id)
            record = {**current, **values}
            self._validate(record, exclude=current["Id"])
            self._records[current["Id"]] = record
            if record["Name"] != current["Name"]:
                self._hub.rename(current["Name"], record["Name"])

    def delete(self, record_id: str) -> None:
        with self._lock:
            record = self._get(record_id)
            del self._records[record["Id"]]
            self._hub.close(record["Name"])

    def get(self, record_id: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._get(record_id))

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._records.values()]

    def named(self, channel: str) -> dict[str, Any] | None:
        """The record whose Name is ``channel`` (exact case), if any."""
        with self._lock:
            for record in self._records.values():
                if record["Name"] == channel:
                    return dict(record)
            return None

    def differs_by_case(self, channel: str) -> bool:
        with self._lock:
            return any(
                r["Name"] != channel and r["Name"].lower() == channel.lower()
                for r in self._records.values()
            )

    def _get(self, record_id: str) -> dict[str, Any]:
        key = salesforce_id_18(record_id) if len(record_id) == 15 else record_id
        record = self._records.get(key)
        if record is None:
            raise SObjectError("NOT_FOUND", "The requested resource does not exist", status=404)
        return record

    def _validate(self, record: dict[str, Any], *, exclude: str | None) -> None:
        name = record.get("Name")
        if not name:
            raise SObjectError(
                "REQUIRED_FIELD_MISSING", "Required fields are missing: [Name]", fields=("Name",)
            )
        if len(name) > 80 or not _NAME.match(name):
            raise SObjectError(
                "FIELD_INTEGRITY_EXCEPTION",
                f"Name must start with /u/ and use at most 80 letters, digits, '_' and '/' "
                f"(got {name!r})",
                fields=("Name",),
            )
        for other in self._records.values():
            if other.get("Id") != exclude and other["Name"].lower() == name.lower():
                raise SObjectError(
                    "DUPLICATE_VALUE", f"duplicate value found: Name {name!r}", fields=("Name",)
                )
        description = record.get("Description")
        if description is not None and len(description) > 255:
            raise SObjectError(
                "STRING_TOO_LONG",
                "Description: data value too large (max 255)",
                fields=("Description",),
            )

    # -- push --------------------------------------------------------------------------------

    def push(self, record_id: str, body: object) -> list[dict[str, Any]]:
        """``POST .../push``: one result per push event (see the module docstring)."""
        channel = self.get(record_id)["Name"]
        events = body.get("pushEvents") if isinstance(body, dict) else None
        if not isinstance(events, list) or not events:
            raise SObjectError(
                "JSON_PARSER_ERROR",
                'expected {"pushEvents": [{"payload": "...", "userIds": [...]}, ...]}',
            )
        checked = []
        for i, event in enumerate(events):
            payload = event.get("payload") if isinstance(event, dict) else None
            users = event.get("userIds", []) if isinstance(event, dict) else None
            if not isinstance(payload, str):
                raise SObjectError("JSON_PARSER_ERROR", f"pushEvents[{i}].payload must be a string")
            if len(payload) > _MAX_PAYLOAD:
                raise SObjectError(
                    "STRING_TOO_LONG",
                    f"pushEvents[{i}].payload has {len(payload)} characters; at most "
                    f"{_MAX_PAYLOAD} are allowed",
                )
            if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
                raise SObjectError("JSON_PARSER_ERROR", f"pushEvents[{i}].userIds must be ids")
            checked.append((payload, [salesforce_id_18(u) if len(u) == 15 else u for u in users]))
        results = []
        online = self._online(channel)
        for payload, users in checked:
            created = iso_datetime(self._clock() * 1000)

            def build(replay_id: int, text: str = payload, at: str = created) -> dict[str, Any]:
                return {"payload": text, "event": {"createdDate": at, "replayId": replay_id}}

            self._hub.append(channel, build, users=frozenset(users) if users else None)
            if users:
                status = {u: u in online for u in users}
                results.append({"fanoutCount": sum(status.values()), "userOnlineStatus": status})
            else:
                results.append({"fanoutCount": -1, "userOnlineStatus": {}})
        return results

    def subscribers(self, record_id: str) -> dict[str, Any]:
        """``GET .../push``: the channel and the users subscribed to it now."""
        channel = self.get(record_id)["Name"]
        return {"OnlineUserIds": sorted(self._online(channel)), "ChannelName": channel}
