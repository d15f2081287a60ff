"""Building the client from the spec without a network: resolvers, login flows per auth type,
org ids, and the channel a Salesforce source opens (gRPC channels connect lazily)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ingest.auth import (
    ClientCredentials,
    DatabricksSecrets,
    EnvRef,
    EnvSecrets,
    JwtBearer,
    RefreshToken,
    ScopeRef,
    SoapLogin,
    StaticSecrets,
    StaticToken,
    UsernamePassword,
)
from ingest.emulator.tls import CA_CERT, ensure_tls
from ingest.errors import ConfigError
from pipelines.connect import connect, secret_resolver, token_provider
from pipelines.spec import (
    ClientCredentialsAuth,
    ConnectionSpec,
    JwtBearerAuth,
    RefreshTokenAuth,
    SalesforceSpec,
    SalesforceTls,
    SoapLoginAuth,
    StaticTokenAuth,
    UsernamePasswordAuth,
)
from tests.fake_dbutils import FakeDbutils, SecretDoesNotExist

DOMAIN = "https://acme.my.salesforce.com"


def _pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


SECRETS = StaticSecrets(
    {
        "CLIENT_ID": "3MVG9-id",
        "SECRET": "client-s3cret",
        "PASSWORD": "pa55word",
        "TOKEN": "00DEm0000SfCdcE!AQ-opaque-token",
        "REFRESH": "refresh-s3cret",
        ("sfcdc", "jwt-key"): _pem(),
    }
)


def test_secret_resolver_reads_the_environment_or_databricks_scopes() -> None:
    env = secret_resolver(environ={"X": "from-env"})
    assert isinstance(env, EnvSecrets)
    assert env.resolve(EnvRef("X")).reveal() == "from-env"
    with pytest.raises(ConfigError, match="secret scopes are read with dbutils"):
        env.resolve(ScopeRef("s", "k"))
    dbutils = FakeDbutils({("sfcdc", "key"): "from-scope"})
    scopes = secret_resolver(environ={"X": "x"}, dbutils=dbutils)
    assert isinstance(scopes, DatabricksSecrets)
    assert scopes.resolve(ScopeRef("sfcdc", "key")).reveal() == "from-scope"
    assert scopes.resolve(EnvRef("X")).reveal() == "x"
    assert dbutils.secrets.calls == [("sfcdc", "key")]


@pytest.mark.parametrize(
    "ref", [ScopeRef("sfcdc", "client-secret"), ScopeRef("nowhere", "client-id")]
)
def test_a_missing_scope_or_key_names_both_and_the_fix(ref: ScopeRef) -> None:
    resolver = secret_resolver(dbutils=FakeDbutils({("sfcdc", "client-id"): "s3cr3t-value"}))
    with pytest.raises(ConfigError) as info:
        resolver.resolve(ref)
    message = str(info.value)
    assert f"cannot read secret scope '{ref.scope}' key '{ref.key}'" in message
    assert f"databricks secrets list-secrets {ref.scope}" in message
    assert "SecretDoesNotExist" in message
    assert "s3cr3t-value" not in message
    assert isinstance(info.value.__cause__, SecretDoesNotExist)


def test_a_secret_read_with_dbutils_never_shows_itself(caplog: pytest.LogCaptureFixture) -> None:
    value = "client-s3cret-from-the-scope"
    caplog.set_level(logging.DEBUG)
    dbutils = FakeDbutils({("sfcdc", "client-secret"): value})
    secrets = secret_resolver(environ={"CLIENT_ID": "3MVG9-id"}, dbutils=dbutils)
    auth = ClientCredentialsAuth(
        login_url=DOMAIN,
        client_id=EnvRef("CLIENT_ID"),
        client_secret=ScopeRef("sfcdc", "client-secret"),
    )
    provider = token_provider(auth, secrets=secrets)
    secret = secrets.resolve(ScopeRef("sfcdc", "client-secret"))
    assert secret.reveal() == value
    shown = " ".join([repr(provider), str(provider), repr(secret), str(secret), caplog.text])
    assert value not in shown


def test_an_empty_secret_is_an_error() -> None:
    resolver = secret_resolver(dbutils=FakeDbutils({("sfcdc", "empty"): ""}))
    with pytest.raises(ConfigError, match="secret scope 'sfcdc' key 'empty' is empty"):
        resolver.resolve(ScopeRef("sfcdc", "empty"))


@pytest.mark.parametrize(
    ("auth", "kind"),
    [
        (
            ClientCredentialsAuth(
                login_url=DOMAIN, client_id=EnvRef("CLIENT_ID"), client_secret=EnvRef("SECRET")
            ),
            ClientCredentials,
        ),
        (
            JwtBearerAuth(
                login_url="https://login.salesforce.com",
                client_id="3MVG9-id",
                username="etl@acme.com",
                private_key=ScopeRef("sfcdc", "jwt-key"),
            ),
            JwtBearer,
        ),
        (
            UsernamePasswordAuth(
                login_url="https://login.salesforce.com",
                client_id="3MVG9-id",
                client_secret=EnvRef("SECRET"),
                username="etl@acme.com",
                password=EnvRef("PASSWORD"),
            ),
            UsernamePassword,
        ),
        (
            RefreshTokenAuth(
                login_url="https://login.salesforce.com",
                client_id="3MVG9-id",
                refresh_token=EnvRef("REFRESH"),
            ),
            RefreshToken,
        ),
        (
            SoapLoginAuth(
                login_url="https://login.salesforce.com",
                username="etl@acme.com",
                password=EnvRef("PASSWORD"),
            ),
            SoapLogin,
        ),
        (StaticTokenAuth(access_token=EnvRef("TOKEN"), instance_url=DOMAIN), StaticToken),
    ],
)
def test_each_auth_type_gets_its_login_flow_without_leaking_secrets(auth, kind) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SOAP login warns that it is being retired
        provider = token_provider(auth, secrets=SECRETS)
    assert isinstance(provider, kind)
    for secret in ("client-s3cret", "pa55word", "refresh-s3cret", "opaque-token", "PRIVATE KEY"):
        assert secret not in repr(provider)


def test_identifiers_may_come_from_secret_stores_too() -> None:
    provider = token_provider(
        ClientCredentialsAuth(
            login_url=DOMAIN, client_id=EnvRef("CLIENT_ID"), client_secret=EnvRef("SECRET")
        ),
        secrets=SECRETS,
    )
    assert "3MVG9-id" in repr(provider)


def test_a_static_token_takes_its_org_id_from_the_token_or_the_spec() -> None:
    auth = StaticTokenAuth(access_token=EnvRef("TOKEN"), instance_url=DOMAIN)
    assert token_provider(auth, secrets=SECRETS).fetch().tenant_id == "00DEm0000SfCdcE"
    override = token_provider(auth, secrets=SECRETS, tenant_id="00DEm0000SfCdcEMQS")
    assert override.fetch().tenant_id == "00DEm0000SfCdcEMQS"
    opaque = StaticSecrets({"TOKEN": "no-org-prefix"})
    with pytest.raises(ConfigError, match="tenant_id is required"):
        token_provider(auth, secrets=opaque)


def test_a_configured_tenant_id_overrides_the_login_response() -> None:
    auth = ClientCredentialsAuth(login_url=DOMAIN, client_id="id", client_secret=EnvRef("SECRET"))
    provider = token_provider(auth, secrets=SECRETS, tenant_id="00DEm0000SfCdcE")
    assert provider.name == "client_credentials"
    assert "tenant 00DEm0000SfCdcE" in repr(provider)


def test_a_missing_secret_is_a_config_error_naming_it() -> None:
    auth = ClientCredentialsAuth(login_url=DOMAIN, client_id="id", client_secret=EnvRef("NOPE"))
    with pytest.raises(ConfigError, match="environment variable NOPE is not set"):
        token_provider(auth, secrets=EnvSecrets({}))


def test_salesforce_source_opens_a_verified_channel(tmp_path: Path) -> None:
    ensure_tls(tmp_path)  # a CA, as a TLS-inspecting proxy would have
    ca = tmp_path / CA_CERT
    spec = ConnectionSpec(
        source="salesforce",
        salesforce=SalesforceSpec(
            pubsub_endpoint="api.pubsub.salesforce.com:7443",
            auth=ClientCredentialsAuth(
                login_url=DOMAIN, client_id="id", client_secret=EnvRef("SECRET")
            ),
            tls=SalesforceTls(ca_file=str(ca)),
        ),
    )
    with connect(spec, secrets=SECRETS) as source:
        assert source.endpoint == "api.pubsub.salesforce.com:7443"
        assert source.emulator is None
        assert "salesforce" in repr(source)
        assert source.tokens.provider.name == "client_credentials"
    missing = ConnectionSpec(source="salesforce")
    with pytest.raises(ConfigError, match=r"connection\.salesforce is required"):
        connect(missing, secrets=SECRETS)
