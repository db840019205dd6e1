"""ConfigMaps (core/v1) through the real HTTP API and the unmodified kubernetes_asyncio client:
the verbs, selectors and resourceVersion semantics of the other kinds, and kube's refusals."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import orjson
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

CONFIGMAPS = "/api/v1/namespaces/rgpu-system/configmaps"
QUEUES = "queues.yaml"


@pytest.fixture
async def core(sim: SimApiServer) -> AsyncIterator[k8s.CoreV1Api]:
    sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
    async with k8s.ApiClient(k8s.Configuration(host=sim.url)) as api:
        yield k8s.CoreV1Api(api)


def queues(name: str = "rgpu-queues", **labels: str) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels or None),
        data={QUEUES: "queues:\n- name: research\n  weight: 2\n"},
        binary_data={"logo.png": base64.b64encode(b"\x89PNG\r\n").decode()},
    )


async def test_a_configmap_round_trips_through_kubernetes_asyncio_with_both_kinds_of_data(
    core: k8s.CoreV1Api,
) -> None:
    created = await core.create_namespaced_config_map("rgpu-system", queues(app="rgpu"))
    assert created.metadata.uid and created.metadata.resource_version
    read = await core.read_namespaced_config_map("rgpu-queues", "rgpu-system")
    assert read.data == {QUEUES: "queues:\n- name: research\n  weight: 2\n"}
    assert base64.b64decode(read.binary_data["logo.png"]) == b"\x89PNG\r\n"
    assert read.metadata.resource_version == created.metadata.resource_version


async def test_configmaps_are_listed_by_label_and_field_selectors_in_and_across_namespaces(
    core: k8s.CoreV1Api,
) -> None:
    await core.create_namespaced_config_map("rgpu-system", queues(app="rgpu"))
    await core.create_namespaced_config_map("rgpu-system", queues("other", app="web"))
    await core.create_namespaced_config_map("default", queues("elsewhere", app="rgpu"))
    labelled = await core.list_namespaced_config_map("rgpu-system", label_selector="app=rgpu")
    assert [c.metadata.name for c in labelled.items] == ["rgpu-queues"]
    named = await core.list_config_map_for_all_namespaces(field_selector="metadata.name=other")
    assert [c.metadata.name for c in named.items] == ["other"]
    everywhere = await core.list_config_map_for_all_namespaces(label_selector="app=rgpu")
    assert sorted(c.metadata.name for c in everywhere.items) == ["elsewhere", "rgpu-queues"]
    with pytest.raises(ApiException) as refused:
        await core.list_config_map_for_all_namespaces(field_selector="data.x=1")
    assert refused.value.status == 400


async def test_a_watch_from_the_listed_version_sees_each_change_of_the_queue_configmap(
    core: k8s.CoreV1Api, sim: SimApiServer
) -> None:
    listed = await core.list_namespaced_config_map("rgpu-system")
    await core.create_namespaced_config_map("rgpu-system", queues())
    patch = {"data": {QUEUES: "queues: []\n"}}
    await core.patch_namespaced_config_map("rgpu-queues", "rgpu-system", patch)
    await core.delete_namespaced_config_map("rgpu-queues", "rgpu-system")
    seen: list[tuple[str, Any]] = []
    async with Watch() as watch:
        stream = watch.stream(
            core.list_namespaced_config_map,
            "rgpu-system",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=5,
        )
        with anyio.fail_after(5):
            async for event in stream:
                seen.append((event["type"], (event["object"].data or {}).get(QUEUES)))
                if len(seen) == 3:
                    watch.stop()
    assert seen == [
        ("ADDED", "queues:\n- name: research\n  weight: 2\n"),
        ("MODIFIED", "queues: []\n"),
        ("DELETED", "queues: []\n"),
    ]


async def test_a_replace_at_a_stale_resource_version_is_409_and_keeps_the_newer_data(
    core: k8s.CoreV1Api,
) -> None:
    created = await core.create_namespaced_config_map("rgpu-system", queues())
    created.data = {QUEUES: "queues: [mine]\n"}
    await core.replace_namespaced_config_map("rgpu-queues", "rgpu-system", created)
    created.data = {QUEUES: "queues: [stale]\n"}
    with pytest.raises(ApiException) as refused:
        await core.replace_namespaced_config_map("rgpu-queues", "rgpu-system", created)
    assert refused.value.status == 409
    assert orjson.loads(refused.value.body)["details"] == {
        "name": "rgpu-queues",
        "kind": "configmaps",
    }
    current = await core.read_namespaced_config_map("rgpu-queues", "rgpu-system")
    assert current.data == {QUEUES: "queues: [mine]\n"}


async def test_a_delete_with_a_wrong_uid_precondition_is_409_and_deletes_nothing(
    core: k8s.CoreV1Api,
) -> None:
    await core.create_namespaced_config_map("rgpu-system", queues())
    options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid="not-this-one"))
    with pytest.raises(ApiException) as refused:
        await core.delete_namespaced_config_map("rgpu-queues", "rgpu-system", body=options)
    assert refused.value.status == 409
    assert (await core.list_namespaced_config_map("rgpu-system")).items


async def test_bad_keys_a_key_in_both_maps_and_over_a_mebibyte_are_422_with_kubes_paths(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
    body = {
        "metadata": {"name": "bad"},
        "data": {"a b": "1", "..x": "2", "both": "3", "big": "x" * (1024 * 1024)},
        "binaryData": {"both": "AA=="},
    }
    response = await client.post(CONFIGMAPS, json=body)
    assert response.status_code == 422
    causes = [(c["field"], c["message"]) for c in response.json()["details"]["causes"]]
    assert causes == [
        (
            "data[a b]",
            'Invalid value: "a b": a valid config key must consist of alphanumeric characters, '
            "'-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for "
            "validation is '[-._a-zA-Z0-9]+')",
        ),
        ("data[..x]", "Invalid value: \"..x\": must not start with '..'"),
        ("data[both]", 'Invalid value: "both": duplicate of key present in binaryData'),
        ("", "Too long: may not be more than 1048576 bytes"),
    ]
    assert response.json()["details"]["kind"] == "ConfigMap"


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("data", {"n": 3}, "cannot unmarshal number into Go struct field ConfigMap.data"),
        ("binaryData", {"b": "not base64!"}, "binaryData[b]: illegal base64 data"),
        ("immutable", "yes", "cannot unmarshal string into Go struct field ConfigMap.immutable"),
    ],
)
async def test_values_go_cannot_decode_are_a_400_naming_the_field(
    client: httpx.AsyncClient, sim: SimApiServer, field: str, value: Any, why: str
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
    response = await client.post(CONFIGMAPS, json={"metadata": {"name": "bad"}, field: value})
    assert response.status_code == 400
    message = response.json()["message"]
    assert message.startswith('ConfigMap in version "v1" cannot be handled as a ConfigMap: ')
    assert why in message


async def test_an_immutable_configmap_refuses_any_change_of_its_data_or_flag_but_deletes(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
    body = {"metadata": {"name": "frozen"}, "data": {"k": "v"}, "immutable": True}
    assert (await client.post(CONFIGMAPS, json=body)).status_code == 201
    patch = {"data": {"k": "w"}, "immutable": False}
    response = await client.patch(
        f"{CONFIGMAPS}/frozen",
        content=orjson.dumps(patch),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 422
    assert [(c["field"], c["message"]) for c in response.json()["details"]["causes"]] == [
        ("immutable", "Forbidden: field is immutable when `immutable` is set"),
        ("data", "Forbidden: field is immutable when `immutable` is set"),
    ]
    labelled = {"metadata": {"labels": {"team": "ml"}}}
    response = await client.patch(
        f"{CONFIGMAPS}/frozen",
        content=orjson.dumps(labelled),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text
    assert (await client.delete(f"{CONFIGMAPS}/frozen")).status_code == 200
