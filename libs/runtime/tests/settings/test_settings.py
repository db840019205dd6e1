from __future__ import annotations

import dataclasses
import os

import pytest

from rgpu_runtime.errors import SettingsError
from rgpu_runtime.settings import KNOWN_KEYS, OWN_KEYS, SHARED_KEYS, ListenerLimits, Settings
from rgpu_runtime.settings._parse import HostPort

EVERY_KEY = {
    "RGPU_ADMISSION": "filter",
    "RGPU_ADMISSION_TTL_SECONDS": "90",
    "RGPU_ADMISSION_CONCURRENCY": "16",
    "RGPU_ADMISSION_AHEAD": "512",
    "RGPU_RESOURCE_COUNT": "example.com/gpu",
    "RGPU_RESOURCE_MEMORY": "example.com/gpu-mem",
    "RGPU_DEFAULT_PORT": "15000",
    "RGPU_GRANULARITY": "card",
    "RGPU_SCHEDULER_CLIENT_CA_FILE": "/tls/scheduler-ca.crt",
    "RGPU_SCHEDULER_MAX_BODY_BYTES": "67108864",
    "RGPU_SCHEDULER_NAME": "my-scheduler",
    "RGPU_NAMESPACE": "gpu-system",
    "RGPU_BOOKING_TTL_SECONDS": "12.5",
    "RGPU_PROBE_INTERVAL_SECONDS": "5",
    "RGPU_PROBE_TIMEOUT_SECONDS": "0.5",
    "RGPU_TOPOLOGY_KEYS": " example.com/rack , topology.kubernetes.io/zone ",
    "RGPU_LIB_IMAGE": "registry.example.com/hami-core:2.4",
    "RGPU_DISCOVERY_URL": "http://discovery.rgpu-system:8081/",
    "RGPU_ALLOCATOR_URL": "https://allocator.rgpu-system:8082",
    "RGPU_KUBE_URL": "http://127.0.0.1:6443",
    "RGPU_LISTEN": "0.0.0.0:9000",
    "RGPU_WEBHOOK_LISTEN": "[::1]:9443",
    "RGPU_TLS_CERT_FILE": "/tls/tls.crt",
    "RGPU_TLS_KEY_FILE": "/tls/tls.key",
    "RGPU_TRUSTED_USERS": "alice, system:serviceaccount:ops:bot",
    "RGPU_EXTENDER_BUDGET_SECONDS": "3",
    "RGPU_PREEMPTION": "Off",
    "RGPU_SERVER_LOST_GRACE_SECONDS": "20",
    "RGPU_ON_SERVER_LOST": "evict",
    "RGPU_SERVER_POLICIES": "On",
    "RGPU_LUPINE_NAMESPACE": "gpu-servers",
    "RGPU_LUPINE_POD_LABELS": "app=lupine, example.com/tier = gpu",
    "RGPU_LOG_LEVEL": "debug",
    "RGPU_LOG_FORMAT": "text",
    "RGPU_AUTH": "None",
    "RGPU_ALLOCATION_CALLERS": "system:serviceaccount:rgpu-system:rgpu-extender, ops",
    "RGPU_PROBE_CALLERS": "system:serviceaccount:rgpu-system:rgpu-allocator",
    "RGPU_AUTH_CACHE_SECONDS": "30",
    "RGPU_TOKEN_DIR": "/tokens",
    "RGPU_TOKEN_ACCOUNT": "rgpu-extender",
    "RGPU_MAX_BODY_BYTES": "8388608",
    "RGPU_HTTP_MAX_HEADER_BYTES": "32768",
    "RGPU_HTTP_HEADER_SECONDS": "5",
    "RGPU_HTTP_IDLE_SECONDS": "95.5",
    "RGPU_HTTP_MAX_CONNECTIONS": "2048",
    "RGPU_HTTP_MAX_CLIENT_CONNECTIONS": "64",
    "RGPU_WEBHOOK_CLIENT_CA_FILE": "/tls/apiserver-ca.crt",
    "RGPU_TRACE_BACKGROUND_RATIO": "0.05",
    "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
    "OTEL_TRACES_SAMPLER_ARG": "0.25",
    "POD_NAMESPACE": "rgpu-system",
    "KUBECONFIG": "/home/op/.kube/config",
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
}


def test_every_key_is_read_into_its_field() -> None:
    s = Settings.from_env(EVERY_KEY, service="extender")
    assert s.resources.count == "example.com/gpu"
    assert s.resources.memory == "example.com/gpu-mem"
    assert s.scheduling.granularity == "card"
    assert s.scheduling.scheduler_name == "my-scheduler"
    assert s.scheduling.namespace == "gpu-system"
    assert s.scheduling.topology_keys == ("example.com/rack", "topology.kubernetes.io/zone")
    assert s.peers.discovery_url == "http://discovery.rgpu-system:8081"
    assert s.peers.allocator_url == "https://allocator.rgpu-system:8082"
    assert s.kube.url == "http://127.0.0.1:6443"
    assert s.kube.kubeconfig == "/home/op/.kube/config"
    assert (s.kube.service_host, s.kube.service_port) == ("10.0.0.1", "443")
    assert s.kube.pod_namespace == "rgpu-system"
    assert s.http.listen == HostPort(host="0.0.0.0", port=9000)
    assert (s.log.level, s.log.format) == ("DEBUG", "text")
    assert s.admission.mode == "filter"
    assert s.auth.mode == "none"
    assert s.auth.allocation_callers == ("system:serviceaccount:rgpu-system:rgpu-extender", "ops")
    assert s.auth.probe_callers == ("system:serviceaccount:rgpu-system:rgpu-allocator",)
    assert s.auth.cache_seconds == 30.0
    assert (s.auth.token_dir, s.auth.token_account) == ("/tokens", "rgpu-extender")
    assert s.http.max_body_bytes == 8 << 20
    assert s.http.limits == ListenerLimits(
        max_header_bytes=32768,
        header_seconds=5.0,
        idle_seconds=95.5,
        max_connections=2048,
        max_client_connections=64,
    )
    assert s.traces.sampler == "parentbased_traceidratio"
    assert (s.traces.ratio, s.traces.background_ratio) == (0.25, 0.05)


def test_a_key_only_another_service_reads_is_accepted_and_left_to_it() -> None:
    s = Settings.from_env({"RGPU_DEFAULT_PORT": "not-a-port"}, service="metrics")
    assert s.service == "metrics"


def test_every_known_key_is_exercised_by_the_every_key_test() -> None:
    assert {k for k in EVERY_KEY if k.startswith("RGPU_")} == set(KNOWN_KEYS)


def test_the_known_keys_are_the_shared_ones_and_every_services_own() -> None:
    own = {key for keys in OWN_KEYS.values() for key in keys}
    assert set(KNOWN_KEYS) == set(SHARED_KEYS) | own
    assert not set(SHARED_KEYS) & own
    assert set(OWN_KEYS) == {"discovery", "allocator", "extender"}


def test_a_key_only_the_allocator_reads_is_left_to_it_by_the_shared_settings() -> None:
    s = Settings.from_env(
        {"RGPU_ADMISSION_AHEAD": "none", "RGPU_PREEMPTION": "?"}, service="metrics"
    )
    assert not hasattr(s.scheduling, "preemption")
    assert not hasattr(s.admission, "ahead")


def test_defaults_match_the_design_when_nothing_is_set() -> None:
    s = Settings.from_env({}, service="allocator")
    assert s.admission.mode == "gate"
    assert s.resources.count == "nvidia.com/remote-gpu"
    assert s.resources.memory == "nvidia.com/remote-gpu-memory"
    assert s.scheduling.granularity == "server"
    assert s.scheduling.scheduler_name == "rgpu-scheduler"
    assert s.scheduling.namespace == "rgpu-system"
    assert s.scheduling.topology_keys == (
        "topology.rgpu.io/rack",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
    )
    assert s.peers.discovery_url == "http://127.0.0.1:8081"
    assert s.peers.allocator_url == "http://127.0.0.1:8082"
    assert s.kube.url is None
    assert s.kube.pod_namespace is None
    assert (s.log.level, s.log.format) == ("INFO", "json")
    assert (s.auth.mode, s.auth.cache_seconds) == ("tokenreview", 60.0)
    assert (s.auth.allocation_callers, s.auth.probe_callers) == ((), ())
    assert (s.auth.token_dir, s.auth.token_account) == ("/var/run/secrets/rgpu", None)
    assert s.http.max_body_bytes == 1 << 20
    assert s.http.limits == ListenerLimits(
        max_header_bytes=64 << 10,
        header_seconds=10.0,
        idle_seconds=120.0,
        max_connections=1024,
        max_client_connections=256,
    )
    assert (s.traces.sampler, s.traces.ratio) == ("parentbased_always_on", 1.0)
    assert s.traces.background_ratio == 0.1


@pytest.mark.parametrize(
    ("service", "listen"),
    [
        ("discovery", "127.0.0.1:8081"),
        ("allocator", "127.0.0.1:8082"),
        ("extender", "127.0.0.1:8083"),
        ("metrics", "127.0.0.1:9400"),
    ],
)
def test_listen_defaults_per_service(service: str, listen: str) -> None:
    assert str(Settings.from_env({}, service=service).http.listen) == listen


def test_empty_values_count_as_unset() -> None:
    s = Settings.from_env({"RGPU_NAMESPACE": "", "RGPU_SCHEDULER_NAME": "  "}, service="metrics")
    assert s.scheduling.namespace == "rgpu-system"
    assert s.scheduling.scheduler_name == "rgpu-scheduler"


def test_settings_are_frozen() -> None:
    s = Settings.from_env({}, service="metrics")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.service = "other"  # type: ignore[misc]


def test_default_environ_is_os_environ() -> None:
    os.environ["RGPU_SCHEDULER_NAME"] = "from-environ"
    assert Settings.from_env(service="metrics").scheduling.scheduler_name == "from-environ"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("RGPU_GRANULARITY", "gpu", "expected one of server, card"),
        ("RGPU_LOG_FORMAT", "xml", "expected one of json, text"),
        ("RGPU_LOG_LEVEL", "loud", "expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("RGPU_LISTEN", "localhost", "expected host:port"),
        ("RGPU_LISTEN", "::1:8080", "expected an IPv6 host in brackets"),
        ("RGPU_ALLOCATOR_URL", "allocator:8082", "expected an absolute http:// or https:// URL"),
        ("RGPU_KUBE_URL", "ftp://apiserver", "expected an absolute http:// or https:// URL"),
        ("RGPU_DISCOVERY_URL", "http://host:99999", "expected an absolute http:// or https:// URL"),
        ("RGPU_TOPOLOGY_KEYS", "rack zone", "is not a Kubernetes qualified name"),
        ("RGPU_TOPOLOGY_KEYS", " , ", "expected a comma-separated list of label keys"),
        ("RGPU_RESOURCE_COUNT", "nvidia.com/", "is not a Kubernetes qualified name"),
        ("RGPU_NAMESPACE", "RGPU_System", "expected a DNS-1123 label"),
        ("RGPU_SCHEDULER_NAME", "rgpu scheduler", "expected a single word without spaces"),
        ("RGPU_AUTH", "off", "expected one of tokenreview, none"),
        ("RGPU_ALLOCATION_CALLERS", "system:serviceaccount:rgpu-system:*", "no wildcards"),
        ("RGPU_PROBE_CALLERS", "system:serviceaccount:rgpu-system:*", "no wildcards"),
        ("RGPU_AUTH_CACHE_SECONDS", "0", "expected a positive number of seconds"),
        ("RGPU_TOKEN_ACCOUNT", "Rgpu_Extender", "expected a service-account name"),
        ("RGPU_MAX_BODY_BYTES", "1" * 5000, "expected a whole number of bytes"),
        ("RGPU_MAX_BODY_BYTES", "100", "expected a whole number of bytes, 1024.."),
        ("RGPU_MAX_BODY_BYTES", "1MiB", "expected a whole number of bytes"),
        ("RGPU_HTTP_MAX_HEADER_BYTES", "512", "expected a whole number of bytes, 1024..1048576"),
        ("RGPU_HTTP_MAX_HEADER_BYTES", "9" * 5000, "expected a whole number of bytes"),
        ("RGPU_HTTP_HEADER_SECONDS", "0", "expected a positive number of seconds"),
        ("RGPU_HTTP_IDLE_SECONDS", "-3", "expected a positive number of seconds"),
        ("RGPU_HTTP_MAX_CONNECTIONS", "0", "expected a whole number of connections, 1.."),
        ("RGPU_HTTP_MAX_CLIENT_CONNECTIONS", "many", "expected a whole number of connections"),
        ("RGPU_HTTP_MAX_CLIENT_CONNECTIONS", "2000", "at most RGPU_HTTP_MAX_CONNECTIONS (1024)"),
        ("RGPU_ADMISSION", "scheduler", "expected one of gate, filter"),
        ("OTEL_TRACES_SAMPLER", "jaeger_remote", "expected one of always_on, always_off, "),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5", "expected a share of traces between 0 and 1"),
        ("OTEL_TRACES_SAMPLER_ARG", "half", "expected a share of traces between 0 and 1"),
        ("RGPU_TRACE_BACKGROUND_RATIO", "nan", "expected a share of traces between 0 and 1"),
    ],
)
def test_bad_value_names_key_value_and_expectation(key: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({key: value}, service="extender")
    message = str(caught.value)
    assert message.startswith(f"{key}={value!r}: ")
    assert expected in message


def test_unknown_rgpu_key_is_refused_with_a_suggestion_and_the_known_keys() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"RGPU_GRANULARTY": "card"}, service="allocator")
    message = str(caught.value)
    assert message.startswith("RGPU_GRANULARTY: unknown setting")
    assert "did you mean RGPU_GRANULARITY?" in message
    assert "RGPU_BOOKING_TTL_SECONDS" in message


@pytest.mark.parametrize(
    ("key", "replacement"),
    [
        ("RGPU_ALLOWED_CALLERS", "RGPU_ALLOCATION_CALLERS"),
        ("RGPU_TOKEN_FILE", "RGPU_TOKEN_DIR"),
    ],
)
def test_a_retired_key_is_refused_naming_what_replaced_it(key: str, replacement: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({key: "x"}, service="allocator")
    assert str(caught.value).startswith(f"{key}: no longer read;")
    assert replacement in str(caught.value)


def test_keys_without_the_rgpu_prefix_are_ignored() -> None:
    Settings.from_env({"HOME": "/root", "OTEL_SERVICE_NAME": "x"}, service="allocator")


def test_unknown_service_is_refused() -> None:
    with pytest.raises(SettingsError, match="service='scheduler': expected one of discovery"):
        Settings.from_env({}, service="scheduler")


def test_warn_is_accepted_as_warning() -> None:
    assert Settings.from_env({"RGPU_LOG_LEVEL": "warn"}, service="metrics").log.level == "WARNING"


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:0", "127.0.0.1", 0),
        ("[::1]:8080", "::1", 8080),
        (":8082", "0.0.0.0", 8082),
        ("allocator.rgpu-system:80", "allocator.rgpu-system", 80),
    ],
)
def test_host_port_parses_the_accepted_forms(text: str, host: str, port: int) -> None:
    assert HostPort.parse(text) == HostPort(host=host, port=port)
