"""The allocator's own settings: booking TTL, preemption, lost servers, admission pace and
server policies (moved from the runtime's settings tests with their assertions)."""

from __future__ import annotations

import pytest

from rgpu_allocator.settings import KEYS, AllocatorSettings
from rgpu_runtime.errors import SettingsError
from rgpu_runtime.settings import Settings

EVERY_KEY = {
    "RGPU_ADMISSION": "filter",
    "RGPU_ADMISSION_TTL_SECONDS": "90",
    "RGPU_ADMISSION_CONCURRENCY": "16",
    "RGPU_ADMISSION_AHEAD": "512",
    "RGPU_BOOKING_TTL_SECONDS": "12.5",
    "RGPU_PREEMPTION": "Off",
    "RGPU_SERVER_LOST_GRACE_SECONDS": "20",
    "RGPU_ON_SERVER_LOST": "evict",
    "RGPU_SERVER_POLICIES": "On",
    "RGPU_LUPINE_NAMESPACE": "gpu-servers",
    "RGPU_LUPINE_POD_LABELS": "app=lupine, example.com/tier = gpu",
    "RGPU_GRANULARITY": "card",
    "RGPU_NAMESPACE": "gpu-system",
}


def test_every_key_is_read_into_its_field() -> None:
    s = AllocatorSettings.from_env(EVERY_KEY)
    assert s.scheduling.booking_ttl_seconds == 12.5
    assert s.scheduling.preemption is False
    assert s.scheduling.server_lost_grace_seconds == 20.0
    assert s.scheduling.on_server_lost == "evict"
    assert (s.admission.mode, s.admission.ttl_seconds, s.admission.concurrency) == (
        "filter",
        90,
        16,
    )
    assert s.server_policies.enabled is True
    assert s.server_policies.lupine_namespace == "gpu-servers"
    assert s.server_policies.lupine_labels == (("app", "lupine"), ("example.com/tier", "gpu"))
    assert s.admission.ahead == 512


def test_the_shared_scheduling_keys_are_kept_beside_the_allocators_own() -> None:
    s = AllocatorSettings.from_env(EVERY_KEY)
    assert (s.service, s.scheduling.granularity, s.scheduling.namespace) == (
        "allocator",
        "card",
        "gpu-system",
    )


def test_every_own_key_is_exercised_by_the_every_key_test() -> None:
    assert set(KEYS) <= set(EVERY_KEY)


def test_defaults_match_the_design_when_nothing_is_set() -> None:
    s = AllocatorSettings.from_env({})
    assert (s.admission.mode, s.admission.ttl_seconds, s.admission.concurrency) == ("gate", 60, 64)
    assert s.admission.ahead == 256
    assert s.scheduling.booking_ttl_seconds == 30.0
    assert str(s.http.listen) == "127.0.0.1:8082"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("RGPU_BOOKING_TTL_SECONDS", "abc", "expected a positive number of seconds"),
        ("RGPU_ADMISSION_TTL_SECONDS", "0", "expected a positive number of seconds"),
        ("RGPU_ADMISSION_CONCURRENCY", "0", "expected a whole number from 1 to 1024"),
        ("RGPU_ADMISSION_CONCURRENCY", "9" * 400, "expected a whole number from 1 to 1024"),
        ("RGPU_ADMISSION_AHEAD", "0", "expected a whole number from 1 to 10000"),
        ("RGPU_ADMISSION_AHEAD", "ten", "expected a whole number from 1 to 10000"),
    ],
)
def test_bad_value_names_key_value_and_expectation(key: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        AllocatorSettings.from_env({key: value})
    message = str(caught.value)
    assert message.startswith(f"{key}={value!r}: ")
    assert expected in message


def test_booking_ttl_message_reads_exactly_as_documented() -> None:
    with pytest.raises(
        SettingsError, match=r"^RGPU_BOOKING_TTL_SECONDS='abc': expected a positive"
    ):
        AllocatorSettings.from_env({"RGPU_BOOKING_TTL_SECONDS": "abc"})


def test_preemption_is_on_by_default_and_a_bad_value_names_key_and_value() -> None:
    assert AllocatorSettings.from_env({}).scheduling.preemption is True
    with pytest.raises(SettingsError, match=r"RGPU_PREEMPTION.*maybe"):
        AllocatorSettings.from_env({"RGPU_PREEMPTION": "maybe"})


def test_a_lost_server_is_kept_after_a_minute_by_default_and_bad_values_name_the_key() -> None:
    scheduling = AllocatorSettings.from_env({}).scheduling
    assert (scheduling.server_lost_grace_seconds, scheduling.on_server_lost) == (60.0, "keep")
    env = {"RGPU_SERVER_LOST_GRACE_SECONDS": "2.5", "RGPU_ON_SERVER_LOST": "Evict"}
    scheduling = AllocatorSettings.from_env(env).scheduling
    assert (scheduling.server_lost_grace_seconds, scheduling.on_server_lost) == (2.5, "evict")
    with pytest.raises(SettingsError, match=r"RGPU_ON_SERVER_LOST.*delete"):
        AllocatorSettings.from_env({"RGPU_ON_SERVER_LOST": "delete"})
    with pytest.raises(SettingsError, match=r"RGPU_SERVER_LOST_GRACE_SECONDS.*-1"):
        AllocatorSettings.from_env({"RGPU_SERVER_LOST_GRACE_SECONDS": "-1"})


def test_server_policies_are_off_by_default_and_name_the_lupine_daemonset() -> None:
    s = AllocatorSettings.from_env({}).server_policies
    assert s.enabled is False
    assert s.lupine_namespace == "rgpu-lupine"
    assert s.lupine_labels == (("app.kubernetes.io/name", "lupine-server"),)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("RGPU_SERVER_POLICIES", "yes"),
        ("RGPU_LUPINE_NAMESPACE", "Not_A_Namespace"),
        ("RGPU_LUPINE_POD_LABELS", "app"),
        ("RGPU_LUPINE_POD_LABELS", "app=lupine server"),
        ("RGPU_LUPINE_POD_LABELS", "bad key=x"),
        ("RGPU_LUPINE_POD_LABELS", ","),
    ],
)
def test_a_bad_server_policies_setting_stops_the_service_naming_it(key: str, value: str) -> None:
    with pytest.raises(SettingsError, match=key):
        AllocatorSettings.from_env({key: value})


def test_a_shared_setting_is_still_checked_for_the_allocator() -> None:
    with pytest.raises(SettingsError, match="RGPU_ADMISSION='scheduler'"):
        AllocatorSettings.from_env({"RGPU_ADMISSION": "scheduler"})


def test_every_service_sharing_the_configmap_accepts_the_allocators_keys() -> None:
    for service in ("discovery", "extender", "metrics"):
        assert Settings.from_env(dict.fromkeys(KEYS, "x"), service=service).service == service


def test_an_unknown_key_beside_the_allocators_own_is_still_refused() -> None:
    with pytest.raises(SettingsError, match="did you mean RGPU_PREEMPTION"):
        AllocatorSettings.from_env({"RGPU_PREEMPTON": "off"})
