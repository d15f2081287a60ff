"""Secrets and secret references: what a login flow is given instead of plain strings.

Configuration names a secret with a :data:`SecretRef` (``{env: NAME}`` or
``{secret: {scope: ..., key: ...}}``, parsed by :func:`parse_secret_ref`), an injected
:class:`SecretResolver` (:class:`EnvSecrets`, :class:`DatabricksSecrets`,
:class:`StaticSecrets`) turns the reference into a :class:`Secret`, and only
:meth:`Secret.reveal` gives the value back, at the moment it is put on the wire.

:mod:`ingest.auth` re-exports every public name here.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ingest.errors import ConfigError

__all__ = [
    "DatabricksSecrets",
    "Dbutils",
    "DbutilsSecrets",
    "EnvRef",
    "EnvSecrets",
    "ScopeRef",
    "Secret",
    "SecretRef",
    "SecretResolver",
    "StaticSecrets",
    "parse_secret_ref",
]

_MASK = "****"


class Secret:
    """A secret string that never shows itself: ``repr`` and ``str`` print ``Secret('****')``.

    Only :meth:`reveal` returns the value; call it where the value goes on the wire.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret needs a str (got a {type(value).__name__})")
        self._value = value

    def reveal(self) -> str:
        """The secret value itself."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __repr__(self) -> str:
        return f"Secret('{_MASK}')"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a Secret cannot be pickled; resolve it again where it is needed")


# --- secret references and resolvers -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnvRef:
    """``{env: NAME}``: the secret is the value of environment variable ``NAME``."""

    name: str

    def __str__(self) -> str:
        return f"env {self.name}"


@dataclass(frozen=True, slots=True)
class ScopeRef:
    """``{secret: {scope: S, key: K}}``: key ``K`` of Databricks secret scope ``S``."""

    scope: str
    key: str

    def __str__(self) -> str:
        return f"secret scope {self.scope!r} key {self.key!r}"


SecretRef = EnvRef | ScopeRef


def parse_secret_ref(value: object, *, where: str = "secret") -> SecretRef:
    """Turn the YAML form of a secret reference into a :data:`SecretRef`.

    Accepted: ``{env: NAME}`` and ``{secret: {scope: SCOPE, key: KEY}}``. Anything else (in
    particular a plain string, which would put the secret itself in YAML) is a
    :class:`~ingest.errors.ConfigError` naming ``where``.
    """
    expected = "{env: NAME} or {secret: {scope: SCOPE, key: KEY}}"
    if isinstance(value, str):
        raise ConfigError(
            f"{where}: expected a secret reference {expected} (got a plain string; secrets "
            "never go in YAML, name an environment variable or a Databricks secret instead)"
        )
    if not isinstance(value, Mapping) or len(value) != 1:
        got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise ConfigError(f"{where}: expected {expected} (got {got!r})")
    ((kind, body),) = value.items()
    if kind == "env":
        if not isinstance(body, str) or not body:
            raise ConfigError(f"{where}.env: expected an environment variable name (got {body!r})")
        return EnvRef(body)
    if kind == "secret":
        if not isinstance(body, Mapping) or set(body) != {"scope", "key"}:
            got = sorted(body) if isinstance(body, Mapping) else type(body).__name__
            raise ConfigError(f"{where}.secret: expected keys ['key', 'scope'] (got {got!r})")
        scope, key = body["scope"], body["key"]
        if not isinstance(scope, str) or not scope or not isinstance(key, str) or not key:
            raise ConfigError(
                f"{where}.secret: scope and key must be non-empty strings "
                f"(got scope={scope!r}, key={key!r})"
            )
        return ScopeRef(scope, key)
    raise ConfigError(f"{where}: expected {expected} (got key {kind!r})")


@runtime_checkable
class SecretResolver(Protocol):
    """Turns a :data:`SecretRef` into a :class:`Secret`."""

    def resolve(self, ref: SecretRef) -> Secret:
        """The secret ``ref`` names; :class:`~ingest.errors.ConfigError` if there is none."""
        ...


class EnvSecrets:
    """Resolves ``{env: NAME}`` from the process environment (or an injected mapping)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ

    def resolve(self, ref: SecretRef) -> Secret:
        if not isinstance(ref, EnvRef):
            raise ConfigError(
                f"cannot resolve {ref} from environment variables: secret scopes are read with "
                "dbutils (DatabricksSecrets), which Databricks jobs (sfcdc-job) and notebooks "
                "pass in; elsewhere reference an environment variable with {env: NAME}"
            )
        value = self._environ.get(ref.name)
        if not value:
            raise ConfigError(f"environment variable {ref.name} is not set or empty")
        return Secret(value)


class DbutilsSecrets(Protocol):
    """What :class:`DatabricksSecrets` uses of ``dbutils.secrets``."""

    def get(self, scope: str, key: str) -> str:
        """The value of ``key`` in secret scope ``scope``; raises when there is none."""
        ...


class Dbutils(Protocol):
    """Databricks' ``dbutils``, as far as secrets go: a notebook's global, or
    ``pyspark.dbutils.DBUtils(spark)`` in a job."""

    @property
    def secrets(self) -> DbutilsSecrets:
        """The secrets utility."""
        ...


class DatabricksSecrets:
    """Resolves ``{secret: {scope, key}}`` with ``dbutils.secrets.get`` of an injected
    ``dbutils``; ``{env: NAME}`` references use ``environ`` when one is given.

    ``dbutils.secrets`` is looked up at each resolution, so a ``dbutils`` that is only
    obtained when first needed (a Spark session started, say) costs nothing until then.
    """

    def __init__(
        self,
        dbutils: Dbutils,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._dbutils = dbutils
        self._env = EnvSecrets(environ) if environ is not None else None

    def resolve(self, ref: SecretRef) -> Secret:
        if isinstance(ref, EnvRef):
            if self._env is None:
                raise ConfigError(
                    f"cannot resolve {ref}: this resolver reads Databricks secret scopes; "
                    "reference {secret: {scope, key}} or pass environ="
                )
            return self._env.resolve(ref)
        try:
            value = self._dbutils.secrets.get(scope=ref.scope, key=ref.key)
        except ConfigError:
            raise
        except Exception as exc:  # dbutils raises Java-backed (py4j) or SDK exception types
            raise ConfigError(
                f"cannot read {ref} with dbutils.secrets.get ({type(exc).__name__}): check "
                f"that the scope has that key (databricks secrets list-secrets {ref.scope}) and "
                "that the identity the job runs as may read the scope"
            ) from exc
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{ref} is empty")
        return Secret(value)


class StaticSecrets:
    """Secrets from a mapping, for tests: keys are env names or ``(scope, key)`` pairs."""

    def __init__(self, mapping: Mapping[str | tuple[str, str], str]) -> None:
        self._mapping = dict(mapping)

    def resolve(self, ref: SecretRef) -> Secret:
        key: str | tuple[str, str] = ref.name if isinstance(ref, EnvRef) else (ref.scope, ref.key)
        try:
            return Secret(self._mapping[key])
        except KeyError:
            raise ConfigError(f"no secret for {ref}") from None

    def __repr__(self) -> str:
        return f"StaticSecrets({len(self._mapping)} secrets)"
