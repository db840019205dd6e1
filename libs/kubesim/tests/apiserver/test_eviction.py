"""PodDisruptionBudgets and the pods/eviction subresource over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]
BUDGETS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
PODS = "/api/v1/namespaces/default/pods"
READY = [{"type": "Ready", "status": "True"}]


@pytest.fixture
async def core(sim: SimApiServer) -> AsyncIterator[k8s.CoreV1Api]:
    async with k8s.ApiClient(k8s.Configuration(host=sim.url)) as api:
        yield k8s.CoreV1Api(api)


def running(sim: SimApiServer, pod: Manifest, name: str, *, ready: bool = True) -> None:
    sim.store.create("pods", pod(name, metadata={"labels": {"app": "train"}}))
    sim.store.bind(name, "node-a")
    conditions = READY if ready else [{"type": "Ready", "status": "False"}]
    status = {"status": {"phase": "Running", "conditions": conditions}}
    sim.store.patch("pods", name, status, subresource="status")


def budget(name: str = "train", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "train"}}, **spec},
    }


def status_of(sim: SimApiServer, name: str = "train") -> dict[str, Any]:
    got: dict[str, Any] = sim.store.get("poddisruptionbudgets", name, namespace="default")
    return dict(got["status"])


def eviction(name: str, **options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"},
    }
    if options:
        body["deleteOptions"] = options
    return body


async def evict(client: httpx.AsyncClient, name: str, **options: Any) -> httpx.Response:
    return await client.post(f"{PODS}/{name}/eviction", json=eviction(name, **options))


# -- budget status -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "desired", "allowed"),
    [
        ({"minAvailable": 2}, 2, 1),
        ({"minAvailable": "50%"}, 2, 1),
        ({"maxUnavailable": 1}, 2, 1),
        ({"maxUnavailable": "34%"}, 1, 2),
    ],
)
async def test_budget_status_is_computed_from_matching_pods(
    sim: SimApiServer,
    client: httpx.AsyncClient,
    pod: Manifest,
    spec: dict[str, Any],
    desired: int,
    allowed: int,
) -> None:
    for name in ("t-0", "t-1", "t-2"):
        running(sim, pod, name)
    sim.store.create("pods", pod("other"))
    made = await client.post(BUDGETS, json=budget(**spec))
    assert made.status_code == 201
    status = status_of(sim)
    assert status["expectedPods"] == 3 and status["currentHealthy"] == 3
    assert (status["desiredHealthy"], status["disruptionsAllowed"]) == (desired, allowed)
    assert status["observedGeneration"] == made.json()["metadata"]["generation"]
    condition = status["conditions"][0]
    assert (condition["type"], condition["status"]) == ("DisruptionAllowed", "True")


async def test_budget_status_follows_pods_as_they_change(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    running(sim, pod, "t-0")
    await client.post(BUDGETS, json=budget(minAvailable=1))
    assert status_of(sim)["disruptionsAllowed"] == 0
    running(sim, pod, "t-1")
    assert status_of(sim)["disruptionsAllowed"] == 1
    sim.store.patch("pods", "t-1", {"status": {"conditions": READY[:0]}}, subresource="status")
    assert status_of(sim)["currentHealthy"] == 1
    assert status_of(sim)["conditions"][0]["reason"] == "InsufficientPods"


async def test_a_pod_relabelled_out_of_a_budget_and_a_finished_one_leave_its_count(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    for name in ("t-0", "t-1", "t-2"):
        running(sim, pod, name)
    await client.post(BUDGETS, json=budget(minAvailable=1))
    sim.store.patch("pods", "t-0", {"metadata": {"labels": {"app": "serve"}}})
    assert status_of(sim)["expectedPods"] == 2
    sim.store.patch("pods", "t-1", {"status": {"phase": "Succeeded"}}, subresource="status")
    assert (status_of(sim)["expectedPods"], status_of(sim)["disruptionsAllowed"]) == (1, 0)


async def test_a_budget_with_both_bounds_is_invalid(client: httpx.AsyncClient) -> None:
    response = await client.post(BUDGETS, json=budget(minAvailable=1, maxUnavailable=1))
    assert response.status_code == 422
    assert "minAvailable and maxUnavailable cannot be both set" in response.json()["message"]


async def test_a_budget_without_selector_covers_no_pod(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    running(sim, pod, "t-0")
    body = budget(minAvailable=1)
    del body["spec"]["selector"]
    await client.post(BUDGETS, json=body)
    assert status_of(sim)["expectedPods"] == 0


# -- eviction ------------------------------------------------------------------------------


async def test_an_allowed_eviction_is_201_and_a_graceful_deletion_spending_the_budget(
    sim: SimApiServer, core: k8s.CoreV1Api, pod: Manifest
) -> None:
    for name in ("t-0", "t-1"):
        running(sim, pod, name)
    sim.store.create("poddisruptionbudgets", budget(minAvailable=1), namespace="default")
    body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name="t-0", namespace="default"))
    await core.create_namespaced_pod_eviction("t-0", "default", body)
    evicted = sim.store.get("pods", "t-0", namespace="default")
    assert evicted["metadata"]["deletionGracePeriodSeconds"] == 30
    status = status_of(sim)
    assert (status["disruptionsAllowed"], status["currentHealthy"]) == (0, 1)


async def test_a_budget_that_forbids_it_answers_429_with_the_disruption_budget_cause(
    sim: SimApiServer, client: httpx.AsyncClient, core: k8s.CoreV1Api, pod: Manifest
) -> None:
    running(sim, pod, "t-0")
    sim.store.create("poddisruptionbudgets", budget(minAvailable=1), namespace="default")
    response = await evict(client, "t-0")
    assert response.status_code == 429
    body = response.json()
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget train needs 1 healthy pods and has 1 currently",
        }
    ]
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_pod_eviction("t-0", "default", k8s.V1Eviction())
    assert caught.value.status == 429
    assert "deletionTimestamp" not in sim.store.get("pods", "t-0")["metadata"]


async def test_the_second_eviction_sees_the_first_as_a_disruption(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    for name in ("t-0", "t-1", "t-2"):
        running(sim, pod, name)
    sim.store.create("poddisruptionbudgets", budget(maxUnavailable=1), namespace="default")
    assert (await evict(client, "t-0")).status_code == 201
    assert (await evict(client, "t-1")).status_code == 429


async def test_an_evicted_pod_is_recorded_in_disrupted_pods_until_it_is_marked(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    for name in ("t-0", "t-1"):
        running(sim, pod, name)
    sim.store.create("poddisruptionbudgets", budget(minAvailable=1), namespace="default")
    versions = str(sim.store.resource_version)
    assert (await evict(client, "t-0")).status_code == 201
    async with sim.store.watch("poddisruptionbudgets", resource_version=versions) as events:
        first = await anext(events)
    assert "t-0" in first["object"]["status"]["disruptedPods"]
    assert "disruptedPods" not in status_of(sim)


async def test_a_pod_covered_by_two_budgets_cannot_be_evicted(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    running(sim, pod, "t-0")
    running(sim, pod, "t-1")
    for name in ("one", "two"):
        made = budget(name, maxUnavailable=1)
        sim.store.create("poddisruptionbudgets", made, namespace="default")
    response = await evict(client, "t-0")
    assert response.status_code == 500
    assert response.json()["message"] == (
        "Internal error occurred: This pod has more than one PodDisruptionBudget, which the "
        "eviction subresource does not support."
    )


async def test_pending_and_finished_pods_are_evicted_without_asking_the_budget(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    sim.store.create("pods", pod("waiting", metadata={"labels": {"app": "train"}}))
    running(sim, pod, "done")
    sim.store.patch("pods", "done", {"status": {"phase": "Succeeded"}}, subresource="status")
    sim.store.create("poddisruptionbudgets", budget(minAvailable=5), namespace="default")
    for name in ("waiting", "done"):
        assert (await evict(client, name)).status_code == 201
    assert sim.store.list("pods") == []


async def test_an_unready_pod_may_go_while_the_budget_is_met(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    running(sim, pod, "t-0")
    running(sim, pod, "sick", ready=False)
    sim.store.create("poddisruptionbudgets", budget(minAvailable=1), namespace="default")
    assert status_of(sim)["disruptionsAllowed"] == 0
    assert (await evict(client, "sick")).status_code == 201


async def test_eviction_honours_grace_and_uid_precondition(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    running(sim, pod, "t-0")
    wrong = await evict(client, "t-0", preconditions={"uid": "not-it"})
    assert wrong.status_code == 409
    assert (await evict(client, "t-0", gracePeriodSeconds=0)).status_code == 201
    assert sim.store.list("pods") == []


async def test_evicting_a_missing_pod_is_404_and_a_mismatched_name_400(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    assert (await evict(client, "ghost")).status_code == 404
    running(sim, pod, "t-0")
    response = await client.post(f"{PODS}/t-0/eviction", json=eviction("t-1"))
    assert response.status_code == 400
    assert response.json()["message"] == "name in URL does not match name in Eviction object"
