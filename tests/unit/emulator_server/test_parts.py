"""Pure parts of the emulator server: config validation, faults, managed subscriptions, ids,
TLS material, error helpers and tokens."""

from __future__ import annotations

import datetime as dt
import importlib
from datetime import timedelta

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from ingest.emulator.faults import Faults, FaultSettings, StreamCut
from ingest.emulator.managed import (
    ManagedSubscriptionConfig,
    ManagedSubscriptions,
    salesforce_id_18,
)
from ingest.emulator.oauth import OAuthClient, TokenStore
from ingest.emulator.server import DEFAULT_ORG_ID, Emulator, EmulatorConfig
from ingest.emulator.service import ERROR_CODE_PREFIX, failure
from ingest.emulator.tls import ensure_tls, generate_tls
from ingest.errors import ConfigError
from tests.emulator_helpers import ACCOUNT_TOPIC, FakeClock, catalogue

MODULES = [
    "ingest.emulator.eventlog",
    "ingest.emulator.faults",
    "ingest.emulator.managed",
    "ingest.emulator.oauth",
    "ingest.emulator.rpc_errors",
    "ingest.emulator.server",
    "ingest.emulator.service",
    "ingest.emulator.streams",
    "ingest.emulator.tls",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_curated(name):
    module = importlib.import_module(name)
    assert len(set(module.__all__)) == len(module.__all__)
    for symbol in module.__all__:
        assert hasattr(module, symbol) and not symbol.startswith("_")


def test_salesforce_id_18():
    assert salesforce_id_18("001A0000006Vm9r") == "001A0000006Vm9rIAC"
    assert salesforce_id_18("001A0000006Vm9rIAC") == "001A0000006Vm9rIAC"
    lower = salesforce_id_18("001a0000006vm9r")
    assert lower.lower() != salesforce_id_18("001A0000006Vm9r").lower()
    with pytest.raises(ValueError, match="15 or 18"):
        salesforce_id_18("001")
    assert len(DEFAULT_ORG_ID) == 18 and DEFAULT_ORG_ID.startswith("00D")


def test_emulator_config_reports_every_problem():
    with pytest.raises(ConfigError) as info:
        EmulatorConfig(
            org_id="001xyz",
            grpc_port=70000,
            idle_timeout=0,
            retention=timedelta(0),
            max_pending=0,
            max_event_bytes=10 * 1024 * 1024,
            response_encoding="json",  # type: ignore[arg-type]
        )
    text = str(info.value)
    for key in ("org_id", "grpc_port", "idle_timeout", "retention", "max_pending"):
        assert key in text
    assert "max_event_bytes" in text and "response_encoding" in text
    assert EmulatorConfig(org_id=DEFAULT_ORG_ID[:15]).org_id == DEFAULT_ORG_ID


def test_managed_subscription_config_and_catalogue_check():
    with pytest.raises(ValueError, match="topic must start"):
        ManagedSubscriptionConfig("X", "Account")
    with pytest.raises(ValueError, match="default_replay"):
        ManagedSubscriptionConfig("X", ACCOUNT_TOPIC, default_replay="NEWEST")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="18x"):
        ManagedSubscriptionConfig("X", ACCOUNT_TOPIC, subscription_id="0Ho000000000001")
    derived = ManagedSubscriptionConfig("Account_Sync", ACCOUNT_TOPIC)
    assert derived.subscription_id.startswith("18x") and len(derived.subscription_id) == 18
    assert derived == ManagedSubscriptionConfig("Account_Sync", ACCOUNT_TOPIC)
    with pytest.raises(ConfigError, match="unknown topic"):
        Emulator(
            catalogue(),
            EmulatorConfig(managed_subscriptions=(ManagedSubscriptionConfig("Y", "/data/No"),)),
        )


def test_managed_registry_leases_and_persisted_commits(tmp_path):
    config = ManagedSubscriptionConfig("Account_Sync", ACCOUNT_TOPIC)
    subs = ManagedSubscriptions([config], state_dir=tmp_path)
    sub_id = config.subscription_id
    assert subs.by_name("Account_Sync").config == config
    assert subs.by_id(sub_id[:15]) is not None and subs.by_id(sub_id.lower()) is not None
    assert subs.by_id("18x000000000000") is None
    assert subs.acquire(sub_id) and not subs.acquire(sub_id)
    subs.release(sub_id)
    assert subs.acquire(sub_id)
    subs.commit(sub_id, b"\x00" * 10)
    assert ManagedSubscriptions([config], state_dir=tmp_path).committed(sub_id) == b"\x00" * 10
    subs.set_state("Account_Sync", "STOP")
    assert subs.by_name("Account_Sync").config.state == "STOP"
    with pytest.raises(KeyError):
        subs.set_state("Nope", "RUN")


def test_faults_stream_cut_once_and_repeat():
    faults = Faults()
    assert faults.stream_cut == (0, None)
    faults.cut_streams(2)
    generation, cut = faults.stream_cut
    assert cut == StreamCut(2)
    assert faults.fire_stream_cut(generation) == cut
    assert faults.fire_stream_cut(generation) is None  # one-shot: gone
    faults.cut_streams(3, code="subscription.internal.error", repeat=True)
    generation, _ = faults.stream_cut
    assert faults.fire_stream_cut(generation) is not None
    assert faults.fire_stream_cut(generation) is not None
    faults.clear()
    assert faults.stream_cut[1] is None and faults.latency == 0 and not faults.keepalive_only
    with pytest.raises(ValueError, match="after_events"):
        StreamCut(-1)
    with pytest.raises(ValueError, match="code"):
        StreamCut(1, code="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency"):
        FaultSettings(latency=-0.1)
    with pytest.raises(RuntimeError, match="running emulator"):
        faults.purge(before=0)


def test_failure_helper():
    err = failure("topic.not.found", org="00D", topic="/data/X")
    assert err.status == grpc.StatusCode.NOT_FOUND
    assert err.message.startswith("The topic information for org CORE/prod/00D and topic /data/X")
    assert ERROR_CODE_PREFIX == "sfdc.platform.eventbus.grpc."


def test_tls_material():
    material = generate_tls(("127.0.0.1", "localhost", "emulator.test"))
    ca = x509.load_pem_x509_certificate(material.ca_cert_pem)
    cert = x509.load_pem_x509_certificate(material.server_cert_pem)
    assert cert.issuer == ca.subject
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "emulator.test"}
    assert cert.not_valid_after_utc > dt.datetime.now(dt.timezone.utc)
    assert "server_key_pem" not in repr(material).split("(")[1] or "BEGIN" not in repr(material)


def test_ensure_tls_reuses_files(tmp_path):
    first = ensure_tls(tmp_path)
    assert (tmp_path / "server-key.pem").stat().st_mode & 0o777 == 0o600
    assert ensure_tls(tmp_path) == first


def test_token_store_expiry_and_revocation():
    clock = FakeClock()
    faults = Faults()
    store = TokenStore(org_id=DEFAULT_ORG_ID, clock=clock, ttl=60, faults=faults)
    store.bind(instance_url="http://x", login_url="http://x")
    token = store.issue(client_id="c", user_id="005", username="u", with_refresh_token=True)
    assert token.access_token.startswith(DEFAULT_ORG_ID[:15] + "!")
    assert store.check(token.access_token) is not None
    assert store.refresh_grant(token.refresh_token or "") == ("c", "005", "u")
    clock.advance(60)
    assert store.check(token.access_token) is None
    fresh = store.issue(client_id="c", user_id="005", username="u")
    faults.expire_tokens()
    assert store.check(fresh.access_token) is None
    assert (
        token.access_token not in repr(token) and "refresh" not in repr(token).split("identity")[0]
    )


def test_oauth_client_validation_and_repr():
    client = OAuthClient("id", "secret-value", "user@x", "pw-value")
    assert client.user_id.startswith("005") and len(client.user_id) == 18
    assert "secret-value" not in repr(client) and "pw-value" not in repr(client)
    with pytest.raises(ValueError, match="client_secret"):
        OAuthClient("id", "", "user@x", "pw")
