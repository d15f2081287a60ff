"""Where a lake is: local paths, object storage for the local engine (with credentials from
secret references, never shown), and Spark's own locations (``dbfs:``, ``/Volumes``) kept
as written for the spark engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.auth import EnvRef, StaticSecrets
from ingest.errors import LakeError
from pipelines.engines.lake_location import LakeLocation
from pipelines.engines.spark_access import _absolute
from pipelines.spec import LakeSpec, StorageSpec
from pipelines.spec.fields import has_scheme, resolve_paths


def test_uris_are_kept_and_relative_paths_resolved() -> None:
    base = Path("/srv/sfcdc")
    for uri in ("s3://b/lake", "dbfs:/mnt/lake", "abfss://c@a.dfs.core.windows.net/l"):
        assert resolve_paths(LakeSpec(location=uri), base).location == uri
    assert resolve_paths(LakeSpec(location="/Volumes/main/cdc/lake"), base).location == (
        "/Volumes/main/cdc/lake"
    )
    assert resolve_paths(LakeSpec(location="lake"), base).location == "/srv/sfcdc/lake"
    assert not has_scheme("C:/lake") and has_scheme("dbfs:/x")


def test_the_spark_engine_keeps_spark_locations_as_written() -> None:
    assert _absolute("dbfs:/mnt/lake/") == "dbfs:/mnt/lake"
    assert _absolute("/Volumes/main/cdc/lake") == "/Volumes/main/cdc/lake"
    assert _absolute("s3://bucket/lake") == "s3://bucket/lake"


def test_object_storage_options_come_from_secret_references() -> None:
    storage = StorageSpec(
        endpoint="http://127.0.0.1:9000",
        region="eu-west-1",
        allow_http=True,
        access_key_id=EnvRef("KEY"),
        secret_access_key=EnvRef("SECRET"),
    )
    secrets = StaticSecrets({"KEY": "AKIA-test", "SECRET": "very-secret-value"})
    where = LakeLocation.parse("s3://bucket/lake/", storage, secrets)
    assert where.local is None and where.join("gold", "account") == "s3://bucket/lake/gold/account"
    assert where.options == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIA-test",
        "AWS_SECRET_ACCESS_KEY": "very-secret-value",
        "AWS_ALLOW_HTTP": "true",
        "conditional_put": "etag",
    }
    assert "very-secret-value" not in repr(where)
    azure = LakeLocation.parse(
        "az://lake/x", StorageSpec(account_name="acct", account_key=EnvRef("SECRET")), secrets
    )
    assert azure.options["azure_storage_account_key"] == "very-secret-value"


def test_locations_the_local_engine_cannot_reach_are_refused() -> None:
    with pytest.raises(LakeError, match="dbfs: locations are for the spark engine"):
        LakeLocation.parse("dbfs:/mnt/lake")
    assert LakeLocation.parse("file:///tmp/lake").local == Path("/tmp/lake")
