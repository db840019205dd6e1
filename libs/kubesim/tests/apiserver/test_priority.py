"""PriorityClasses and the Priority admission plugin over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]
CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
PODS = "/api/v1/namespaces/default/pods"


def priority_class(name: str, value: int, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        **extra,
    }


async def create_pod(client: httpx.AsyncClient, pod: Manifest, **spec: Any) -> httpx.Response:
    manifest = pod("a")
    manifest["spec"].update(spec)
    return await client.post(PODS, json=manifest)


async def test_the_system_classes_are_built_in(client: httpx.AsyncClient) -> None:
    listed = (await client.get(CLASSES)).json()["items"]
    values = {c["metadata"]["name"]: c["value"] for c in listed}
    assert values == {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}
    assert all(c["preemptionPolicy"] == "PreemptLowerPriority" for c in listed)


async def test_a_named_class_sets_priority_and_preemption_policy(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    made = await client.post(CLASSES, json=priority_class("batch", 100, preemptionPolicy="Never"))
    assert made.status_code == 201
    spec = (await create_pod(client, pod, priorityClassName="batch")).json()["spec"]
    assert (spec["priority"], spec["preemptionPolicy"]) == (100, "Never")


async def test_without_a_class_or_default_the_priority_is_zero(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    spec = (await create_pod(client, pod)).json()["spec"]
    assert (spec["priority"], spec["preemptionPolicy"]) == (0, "PreemptLowerPriority")
    assert "priorityClassName" not in spec


async def test_the_global_default_class_applies_to_pods_naming_none(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    await client.post(CLASSES, json=priority_class("normal", 50, globalDefault=True))
    spec = (await create_pod(client, pod)).json()["spec"]
    assert (spec["priorityClassName"], spec["priority"]) == ("normal", 50)


async def test_an_unknown_class_is_forbidden_with_kubes_message(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    response = await create_pod(client, pod, priorityClassName="foo")
    assert response.status_code == 403
    body = response.json()
    assert body["reason"] == "Forbidden"
    assert body["message"] == 'pods "a" is forbidden: no PriorityClass with name foo was found'


async def test_a_priority_disagreeing_with_the_class_is_forbidden(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    await client.post(CLASSES, json=priority_class("batch", 100))
    response = await create_pod(client, pod, priorityClassName="batch", priority=7)
    assert response.status_code == 403
    assert response.json()["message"] == (
        'pods "a" is forbidden: the integer value of priority (7) must not be provided in pod '
        "spec; priority admission controller computed 100 from the given PriorityClass name"
    )
    agreeing = await create_pod(client, pod, priorityClassName="batch", priority=100)
    assert agreeing.status_code == 201


async def test_a_preemption_policy_disagreeing_with_the_class_is_forbidden(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    await client.post(CLASSES, json=priority_class("batch", 100, preemptionPolicy="Never"))
    response = await create_pod(
        client, pod, priorityClassName="batch", preemptionPolicy="PreemptLowerPriority"
    )
    assert response.status_code == 403
    assert (
        "PreemptionPolicy (PreemptLowerPriority) must not be provided"
        in (response.json()["message"])
    )


async def test_only_one_class_may_be_the_global_default(client: httpx.AsyncClient) -> None:
    await client.post(CLASSES, json=priority_class("first", 1, globalDefault=True))
    response = await client.post(CLASSES, json=priority_class("second", 2, globalDefault=True))
    assert response.status_code == 403
    assert "PriorityClass first is already marked as default" in response.json()["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (priority_class("huge", 1_000_000_001), "value"),
        (priority_class("system-mine", 5), "metadata.name"),
        (priority_class("odd", 5, preemptionPolicy="Sometimes"), "preemptionPolicy"),
        ({"metadata": {"name": "none"}}, "value"),
    ],
)
async def test_an_invalid_class_is_a_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await client.post(CLASSES, json=body)
    assert response.status_code == 422
    assert field in [c["field"] for c in response.json()["details"]["causes"]]


async def test_a_class_value_cannot_change(client: httpx.AsyncClient) -> None:
    await client.post(CLASSES, json=priority_class("batch", 100))
    response = await client.patch(
        f"{CLASSES}/batch",
        json={"value": 200},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 422
    assert "may not be changed in an update" in response.json()["message"]
