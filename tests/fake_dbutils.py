"""A stand-in for Databricks' ``dbutils`` that speaks its secrets interface.

``dbutils.secrets.get(scope, key)`` (also called with ``scope=``/``key=``) returns the secret as
a ``str``. For a scope or key that does not exist the real one raises the Java
``IllegalArgumentException`` that reaches Python through py4j, whose message names the scope and
the key: ``Secret does not exist with scope: <scope> and key: <key>``. sfcdc cannot name that
exception type (py4j's, or the SDK's off the cluster), so it turns any exception of the getter
into a ``ConfigError``; the stand-in raises a type of its own with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping


class SecretDoesNotExist(Exception):
    """What the stand-in raises where the real ``dbutils`` raises IllegalArgumentException."""


class FakeSecrets:
    def __init__(self, values: Mapping[tuple[str, str], str]) -> None:
        self._values = dict(values)
        self.calls: list[tuple[str, str]] = []

    def get(self, scope: str, key: str) -> str:
        self.calls.append((scope, key))
        try:
            return self._values[(scope, key)]
        except KeyError:
            raise SecretDoesNotExist(
                f"Secret does not exist with scope: {scope} and key: {key}"
            ) from None


class FakeDbutils:
    """``dbutils`` with the secrets ``values`` (keyed by ``(scope, key)``)."""

    def __init__(self, values: Mapping[tuple[str, str], str] | None = None) -> None:
        self.secrets = FakeSecrets(values or {})
