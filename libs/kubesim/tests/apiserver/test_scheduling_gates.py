"""Scheduling gates (``spec.schedulingGates``) as kube-apiserver >= 1.30 validates and reports
them, and the resourceVersion precondition that lets one controller remove only its own gate."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]
PODS = "/api/v1/namespaces/default/pods"
GATE = "rgpu.io/admission"
MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


def gated(pod: Manifest, name: str, *gates: str) -> dict[str, Any]:
    return pod(name, spec={**pod(name)["spec"], "schedulingGates": [{"name": g} for g in gates]})


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post(PODS, json=body)


def causes(response: httpx.Response) -> list[tuple[str, str, str]]:
    details = response.json()["details"]
    return [(c["field"], c["reason"], c["message"]) for c in details["causes"]]


async def test_a_pod_created_with_gates_waits_with_podscheduled_false_schedulinggated(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    response = await create(client, gated(pod, "trainer", GATE, "example.com/quota"))
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["spec"]["schedulingGates"] == [{"name": GATE}, {"name": "example.com/quota"}]
    assert created["status"]["phase"] == "Pending"
    assert created["status"]["conditions"] == [
        {
            "type": "PodScheduled",
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": None,
            "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates",
        }
    ]


async def test_a_pod_created_without_gates_carries_no_podscheduled_condition(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    created = (await create(client, pod("web"))).json()
    assert "conditions" not in created["status"]


async def test_gate_names_must_be_qualified_names_and_unique_with_kubes_field_paths(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    response = await create(client, gated(pod, "trainer", GATE, "not a name!", GATE))
    assert response.status_code == 422
    body = response.json()
    assert body["reason"] == "Invalid" and body["details"]["kind"] == "Pod"
    assert causes(response) == [
        (
            "spec.schedulingGates[1]",
            "FieldValueInvalid",
            'Invalid value: "not a name!": name part must consist of alphanumeric characters, '
            "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
            "'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
            "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        ),
        ("spec.schedulingGates[2]", "FieldValueDuplicate", f'Duplicate value: "{GATE}"'),
    ]
    assert body["message"].startswith('Pod "trainer" is invalid: [spec.schedulingGates[1]: ')


async def test_a_gated_pod_cannot_name_its_node_at_creation(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    body = gated(pod, "trainer", GATE)
    body["spec"]["nodeName"] = "gpu-a"
    response = await create(client, body)
    assert response.status_code == 422
    assert causes(response) == [
        (
            "spec.nodeName",
            "FieldValueForbidden",
            "Forbidden: cannot be set until all schedulingGates have been cleared",
        )
    ]


@pytest.mark.parametrize(
    ("before", "after", "index", "added"),
    [
        ((), (GATE,), 0, GATE),
        ((GATE,), (GATE, "example.com/late"), 1, "example.com/late"),
        ((GATE,), ("rgpu.io/renamed",), 0, "rgpu.io/renamed"),
    ],
    ids=["added-to-an-ungated-pod", "added-beside-a-gate", "renamed"],
)
async def test_a_gate_may_never_be_added_or_renamed_after_creation(
    client: httpx.AsyncClient,
    pod: Manifest,
    before: tuple[str, ...],
    after: tuple[str, ...],
    index: int,
    added: str,
) -> None:
    assert (await create(client, gated(pod, "trainer", *before))).status_code == 201
    patch = {"spec": {"schedulingGates": [{"name": g} for g in after]}}
    response = await client.patch(f"{PODS}/trainer", content=orjson.dumps(patch), headers=MERGE)
    assert response.status_code == 422, response.text
    assert causes(response) == [
        (
            f"spec.schedulingGates[{index}].name",
            "FieldValueForbidden",
            f"Forbidden: only deletion is allowed, but found new scheduling gate '{added}'",
        )
    ]


async def test_the_admitters_merge_patch_removes_only_its_gate_at_the_version_it_read(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    created = (await create(client, gated(pod, "trainer", "example.com/quota", GATE))).json()
    patch = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"schedulingGates": [{"name": "example.com/quota"}]},
    }
    response = await client.patch(f"{PODS}/trainer", content=orjson.dumps(patch), headers=MERGE)
    assert response.status_code == 200, response.text
    assert response.json()["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    last = {
        "metadata": {"resourceVersion": response.json()["metadata"]["resourceVersion"]},
        "spec": {"schedulingGates": []},
    }
    response = await client.patch(f"{PODS}/trainer", content=orjson.dumps(last), headers=MERGE)
    assert response.status_code == 200, response.text
    assert not response.json()["spec"].get("schedulingGates")


def _stale_requests(rv: str) -> dict[str, tuple[str, dict[str, str], Any]]:
    remove = {"schedulingGates": []}
    return {
        "merge": ("PATCH", MERGE, {"metadata": {"resourceVersion": rv}, "spec": remove}),
        "strategic": ("PATCH", STRATEGIC, {"metadata": {"resourceVersion": rv}, "spec": remove}),
        "json": (
            "PATCH",
            JSON_PATCH,
            [
                {"op": "replace", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "remove", "path": "/spec/schedulingGates"},
            ],
        ),
    }


@pytest.mark.parametrize("kind", ["merge", "strategic", "json", "put"])
async def test_a_stale_resource_version_is_409_conflict_and_changes_nothing(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, kind: str
) -> None:
    created = (await create(client, gated(pod, "trainer", GATE))).json()
    stale = created["metadata"]["resourceVersion"]
    sim.store.patch("pods", "trainer", {"metadata": {"labels": {"moved": "on"}}})
    if kind == "put":
        body = {**created, "spec": {**created["spec"], "schedulingGates": []}}
        response = await client.put(f"{PODS}/trainer", json=body)
    else:
        method, headers, patch = _stale_requests(stale)[kind]
        response = await client.request(
            method, f"{PODS}/trainer", content=orjson.dumps(patch), headers=headers
        )
    assert response.status_code == 409, response.text
    assert response.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on pods "trainer": the object has been '
        "modified; please apply your changes to the latest version and try again",
        "reason": "Conflict",
        "details": {"name": "trainer", "kind": "pods"},
        "code": 409,
    }
    assert sim.store.get("pods", "trainer")["spec"]["schedulingGates"] == [{"name": GATE}]


async def test_binding_a_gated_pod_is_refused_as_kubes_binding_storage_does(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    await create(client, gated(pod, "trainer", GATE))
    binding = {"metadata": {"name": "trainer"}, "target": {"kind": "Node", "name": "gpu-a"}}
    response = await client.post(f"{PODS}/trainer/binding", json=binding)
    assert response.status_code == 409
    assert response.json()["message"] == (
        'Operation cannot be fulfilled on pods/binding "trainer": '
        "pod trainer has non-empty .spec.schedulingGates"
    )


@pytest.fixture
async def core(sim: SimApiServer) -> AsyncIterator[k8s.CoreV1Api]:
    async with k8s.ApiClient(k8s.Configuration(host=sim.url)) as api:
        yield k8s.CoreV1Api(api)


async def test_kubernetes_asyncio_removes_a_gate_with_a_precondition_and_gets_409_when_stale(
    core: k8s.CoreV1Api, sim: SimApiServer, pod: Manifest
) -> None:
    created = await core.create_namespaced_pod("default", gated(pod, "trainer", GATE))
    assert created.spec.scheduling_gates[0].name == GATE
    assert created.status.conditions[0].reason == "SchedulingGated"
    rv = created.metadata.resource_version
    sim.store.patch("pods", "trainer", {"metadata": {"annotations": {"seen": "1"}}})
    patch = {"metadata": {"resourceVersion": rv}, "spec": {"schedulingGates": []}}
    with pytest.raises(ApiException) as refused:
        await core.patch_namespaced_pod(
            "trainer", "default", patch, _content_type="application/merge-patch+json"
        )
    assert refused.value.status == 409
    assert orjson.loads(refused.value.body)["reason"] == "Conflict"
    current = await core.read_namespaced_pod("trainer", "default")
    patch["metadata"]["resourceVersion"] = current.metadata.resource_version
    released = await core.patch_namespaced_pod(
        "trainer", "default", patch, _content_type="application/merge-patch+json"
    )
    assert not released.spec.scheduling_gates


async def test_binding_a_pod_being_deleted_is_refused_for_that_before_its_node_is_named(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("trainer"))
    sim.store.bind("trainer", "gpu-a")
    sim.store.delete("pods", "trainer")
    binding = {"metadata": {"name": "trainer"}, "target": {"kind": "Node", "name": "gpu-b"}}
    response = await client.post(f"{PODS}/trainer/binding", json=binding)
    assert response.status_code == 409
    assert response.json()["message"] == (
        'Operation cannot be fulfilled on pods/binding "trainer": '
        "pod trainer is being deleted, cannot be assigned to a host"
    )
