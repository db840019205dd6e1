from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from rgpu_runtime.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
    SettingsError,
)
from rgpu_runtime.kube import KubeClient, kube_client
from rgpu_runtime.settings import Settings

pytestmark = pytest.mark.anyio

LIBRARY_ERRORS = (ApiException, aiohttp.ClientError, httpx.HTTPError, ConfigException)


async def test_call_returns_the_model(kube: KubeClient) -> None:
    pod = await kube.call(kube.core.read_namespaced_pod, "trainer-0", "ml-team")
    assert pod.metadata.uid == "8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f"


async def test_call_raw_returns_a_plain_dict(kube: KubeClient) -> None:
    pod = await kube.call_raw(kube.core.read_namespaced_pod, "trainer-0", "ml-team")
    assert pod["metadata"]["resourceVersion"] == "4521"


async def test_list_objects_follows_continue_tokens(kube: KubeClient, apiserver: Any) -> None:
    listing = await kube.list_objects(kube.core.list_pod_for_all_namespaces, page_size=1)
    assert [item["metadata"]["name"] for item in listing.items] == ["trainer-0", "trainer-1"]
    assert listing.resource_version == "4525"
    assert [q.get("continue") for q in apiserver.list_queries] == [None, "page-2"]
    assert apiserver.list_queries[0]["limit"] == "1"


async def test_bind_pod_posts_uid_target_and_annotations(
    kube: KubeClient, apiserver: Any, k8s_fixture: Callable[[str], Any]
) -> None:
    await kube.bind_pod(
        "ml-team",
        "trainer-0",
        uid="8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f",
        node="gpu-node-1",
        annotations={"hami.io/lupine-endpoint": "10.0.3.50:50051"},
    )
    expected = k8s_fixture("binding-request.json")
    expected["target"]["apiVersion"] = "v1"
    assert apiserver.bindings == [expected]


async def test_bind_of_a_bound_pod_is_a_conflict_naming_the_node(kube: KubeClient) -> None:
    await kube.bind_pod("ml-team", "trainer-0", uid="u", node="gpu-node-2", annotations={})
    with pytest.raises(KubeConflict) as caught:
        await kube.bind_pod("ml-team", "trainer-0", uid="u", node="gpu-node-1", annotations={})
    assert caught.value.kube_status == 409
    assert 'already assigned to node "gpu-node-2"' in caught.value.kube_message
    assert "create_namespaced_pod_binding" in caught.value.message


async def _read_missing(kube: KubeClient) -> Any:
    return await kube.call(kube.core.read_namespaced_pod, "ghost", "ml-team")


async def _read_missing_raw(kube: KubeClient) -> Any:
    return await kube.call_raw(kube.core.read_namespaced_pod, "ghost", "ml-team")


async def _replace_stale(kube: KubeClient) -> Any:
    body = {"metadata": {"name": "trainer-0", "resourceVersion": "1"}}
    return await kube.call(kube.core.replace_namespaced_pod, "trainer-0", "ml-team", body)


async def _update_lease(kube: KubeClient) -> Any:
    body = {"metadata": {"name": "rgpu-scheduler"}}
    return await kube.call_raw(
        kube.coordination.replace_namespaced_lease, "rgpu-scheduler", "rgpu-system", body
    )


async def _read_forbidden(kube: KubeClient) -> Any:
    return await kube.call(kube.coordination.read_namespaced_lease, "x", "rgpu-system")


async def _list_overloaded(kube: KubeClient) -> Any:
    return await kube.call(kube.core.list_namespaced_pod, "ml-team")


async def _list_nodes_behind_broken_proxy(kube: KubeClient) -> Any:
    return await kube.call_raw(kube.core.list_node)


async def _read_slow(kube: KubeClient) -> Any:
    return await kube.call(
        kube.coordination.read_namespaced_lease, "slow", "rgpu-system", request_timeout=0.05
    )


async def _read_slow_raw(kube: KubeClient) -> Any:
    return await kube.call_raw(
        kube.coordination.read_namespaced_lease, "slow", "rgpu-system", request_timeout=0.05
    )


@pytest.mark.parametrize(
    ("call", "expected", "status"),
    [
        (_read_missing, KubeNotFound, 404),
        (_read_missing_raw, KubeNotFound, 404),
        (_replace_stale, KubeConflict, 409),
        (_update_lease, KubeInvalid, 422),
        (_read_forbidden, KubeForbidden, 403),
        (_list_overloaded, KubeUnavailable, 503),
        (_list_nodes_behind_broken_proxy, KubeUnavailable, 502),
        (_read_slow, KubeUnavailable, 0),
        (_read_slow_raw, KubeUnavailable, 0),
    ],
)
async def test_apiserver_failures_map_to_kube_errors_and_no_library_error_leaks(
    kube: KubeClient, call: Any, expected: type[KubeError], status: int
) -> None:
    with pytest.raises(KubeError) as caught:
        await call(kube)
    assert type(caught.value) is expected
    assert caught.value.kube_status == status
    assert not isinstance(caught.value, LIBRARY_ERRORS)


async def test_unavailable_keeps_the_retry_after_hint(kube: KubeClient) -> None:
    with pytest.raises(KubeUnavailable) as caught:
        await _list_overloaded(kube)
    assert caught.value.retry_after == 3.0
    assert caught.value.retryable
    assert "etcd is sad" in caught.value.message


async def test_conflict_message_keeps_the_apiserver_reason(kube: KubeClient) -> None:
    with pytest.raises(KubeConflict) as caught:
        await _replace_stale(kube)
    assert caught.value.kube_reason == "Conflict"
    assert "the object has been modified" in caught.value.kube_message


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_refused_connection_is_kube_unavailable_without_leaking_aiohttp() -> None:
    settings = Settings.from_env(
        {"RGPU_KUBE_URL": f"http://127.0.0.1:{_closed_port()}"}, service="discovery"
    )
    async with kube_client(settings, timeout=1.0) as kube:
        for call in (_read_missing, _read_missing_raw):
            with pytest.raises(KubeUnavailable) as caught:
                await call(kube)
            assert isinstance(caught.value.__cause__, aiohttp.ClientError)
            assert not isinstance(caught.value, LIBRARY_ERRORS)


async def test_kube_client_reads_a_kubeconfig_when_no_url_is_set(
    tmp_path: Path, apiserver: Any
) -> None:
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: sim\n"
        f"clusters: [{{name: sim, cluster: {{server: '{apiserver.url}'}}}}]\n"
        "users: [{name: me, user: {token: abc}}]\n"
        "contexts: [{name: sim, context: {cluster: sim, user: me}}]\n"
    )
    settings = Settings.from_env({"KUBECONFIG": str(config)}, service="allocator")
    async with kube_client(settings) as kube:
        pod = await kube.call_raw(kube.core.read_namespaced_pod, "trainer-0", "ml-team")
    assert pod["metadata"]["name"] == "trainer-0"


async def test_kube_client_ignores_proxy_variables_and_reaches_the_apiserver_directly(
    apiserver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A session trusting the environment would send every request to this closed port.
    dead_proxy = f"http://127.0.0.1:{_closed_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    settings = Settings.from_env({"RGPU_KUBE_URL": apiserver.url}, service="allocator")
    async with kube_client(settings, timeout=2.0) as kube:
        pod = await kube.call_raw(kube.core.read_namespaced_pod, "trainer-0", "ml-team")
    assert pod["metadata"]["name"] == "trainer-0"


async def test_kube_client_without_any_configuration_says_what_to_set(tmp_path: Path) -> None:
    settings = Settings.from_env({"KUBECONFIG": str(tmp_path / "absent")}, service="allocator")
    with pytest.raises(SettingsError, match="set RGPU_KUBE_URL or KUBECONFIG"):
        async with kube_client(settings):
            pass


async def test_in_cluster_without_a_service_account_says_what_to_mount() -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    settings = Settings.from_env(environ, service="allocator")
    with pytest.raises(SettingsError, match="mount the token or set RGPU_KUBE_URL"):
        async with kube_client(settings):
            pass
