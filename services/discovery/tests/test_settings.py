"""Discovery's own settings: how lupine servers are reached and probed."""

from __future__ import annotations

import os

import pytest

from rgpu_discovery.settings import KEYS, DiscoverySettings
from rgpu_runtime.errors import SettingsError
from rgpu_runtime.settings import KNOWN_KEYS, Settings


def test_the_lupine_keys_are_read_into_their_fields() -> None:
    env = {
        "RGPU_DEFAULT_PORT": "15000",
        "RGPU_PROBE_INTERVAL_SECONDS": "5",
        "RGPU_PROBE_TIMEOUT_SECONDS": "0.5",
        "RGPU_NAMESPACE": "gpu-system",
    }
    s = DiscoverySettings.from_env(env)
    assert s.lupine.default_port == 15000
    assert s.lupine.probe_interval_seconds == 5.0
    assert s.lupine.probe_timeout_seconds == 0.5
    assert (s.service, s.scheduling.namespace) == ("discovery", "gpu-system")


def test_defaults_match_the_design_when_nothing_is_set() -> None:
    s = DiscoverySettings.from_env({})
    assert s.lupine.default_port == 14833
    assert (s.lupine.probe_interval_seconds, s.lupine.probe_timeout_seconds) == (15.0, 2.0)
    assert str(s.http.listen) == "127.0.0.1:8081"


def test_empty_values_count_as_unset() -> None:
    assert DiscoverySettings.from_env({"RGPU_DEFAULT_PORT": "  "}).lupine.default_port == 14833


def test_default_environ_is_os_environ() -> None:
    os.environ["RGPU_DEFAULT_PORT"] = "15001"
    assert DiscoverySettings.from_env().lupine.default_port == 15001


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("RGPU_DEFAULT_PORT", "abc", "expected a port number 1..65535"),
        ("RGPU_DEFAULT_PORT", "70000", "expected a port number 1..65535"),
        ("RGPU_DEFAULT_PORT", "0", "expected a port number 1..65535"),
        ("RGPU_PROBE_TIMEOUT_SECONDS", "-1", "expected a positive number of seconds"),
        ("RGPU_PROBE_INTERVAL_SECONDS", "inf", "expected a positive number of seconds"),
    ],
)
def test_bad_value_names_key_value_and_expectation(key: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        DiscoverySettings.from_env({key: value})
    message = str(caught.value)
    assert message.startswith(f"{key}={value!r}: ")
    assert expected in message


def test_every_service_sharing_the_configmap_accepts_discoverys_keys() -> None:
    assert set(KEYS) <= set(KNOWN_KEYS)
    for service in ("allocator", "extender", "metrics"):
        assert Settings.from_env(dict.fromkeys(KEYS, "1"), service=service).service == service


def test_a_shared_setting_is_still_checked_for_discovery() -> None:
    with pytest.raises(SettingsError, match="RGPU_LISTEN='nowhere'"):
        DiscoverySettings.from_env({"RGPU_LISTEN": "nowhere"})
