from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import anyio
import orjson
import pytest

from rgpu_runtime.errors import KubeExpired, KubeUnavailable
from rgpu_runtime.kube import KubeClient, WatchEvent, decode_event
from rgpu_testkit import pod_manifest

pytestmark = pytest.mark.anyio


def test_decode_event_keeps_the_object_as_a_plain_dict() -> None:
    line = b'{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"resourceVersion":"9"}}}\n'
    event = decode_event(line, "watch")
    assert event == WatchEvent(
        type="MODIFIED", object={"kind": "Pod", "metadata": {"resourceVersion": "9"}}
    )
    assert event.resource_version == "9"


def test_decode_event_turns_a_410_error_event_into_kube_expired(
    k8s_fixture: Callable[[str], Any],
) -> None:
    line = orjson.dumps({"type": "ERROR", "object": k8s_fixture("status-410-expired.json")})
    with pytest.raises(KubeExpired) as caught:
        decode_event(line, "list_pod")
    assert caught.value.kube_reason == "Expired"
    assert "too old resource version" in caught.value.kube_message


@pytest.mark.parametrize("line", [b"not json", b'{"type":"ADDED"}', b"[1, 2]"])
def test_decode_event_refuses_malformed_lines_with_a_kube_error(line: bytes) -> None:
    with pytest.raises(KubeUnavailable):
        decode_event(line, "watch")


async def test_watch_yields_events_and_resumes_from_the_last_version_until_expired(
    kube: KubeClient, apiserver: Any
) -> None:
    seen: list[tuple[str, str]] = []
    stream = kube.watch(
        kube.core.list_pod_for_all_namespaces, resource_version="4525", timeout_seconds=60
    )

    async def consume() -> None:
        async for event in stream:
            seen.append((event.type, event.resource_version))

    with anyio.fail_after(5), pytest.raises(KubeExpired):
        await consume()
    assert seen == [
        ("ADDED", "4521"),
        ("MODIFIED", "4530"),
        ("BOOKMARK", "4601"),
        ("DELETED", "4530"),
    ]
    first, second = apiserver.watch_queries
    assert first["resourceVersion"] == "4525"
    assert first["allowWatchBookmarks"].lower() == "true"
    assert first["timeoutSeconds"] == "60"
    assert second["resourceVersion"] == "4530"


async def test_watch_objects_are_dicts_not_models(kube: KubeClient) -> None:
    async with aclosing(
        kube.watch(kube.core.list_pod_for_all_namespaces, resource_version="4525")
    ) as stream:
        event = await anext(stream)
    assert isinstance(event.object, dict)
    assert event.object["spec"]["schedulerName"] == "rgpu-scheduler"


async def test_watch_that_cannot_open_raises_the_mapped_error(kube: KubeClient) -> None:
    stream = kube.watch(kube.core.list_namespaced_pod, "ml-team", resource_version="1")
    with pytest.raises(KubeUnavailable) as caught:
        await anext(stream)
    assert caught.value.retry_after == 3.0


kubesim = pytest.importorskip("rgpu_kubesim")


def _pod(name: str) -> dict[str, Any]:
    return pod_manifest(name=name)


async def test_against_the_simulated_apiserver_list_watch_and_bind_work() -> None:
    from rgpu_runtime.kube import kube_client
    from rgpu_runtime.settings import Settings

    async with kubesim.run_apiserver() as sim:
        sim.store.create("nodes", {"metadata": {"name": "node-a"}})
        created = sim.store.create("pods", _pod("p-0"), namespace="default")
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="allocator")
        async with kube_client(settings) as kube:
            listing = await kube.list_objects(kube.core.list_pod_for_all_namespaces)
            assert [p["metadata"]["name"] for p in listing.items] == ["p-0"]
            stream = kube.watch(
                kube.core.list_pod_for_all_namespaces,
                resource_version=listing.resource_version,
            )
            async with aclosing(stream) as events:
                await kube.bind_pod(
                    "default",
                    "p-0",
                    uid=created["metadata"]["uid"],
                    node="node-a",
                    annotations={"hami.io/lupine-endpoint": "10.0.0.9:14833"},
                )
                with anyio.fail_after(5):
                    event = await anext(events)
                    while event.type == "BOOKMARK":
                        event = await anext(events)
            assert event.type == "MODIFIED"
            assert event.object["spec"]["nodeName"] == "node-a"
            assert event.object["metadata"]["annotations"]["hami.io/lupine-endpoint"] == (
                "10.0.0.9:14833"
            )
