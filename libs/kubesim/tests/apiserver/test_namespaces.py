"""Namespace deletion over HTTP: Terminating, content removed, creates refused, then gone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from rgpu_kubesim import ApiOptions, SimApiServer

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]
NAMESPACES = "/api/v1/namespaces"
TEAM_PODS = "/api/v1/namespaces/team/pods"


@pytest.fixture
def options() -> ApiOptions:
    # Long enough that a test sees the Terminating window; the removal test shortens it.
    return ApiOptions(namespace_finalize_seconds=60)


@pytest.fixture
async def team(sim: SimApiServer, pod: Manifest) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "team"}})
    sim.store.create("pods", pod("a", namespace="team"))
    sim.store.create("pods", pod("b"))


async def test_delete_marks_the_namespace_terminating_and_removes_its_content(
    client: httpx.AsyncClient, sim: SimApiServer, team: None
) -> None:
    response = await client.delete(f"{NAMESPACES}/team")
    assert response.status_code == 200
    namespace = response.json()
    assert namespace["status"]["phase"] == "Terminating"
    assert namespace["metadata"]["deletionTimestamp"]
    assert namespace["spec"]["finalizers"] == ["kubernetes"]
    stored = (await client.get(f"{NAMESPACES}/team")).json()
    assert stored["status"]["phase"] == "Terminating"
    assert (await client.get(TEAM_PODS)).json()["items"] == []
    assert [p["metadata"]["name"] for p in sim.store.list("pods")] == ["b"]


async def test_creating_in_a_terminating_namespace_is_forbidden(
    client: httpx.AsyncClient, team: None, pod: Manifest
) -> None:
    await client.delete(f"{NAMESPACES}/team")
    response = await client.post(TEAM_PODS, json=pod("c", namespace="team"))
    assert response.status_code == 403
    status = response.json()
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        'pods "c" is forbidden: unable to create new content in namespace team because it is '
        "being terminated"
    )
    assert status["details"]["causes"][0]["reason"] == "NamespaceTerminating"


async def test_deleting_a_terminating_namespace_again_conflicts(
    client: httpx.AsyncClient, team: None
) -> None:
    await client.delete(f"{NAMESPACES}/team")
    again = await client.delete(f"{NAMESPACES}/team")
    assert again.status_code == 409 and "will automatically be purged" in again.json()["message"]


async def test_dry_run_delete_of_a_namespace_changes_nothing(
    client: httpx.AsyncClient, sim: SimApiServer, team: None
) -> None:
    response = await client.delete(f"{NAMESPACES}/team", params={"dryRun": "All"})
    assert response.json()["status"]["phase"] == "Terminating"
    assert sim.store.get("namespaces", "team")["status"]["phase"] == "Active"
    assert len(sim.store.list("pods", namespace="team")) == 1


async def _gone(client: httpx.AsyncClient, path: str) -> None:
    with anyio.fail_after(5):
        while (await client.get(path)).status_code != 404:
            await anyio.sleep(0.02)


@pytest.mark.parametrize("options", [ApiOptions(namespace_finalize_seconds=0.05)])
async def test_the_namespace_controller_finalizes_and_removes_it(
    client: httpx.AsyncClient, team: None, options: ApiOptions
) -> None:
    await client.delete(f"{NAMESPACES}/team")
    await _gone(client, f"{NAMESPACES}/team")
    created = await client.post(NAMESPACES, json={"metadata": {"name": "team"}})
    assert created.status_code == 201


@pytest.mark.parametrize("options", [ApiOptions(namespace_finalize_seconds=0.05)])
async def test_a_metadata_finalizer_holds_the_namespace_until_removed(
    client: httpx.AsyncClient, sim: SimApiServer, options: ApiOptions
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "held", "finalizers": ["x.io/hold"]}})
    await client.delete(f"{NAMESPACES}/held")
    path = f"{NAMESPACES}/held"
    with anyio.fail_after(5):
        while (await client.get(path)).json()["spec"].get("finalizers"):
            await anyio.sleep(0.02)
    assert (await client.get(path)).json()["status"]["phase"] == "Terminating"
    sim.store.patch("namespaces", "held", {"metadata": {"finalizers": None}})
    assert (await client.get(path)).status_code == 404


async def test_finalize_subresource_clears_the_kubernetes_finalizer_and_releases_it(
    client: httpx.AsyncClient, team: None
) -> None:
    terminating = (await client.delete(f"{NAMESPACES}/team")).json()
    terminating["spec"]["finalizers"] = []
    response = await client.put(f"{NAMESPACES}/team/finalize", json=terminating)
    assert response.status_code == 200 and "finalizers" not in response.json()["spec"]
    assert (await client.get(f"{NAMESPACES}/team")).status_code == 404


async def test_a_plain_update_cannot_drop_the_kubernetes_finalizer(
    client: httpx.AsyncClient, team: None
) -> None:
    namespace = (await client.get(f"{NAMESPACES}/team")).json()
    namespace["spec"]["finalizers"] = []
    response = await client.put(f"{NAMESPACES}/team", json=namespace)
    assert response.json()["spec"]["finalizers"] == ["kubernetes"]
