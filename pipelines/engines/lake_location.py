"""Where the local engine's lake is: a directory of this machine, or a folder of an object
store that delta-rs reaches with storage options.

A ``lake.location`` with a scheme (``s3://``, ``s3a://``, ``az://``, ``abfs[s]://``,
``gs://``) is object storage: every table there is read and written through delta-rs, which
is given the options :func:`storage_options` makes of ``lake.storage`` (its credentials are
secret references, resolved here and never logged). On S3, delta-rs is always asked for
conditional puts (``If-None-Match``), so two writers of one version cannot both succeed;
sfcdc never lets it fall back to an unsafe rename. Anything else is a local path (``file:``
URIs included).
"""

from __future__ import annotations

import hashlib
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from ingest.auth import SecretRef, SecretResolver
from ingest.errors import LakeError
from pipelines.spec.fields import has_scheme
from pipelines.spec.models import StorageSpec

__all__ = ["OBJECT_STORE_SCHEMES", "LakeLocation", "storage_options"]

OBJECT_STORE_SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "adl": "azure",
    "gs": "gcs",
}


def _secret(ref: SecretRef | None, secrets: SecretResolver | None, key: str) -> str | None:
    if ref is None:
        return None
    if secrets is None:
        raise LakeError(f"lake.storage.{key} is a secret reference ({ref}); no resolver given")
    return secrets.resolve(ref).reveal()


def storage_options(
    provider: str, storage: StorageSpec, secrets: SecretResolver | None
) -> dict[str, str]:
    """The delta-rs storage options of ``storage`` for ``provider`` (``s3``, ``azure``,
    ``gcs``), secrets resolved."""
    options: dict[str, str | None] = {}
    if provider == "s3":
        options = {
            "AWS_ENDPOINT_URL": storage.endpoint,
            "AWS_REGION": storage.region,
            "AWS_ACCESS_KEY_ID": _secret(storage.access_key_id, secrets, "access_key_id"),
            "AWS_SECRET_ACCESS_KEY": _secret(
                storage.secret_access_key, secrets, "secret_access_key"
            ),
            "AWS_SESSION_TOKEN": _secret(storage.session_token, secrets, "session_token"),
            "AWS_ALLOW_HTTP": "true" if storage.allow_http else None,
            # Put-if-absent commits (S3 and compatible servers honour If-None-Match): never
            # the unsafe rename delta-rs would otherwise need a lock provider to avoid.
            "conditional_put": "etag",
        }
    elif provider == "azure":
        options = {
            "azure_storage_account_name": storage.account_name,
            "azure_storage_account_key": _secret(storage.account_key, secrets, "account_key"),
            "azure_storage_sas_key": _secret(storage.sas_token, secrets, "sas_token"),
            "azure_storage_endpoint": storage.endpoint,
            "azure_allow_http": "true" if storage.allow_http else None,
        }
    elif provider == "gcs":
        options = {
            "google_service_account_key": _secret(
                storage.service_account_key, secrets, "service_account_key"
            ),
            "google_base_url": storage.endpoint,
        }
    return {k: v for k, v in options.items() if v is not None}


@dataclass(frozen=True)
class LakeLocation:
    """A lake's root: ``local`` (a directory) or an object-store ``uri`` with its options."""

    uri: str
    local: Path | None
    options: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(
        cls,
        location: str | Path,
        storage: StorageSpec | None = None,
        secrets: SecretResolver | None = None,
    ) -> LakeLocation:
        text = str(location)
        if not has_scheme(text) or text.startswith("file:"):
            if text.startswith("file:"):
                text = urllib.parse.unquote(urllib.parse.urlparse(text).path)
            path = Path(text).expanduser().absolute()
            return cls(str(path), path)
        scheme = text.split(":", 1)[0].lower()
        provider = OBJECT_STORE_SCHEMES.get(scheme)
        if provider is None or "://" not in text:
            raise LakeError(
                f"lake.location {text!r}: the local engine reads and writes a local directory "
                f"or object storage ({', '.join(f'{s}://' for s in OBJECT_STORE_SCHEMES)}); "
                f"{scheme}: locations are for the spark engine"
            )
        options = storage_options(provider, storage or StorageSpec(), secrets)
        return cls(text.rstrip("/"), None, options)

    def join(self, *parts: str) -> str:
        """The URI (or path) of ``parts`` under the root."""
        if self.local is not None:
            return str(self.local.joinpath(*parts))
        return "/".join([self.uri, *parts])

    def filesystem(self) -> pafs.FileSystem:
        """A file system over the root (paths relative to it), for listing tables."""
        if self.local is not None:
            return pafs.SubTreeFileSystem(str(self.local), pafs.LocalFileSystem())
        from deltalake.fs import DeltaStorageHandler

        return pafs.PyFileSystem(DeltaStorageHandler(self.uri, dict(self.options)))

    def lock_dir(self) -> Path:
        """Where the rewrite locks of this lake's tables live: in the lake itself on a local
        disk; for object storage in this machine's temporary folder (they hold between the
        processes of one machine)."""
        if self.local is not None:
            return self.local
        digest = hashlib.sha256(self.uri.encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / "sfcdc-lakes" / digest
