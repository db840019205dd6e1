"""The extender's own settings: its listeners, TLS and client certificates."""

from __future__ import annotations

import pytest

from rgpu_extender.settings import KEYS, ExtenderSettings
from rgpu_runtime.errors import SettingsError
from rgpu_runtime.settings import KNOWN_KEYS, HostPort, Settings


def test_the_listener_keys_are_read_into_their_fields() -> None:
    env = {
        "RGPU_SCHEDULER_CLIENT_CA_FILE": "/tls/scheduler-ca.crt",
        "RGPU_SCHEDULER_MAX_BODY_BYTES": "67108864",
        "RGPU_WEBHOOK_LISTEN": "[::1]:9443",
        "RGPU_TLS_CERT_FILE": "/tls/tls.crt",
        "RGPU_TLS_KEY_FILE": "/tls/tls.key",
        "RGPU_WEBHOOK_CLIENT_CA_FILE": "/tls/apiserver-ca.crt",
    }
    s = ExtenderSettings.from_env(env)
    assert s.edge.webhook_listen == HostPort(host="::1", port=9443)
    assert str(s.edge.webhook_listen) == "[::1]:9443"
    assert (s.edge.tls_cert_file, s.edge.tls_key_file) == ("/tls/tls.crt", "/tls/tls.key")
    assert s.edge.scheduler_client_ca_file == "/tls/scheduler-ca.crt"
    assert s.edge.scheduler_max_body_bytes == 64 << 20
    assert s.edge.webhook_client_ca_file == "/tls/apiserver-ca.crt"
    assert s.service == "extender"


def test_defaults_match_the_design_when_nothing_is_set() -> None:
    s = ExtenderSettings.from_env({})
    assert str(s.edge.webhook_listen) == "127.0.0.1:8443"
    assert s.edge.tls_cert_file is None
    assert s.edge.scheduler_client_ca_file is None
    assert s.edge.scheduler_max_body_bytes == 4 << 20
    assert s.edge.webhook_client_ca_file is None
    assert str(s.http.listen) == "127.0.0.1:8083"


@pytest.mark.parametrize("value", ["12", "1e9", "-5", "9" * 5000, "4 MiB"])
def test_a_scheduler_body_limit_that_is_not_a_byte_count_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="RGPU_SCHEDULER_MAX_BODY_BYTES"):
        ExtenderSettings.from_env({"RGPU_SCHEDULER_MAX_BODY_BYTES": value})


def test_a_webhook_client_ca_without_a_certificate_is_refused() -> None:
    env = {"RGPU_WEBHOOK_CLIENT_CA_FILE": "/tls/ca.crt"}
    with pytest.raises(SettingsError, match="RGPU_TLS_CERT_FILE"):
        ExtenderSettings.from_env(env)


def test_a_scheduler_client_ca_without_a_certificate_is_refused() -> None:
    env = {"RGPU_SCHEDULER_CLIENT_CA_FILE": "/tls/ca.crt"}
    with pytest.raises(SettingsError, match="RGPU_TLS_CERT_FILE"):
        ExtenderSettings.from_env(env)


def test_tls_cert_without_key_is_refused() -> None:
    with pytest.raises(SettingsError, match="RGPU_TLS_KEY_FILE is not: set both or neither"):
        ExtenderSettings.from_env({"RGPU_TLS_CERT_FILE": "/tls/tls.crt"})


def test_a_client_ca_without_a_serving_certificate_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"RGPU_SCHEDULER_CLIENT_CA_FILE='/ca\.crt' asks"):
        ExtenderSettings.from_env({"RGPU_SCHEDULER_CLIENT_CA_FILE": "/ca.crt"})


def test_tls_key_without_cert_is_refused() -> None:
    with pytest.raises(SettingsError, match="RGPU_TLS_CERT_FILE is not: set both or neither"):
        ExtenderSettings.from_env({"RGPU_TLS_KEY_FILE": "/tls/tls.key"})


def test_a_bad_webhook_listen_names_key_value_and_expectation() -> None:
    with pytest.raises(SettingsError) as caught:
        ExtenderSettings.from_env({"RGPU_WEBHOOK_LISTEN": "127.0.0.1:http"})
    message = str(caught.value)
    assert message.startswith("RGPU_WEBHOOK_LISTEN='127.0.0.1:http': ")
    assert "expected a port number 0..65535" in message


def test_every_service_sharing_the_configmap_accepts_the_extenders_keys() -> None:
    assert set(KEYS) <= set(KNOWN_KEYS)
    for service in ("discovery", "allocator", "metrics"):
        assert Settings.from_env(dict.fromkeys(KEYS, "x"), service=service).service == service


def test_every_scheduling_key_of_the_extender_is_read_into_its_field() -> None:
    env = {
        "RGPU_LIB_IMAGE": "registry.example.com/hami-core:2.4",
        "RGPU_TRUSTED_USERS": "alice, system:serviceaccount:ops:bot",
        "RGPU_EXTENDER_BUDGET_SECONDS": "3",
        "RGPU_SCHEDULER_NAME": "my-scheduler",
    }
    s = ExtenderSettings.from_env(env)
    assert s.scheduling.lib_image == "registry.example.com/hami-core:2.4"
    assert s.scheduling.trusted_users == ("alice", "system:serviceaccount:ops:bot")
    assert s.scheduling.extender_budget_seconds == 3.0
    assert s.scheduling.scheduler_name == "my-scheduler"


def test_scheduling_defaults_match_the_design_when_nothing_is_set() -> None:
    s = ExtenderSettings.from_env({})
    assert s.scheduling.lib_image is None
    assert s.scheduling.trusted_users == ()
    assert s.scheduling.extender_budget_seconds == 4.0


def test_empty_values_count_as_unset() -> None:
    s = ExtenderSettings.from_env({"RGPU_LIB_IMAGE": "", "RGPU_SCHEDULER_NAME": "  "})
    assert s.scheduling.lib_image is None
    assert s.scheduling.scheduler_name == "rgpu-scheduler"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("RGPU_EXTENDER_BUDGET_SECONDS", "0", "expected a positive number of seconds"),
        ("RGPU_LIB_IMAGE", "hami core", "expected a single word without spaces"),
    ],
)
def test_a_bad_scheduling_value_names_key_value_and_expectation(
    key: str, value: str, expected: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        ExtenderSettings.from_env({key: value})
    message = str(caught.value)
    assert message.startswith(f"{key}={value!r}: ")
    assert expected in message
