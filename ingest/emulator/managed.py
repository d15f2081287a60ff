"""Managed subscriptions: server-side subscription configs, committed replay ids and leases.

On Salesforce a managed subscription is a ``ManagedEventSubscription`` metadata record (key
prefix ``18x``) naming a topic, a default replay preset for the first start, an error-recovery
preset for when the committed replay id is no longer valid, and a RUN/STOP state. The server
stores the last committed replay id and lets one client at a time stream from it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

__all__ = [
    "ManagedSubscription",
    "ManagedSubscriptionConfig",
    "ManagedSubscriptions",
    "ReplayPresetName",
    "SubscriptionState",
    "salesforce_id_18",
]

ReplayPresetName = Literal["LATEST", "EARLIEST"]
SubscriptionState = Literal["RUN", "STOP"]
_STATE_FILE = "managed.json"
_SUFFIX_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def salesforce_id_18(id15: str) -> str:
    """The case-insensitive 18-character form of a 15-character Salesforce id.

    Each 5-character chunk contributes one suffix character encoding which of its characters
    are upper-case letters.
    """
    if len(id15) == 18:
        return id15
    if len(id15) != 15 or not id15.isalnum():
        raise ValueError(f"a Salesforce id has 15 or 18 letters and digits (got {id15!r})")
    suffix = ""
    for chunk in range(3):
        bits = 0
        for i, ch in enumerate(id15[chunk * 5 : chunk * 5 + 5]):
            if "A" <= ch <= "Z":
                bits |= 1 << i
        suffix += _SUFFIX_ALPHABET[bits]
    return id15 + suffix


def _derived_id(developer_name: str) -> str:
    digest = hashlib.sha256(developer_name.encode("utf-8")).digest()
    body = "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])
    return salesforce_id_18("18x" + "000" + body)


@dataclass(frozen=True)
class ManagedSubscriptionConfig:
    """One ``ManagedEventSubscription``. ``subscription_id`` is derived from the developer
    name when left blank (a stable ``18x`` id)."""

    developer_name: str
    topic: str
    default_replay: ReplayPresetName = "LATEST"
    error_recovery_replay: ReplayPresetName = "LATEST"
    state: SubscriptionState = "RUN"
    subscription_id: str = ""

    def __post_init__(self) -> None:
        problems = []
        if not self.developer_name or not self.developer_name.replace("_", "").isalnum():
            problems.append(
                f"developer_name must be letters, digits and underscores "
                f"(got {self.developer_name!r})"
            )
        if not self.topic.startswith(("/data/", "/event/")):
            problems.append(f"topic must start with /data/ or /event/ (got {self.topic!r})")
        for name in ("default_replay", "error_recovery_replay"):
            value = getattr(self, name)
            if value not in ("LATEST", "EARLIEST"):
                problems.append(f"{name} must be 'LATEST' or 'EARLIEST' (got {value!r})")
        if self.state not in ("RUN", "STOP"):
            problems.append(f"state must be 'RUN' or 'STOP' (got {self.state!r})")
        if self.subscription_id:
            if len(self.subscription_id) not in (15, 18) or not self.subscription_id.startswith(
                "18x"
            ):
                problems.append(
                    f"subscription_id must be a 15- or 18-character id with key prefix 18x "
                    f"(got {self.subscription_id!r})"
                )
            else:
                object.__setattr__(self, "subscription_id", salesforce_id_18(self.subscription_id))
        elif not problems:
            object.__setattr__(self, "subscription_id", _derived_id(self.developer_name))
        if problems:
            raise ValueError("invalid ManagedSubscriptionConfig: " + "; ".join(problems))


@dataclass(frozen=True)
class ManagedSubscription:
    """A subscription's config plus its last committed replay id (``None`` before any)."""

    config: ManagedSubscriptionConfig
    committed: bytes | None = None


class ManagedSubscriptions:
    """The org's managed subscriptions. Thread-safe; commits persist in ``state_dir``."""

    def __init__(
        self,
        configs: Iterable[ManagedSubscriptionConfig] = (),
        *,
        state_dir: Path | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, ManagedSubscription] = {}
        self._active: set[str] = set()
        self._state_dir = state_dir
        for config in configs:
            self.add(config)
        if state_dir is not None:
            self._load(state_dir / _STATE_FILE)

    def add(self, config: ManagedSubscriptionConfig) -> None:
        """Create (or replace the config of) a managed subscription."""
        with self._lock:
            for sub in self._subs.values():
                same_name = sub.config.developer_name == config.developer_name
                same_id = sub.config.subscription_id == config.subscription_id
                if same_name != same_id:
                    raise ValueError(
                        f"managed subscription {config.developer_name} "
                        f"({config.subscription_id}) clashes with "
                        f"{sub.config.developer_name} ({sub.config.subscription_id})"
                    )
            old = self._subs.get(config.subscription_id)
            self._subs[config.subscription_id] = ManagedSubscription(
                config, old.committed if old else None
            )

    def __iter__(self) -> Iterator[ManagedSubscription]:
        with self._lock:
            return iter(list(self._subs.values()))

    def by_id(self, subscription_id: str) -> ManagedSubscription | None:
        """Look up by 15- or 18-character id (the 15-character form is case-sensitive)."""
        try:
            key = salesforce_id_18(subscription_id)
        except ValueError:
            return None
        with self._lock:
            sub = self._subs.get(key)
            if sub is None and len(subscription_id) == 18:
                for candidate in self._subs.values():
                    if candidate.config.subscription_id.lower() == subscription_id.lower():
                        return candidate
            return sub

    def by_name(self, developer_name: str) -> ManagedSubscription | None:
        with self._lock:
            for sub in self._subs.values():
                if sub.config.developer_name == developer_name:
                    return sub
            return None

    def set_state(self, developer_name: str, state: SubscriptionState) -> None:
        """Stop or resume a subscription (``RUN`` / ``STOP``), as an admin would."""
        sub = self.by_name(developer_name)
        if sub is None:
            raise KeyError(f"no managed subscription named {developer_name!r}")
        self.add(replace(sub.config, state=state))

    # -- leases ------------------------------------------------------------------------------

    def acquire(self, subscription_id: str) -> bool:
        """Take the one client slot of a subscription; ``False`` when a client holds it."""
        with self._lock:
            if subscription_id in self._active:
                return False
            self._active.add(subscription_id)
            return True

    def release(self, subscription_id: str) -> None:
        with self._lock:
            self._active.discard(subscription_id)

    def is_active(self, subscription_id: str) -> bool:
        with self._lock:
            return subscription_id in self._active

    # -- commits -----------------------------------------------------------------------------

    def commit(self, subscription_id: str, replay_id: bytes) -> None:
        """Store ``replay_id`` as the subscription's committed position."""
        with self._lock:
            sub = self._subs[subscription_id]
            self._subs[subscription_id] = replace(sub, committed=replay_id)
            self._save()

    def committed(self, subscription_id: str) -> bytes | None:
        with self._lock:
            sub = self._subs.get(subscription_id)
            return sub.committed if sub else None

    def _load(self, path: Path) -> None:
        if not path.exists():
            return
        saved = json.loads(path.read_text())
        with self._lock:
            for sub_id, hex_id in saved.get("committed", {}).items():
                sub = self._subs.get(sub_id)
                if sub is not None:
                    self._subs[sub_id] = replace(sub, committed=bytes.fromhex(hex_id))

    def _save(self) -> None:
        if self._state_dir is None:
            return
        self._state_dir.mkdir(parents=True, exist_ok=True)
        path = self._state_dir / _STATE_FILE
        tmp = path.with_suffix(".tmp")
        committed = {k: s.committed.hex() for k, s in self._subs.items() if s.committed}
        tmp.write_text(json.dumps({"committed": committed}, indent=1, sort_keys=True))
        tmp.replace(path)
