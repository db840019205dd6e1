"""The unmodified kubernetes_asyncio client against the simulated apiserver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]


@pytest.fixture
async def api(sim: SimApiServer) -> AsyncIterator[k8s.ApiClient]:
    configuration = k8s.Configuration(host=sim.url)
    async with k8s.ApiClient(configuration) as client:
        yield client


async def test_lists_pods_across_and_within_namespaces(
    api: k8s.ApiClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "ml"}})
    sim.store.create("pods", pod("a", metadata={"labels": {"app": "x"}}))
    sim.store.create("pods", pod("b", namespace="ml"))
    core = k8s.CoreV1Api(api)
    everywhere = await core.list_pod_for_all_namespaces()
    assert [p.metadata.name for p in everywhere.items] == ["a", "b"]
    assert everywhere.metadata.resource_version == str(sim.store.resource_version)
    selected = await core.list_namespaced_pod("default", label_selector="app=x")
    assert [p.metadata.name for p in selected.items] == ["a"]
    assert selected.items[0].spec.containers[0].image == "busybox:1.36"


async def test_watch_stream_delivers_typed_events(
    api: k8s.ApiClient, sim: SimApiServer, pod: Manifest
) -> None:
    core = k8s.CoreV1Api(api)
    version = (await core.list_namespaced_pod("default")).metadata.resource_version
    sim.store.create("pods", pod("a"))
    sim.store.bind("a", "gpu-a")
    seen = []
    async with Watch() as watch:
        stream = watch.stream(
            core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=2
        )
        async for event in stream:
            seen.append(
                (event["type"], event["object"].metadata.name, event["object"].spec.node_name)
            )
            if len(seen) == 2:
                watch.stop()
    assert seen == [("ADDED", "a", None), ("MODIFIED", "a", "gpu-a")]


async def _watch_events(core: k8s.CoreV1Api, version: str) -> list[str]:
    async with Watch() as watch:
        stream = watch.stream(
            core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=1
        )
        return [event["type"] async for event in stream]


async def test_reflector_recovers_from_410_by_relisting(
    api: k8s.ApiClient, sim: SimApiServer, pod: Manifest
) -> None:
    core = k8s.CoreV1Api(api)
    stale = (await core.list_namespaced_pod("default")).metadata.resource_version
    sim.store.create("pods", pod("a"))
    sim.faults.expire_before()
    with pytest.raises(ApiException) as caught:
        await _watch_events(core, stale)
    assert caught.value.status == 410
    relisted = await core.list_namespaced_pod("default")
    assert [p.metadata.name for p in relisted.items] == ["a"]
    sim.store.create("pods", pod("b"))
    async with Watch() as watch:
        async for event in watch.stream(
            core.list_namespaced_pod,
            "default",
            resource_version=relisted.metadata.resource_version,
            timeout_seconds=2,
        ):
            assert (event["type"], event["object"].metadata.name) == ("ADDED", "b")
            watch.stop()


async def test_patches_with_each_content_type(
    api: k8s.ApiClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    core = k8s.CoreV1Api(api)
    await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"smp": "1"}}})
    await core.patch_namespaced_pod(
        "a",
        "default",
        {"metadata": {"labels": {"merge": "1"}}},
        _content_type="application/merge-patch+json",
    )
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {"json": "1"}}]
    patched = await core.patch_namespaced_pod("a", "default", ops)
    assert patched.metadata.labels == {"smp": "1", "merge": "1"}
    assert patched.metadata.annotations == {"json": "1"}


async def test_lease_replace_is_compare_and_swap(api: k8s.ApiClient, lease: Manifest) -> None:
    leases = k8s.CoordinationV1Api(api)
    created = await leases.create_namespaced_lease("default", lease("alloc"))
    mine = await leases.read_namespaced_lease("alloc", "default")
    theirs = await leases.read_namespaced_lease("alloc", "default")
    mine.spec.holder_identity = "replica-1"
    await leases.replace_namespaced_lease("alloc", "default", mine)
    theirs.spec.holder_identity = "replica-2"
    with pytest.raises(ApiException) as caught:
        await leases.replace_namespaced_lease("alloc", "default", theirs)
    assert caught.value.status == 409
    current = await leases.read_namespaced_lease("alloc", "default")
    assert current.spec.holder_identity == "replica-1"
    assert int(current.metadata.resource_version) > int(created.metadata.resource_version)


async def test_delete_with_preconditions(
    api: k8s.ApiClient, sim: SimApiServer, pod: Manifest
) -> None:
    uid = sim.store.create("pods", pod("a"))["metadata"]["uid"]
    core = k8s.CoreV1Api(api)
    wrong = k8s.V1DeleteOptions(
        preconditions=k8s.V1Preconditions(uid="00000000-0000-0000-0000-000000000000")
    )
    with pytest.raises(ApiException) as caught:
        await core.delete_namespaced_pod("a", "default", body=wrong)
    assert caught.value.status == 409
    right = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
    deleted = await core.delete_namespaced_pod("a", "default", body=right)
    assert deleted.metadata.name == "a"
    assert sim.store.list("pods") == []


async def test_binding_reaches_the_server_with_preload_content_off(
    api: k8s.ApiClient, sim: SimApiServer, pod: Manifest
) -> None:
    uid = sim.store.create("pods", pod("a"))["metadata"]["uid"]
    body = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(
            name="a", uid=uid, annotations={"hami.io/lupine-endpoint": "10.0.0.1:14833"}
        ),
        target=k8s.V1ObjectReference(kind="Node", name="gpu-a"),
    )
    core = k8s.CoreV1Api(api)
    response = await core.create_namespaced_pod_binding(
        "a", "default", body, _preload_content=False
    )
    assert response.status == 201
    assert (await response.json())["status"] == "Success"
    bound = sim.store.get("pods", "a")
    assert bound["spec"]["nodeName"] == "gpu-a"
    assert bound["metadata"]["annotations"] == {"hami.io/lupine-endpoint": "10.0.0.1:14833"}


async def test_api_errors_arrive_as_api_exception_with_status_body(api: k8s.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        await k8s.CoreV1Api(api).read_namespaced_pod("ghost", "default")
    assert caught.value.status == 404
    assert '"reason":"NotFound"' in caught.value.body


async def test_dry_run_create_and_a_consistent_paged_list(
    api: k8s.ApiClient, sim: SimApiServer, pod: Manifest
) -> None:
    core = k8s.CoreV1Api(api)
    answered = await core.create_namespaced_pod("default", pod("ghost"), dry_run="All")
    assert answered.metadata.uid and answered.metadata.resource_version is None
    for name in ("a", "b", "c"):
        sim.store.create("pods", pod(name))
    first = await core.list_namespaced_pod("default", limit=1)
    sim.store.create("pods", pod("bb"))
    rest = await core.list_namespaced_pod("default", limit=5, _continue=first.metadata._continue)
    assert [p.metadata.name for p in first.items + rest.items] == ["a", "b", "c"]
    assert rest.metadata.resource_version == first.metadata.resource_version
