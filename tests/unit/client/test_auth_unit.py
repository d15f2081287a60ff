"""Secrets, secret references, resolvers, the JWT assertion and the token manager, offline."""

from __future__ import annotations

import base64
import json
import pickle
import threading
import time

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ingest.auth import (
    Credentials,
    DatabricksSecrets,
    EnvRef,
    EnvSecrets,
    JwtBearer,
    ScopeRef,
    Secret,
    StaticSecrets,
    StaticToken,
    TokenManager,
    parse_secret_ref,
)
from ingest.errors import ConfigError
from tests.fake_dbutils import FakeDbutils


def test_secret_hides_itself_everywhere() -> None:
    s = Secret("hunter2-value")
    assert repr(s) == str(s) == f"{s}" == "Secret('****')"
    assert "hunter2" not in repr([s, {"k": s}])
    assert s.reveal() == "hunter2-value"
    assert s == Secret("hunter2-value") and s != Secret("other")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(s)
    with pytest.raises(TypeError, match="needs a str"):
        Secret(b"bytes")  # type: ignore[arg-type]


def test_parse_secret_ref_accepts_the_two_yaml_forms() -> None:
    assert parse_secret_ref({"env": "SF_SECRET"}) == EnvRef("SF_SECRET")
    assert parse_secret_ref({"secret": {"scope": "sf", "key": "pw"}}) == ScopeRef("sf", "pw")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("plain-secret", "plain string"),
        ({"env": ""}, "environment variable name"),
        ({"secret": {"scope": "sf"}}, r"expected keys \['key', 'scope'\]"),
        ({"vault": "x"}, "got key 'vault'"),
        ({"env": "A", "secret": {}}, "expected"),
        (42, "got 'int'"),
    ],
)
def test_parse_secret_ref_rejects_everything_else(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_secret_ref(value, where="conf/pipeline.yml: auth.client_secret")
    assert "conf/pipeline.yml: auth.client_secret" in str(info.value)
    assert "plain-secret" not in str(info.value)


def test_resolvers() -> None:
    env = EnvSecrets({"SF_PW": "pw-1"})
    assert env.resolve(EnvRef("SF_PW")).reveal() == "pw-1"
    with pytest.raises(ConfigError, match="SF_MISSING is not set"):
        env.resolve(EnvRef("SF_MISSING"))
    with pytest.raises(ConfigError, match="DatabricksSecrets"):
        env.resolve(ScopeRef("s", "k"))

    dbutils = FakeDbutils({("s", "k"): "from-scope"})
    dbx = DatabricksSecrets(dbutils)
    assert dbx.resolve(ScopeRef("s", "k")).reveal() == "from-scope"
    assert dbutils.secrets.calls == [("s", "k")]
    with pytest.raises(ConfigError, match="cannot read secret scope 's' key 'broken'"):
        dbx.resolve(ScopeRef("s", "broken"))
    with pytest.raises(ConfigError, match="environ="):
        dbx.resolve(EnvRef("X"))
    assert DatabricksSecrets(dbutils, environ={"X": "y"}).resolve(EnvRef("X")).reveal() == "y"

    static = StaticSecrets({"A": "1", ("s", "k"): "2"})
    assert static.resolve(EnvRef("A")).reveal() == "1"
    assert static.resolve(ScopeRef("s", "k")).reveal() == "2"
    assert "1" not in repr(static)
    with pytest.raises(ConfigError, match="no secret for env B"):
        static.resolve(EnvRef("B"))


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_jwt_assertion_is_rs256_with_the_documented_claims() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    flow = JwtBearer(
        "https://login.salesforce.com",
        client_id="3MVG9-client",
        username="jobs@acme.com",
        private_key=Secret(pem),
        clock=lambda: 1_700_000_000.0,
    )
    header, claims, signature = flow.assertion().split(".")
    assert json.loads(_b64(header)) == {"alg": "RS256", "typ": "JWT"}
    assert json.loads(_b64(claims)) == {
        "iss": "3MVG9-client",
        "sub": "jobs@acme.com",
        "aud": "https://login.salesforce.com",
        "exp": 1_700_000_180,
    }
    key.public_key().verify(
        _b64(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256()
    )
    assert "BEGIN" not in repr(flow)


def test_jwt_rejects_a_key_that_is_not_rsa_pem() -> None:
    with pytest.raises(ConfigError, match="unencrypted PEM RSA private key") as info:
        JwtBearer("https://login.salesforce.com", client_id="c", username="u",
                  private_key=Secret("not-a-key-SECRET"))  # fmt: skip
    assert "SECRET" not in str(info.value)


class CountingProvider:
    name = "counting"

    def __init__(self, clock: FakeClock, lifetime: float | None = None) -> None:
        self.clock = clock
        self.lifetime = lifetime
        self.calls = 0
        self.lock = threading.Lock()

    def fetch(self) -> Credentials:
        with self.lock:
            self.calls += 1
            n = self.calls
        time.sleep(0.01)  # a login takes a moment: concurrent callers must wait, not log in too
        now = self.clock()
        expires = now + self.lifetime if self.lifetime else None
        return Credentials(
            Secret(f"tok-{n}"), "https://acme.my.salesforce.com", "00D", expires, now
        )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_token_manager_refreshes_before_the_assumed_session_lifetime() -> None:
    clock = FakeClock()
    provider = CountingProvider(clock)
    manager = TokenManager(provider, clock=clock, session_lifetime=3600, refresh_margin=300)
    first = manager.current()
    clock.now += 3000
    assert manager.current() is first
    clock.now += 301
    second = manager.current()
    assert second is not first and provider.calls == 2


def test_token_manager_honours_an_explicit_expiry() -> None:
    clock = FakeClock()
    provider = CountingProvider(clock, lifetime=600)
    manager = TokenManager(provider, clock=clock, refresh_margin=120)
    manager.current()
    clock.now += 479
    manager.current()
    assert provider.calls == 1
    clock.now += 2
    manager.current()
    assert provider.calls == 2


def test_invalidate_refreshes_once_for_many_rejections_of_the_same_token() -> None:
    clock = FakeClock()
    provider = CountingProvider(clock)
    manager = TokenManager(provider, clock=clock)
    rejected = manager.current()
    for _ in range(5):
        manager.invalidate(rejected)
        manager.current()
    assert provider.calls == 2


def test_concurrent_callers_share_one_login() -> None:
    clock = FakeClock()
    provider = CountingProvider(clock)
    manager = TokenManager(provider, clock=clock)
    results: list[Credentials] = []
    threads = [threading.Thread(target=lambda: results.append(manager.current())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert provider.calls == 1
    assert all(r is results[0] for r in results)


def test_static_token_validates_its_inputs() -> None:
    with pytest.raises(ConfigError, match="empty"):
        StaticToken(Secret(""), instance_url="https://acme.my.salesforce.com", tenant_id="00D")
    with pytest.raises(ConfigError, match="https"):
        StaticToken(Secret("t"), instance_url="http://acme.my.salesforce.com", tenant_id="00D")
    with pytest.raises(ValueError, match="session_lifetime"):
        TokenManager(StaticToken(Secret("t"), instance_url="https://a.b", tenant_id="00D"),
                     session_lifetime=0)  # fmt: skip
