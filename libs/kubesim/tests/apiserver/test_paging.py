"""Paged and versioned lists over HTTP: every page from one version, Exact at a retained one."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

Manifest = Any
PODS = "/api/v1/namespaces/default/pods"


def _names(body: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


async def _rest(client: httpx.AsyncClient, token: str) -> tuple[list[str], set[str]]:
    names, versions = [], set()
    while token:
        page = (await client.get(PODS, params={"limit": 2, "continue": token})).json()
        names += _names(page)
        versions.add(page["metadata"]["resourceVersion"])
        token = page["metadata"].get("continue", "")
    return names, versions


async def test_pages_are_a_snapshot_of_the_first_pages_version(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    for index in range(6):
        sim.store.create("pods", pod(f"p{index}"))
    first = (await client.get(PODS, params={"limit": 2})).json()
    sim.store.create("pods", pod("p3a"))
    sim.store.delete("pods", "p4")
    sim.store.patch("pods", "p5", {"metadata": {"labels": {"late": "yes"}}})
    names, versions = await _rest(client, first["metadata"]["continue"])
    assert _names(first) + names == [f"p{i}" for i in range(6)]
    assert versions == {first["metadata"]["resourceVersion"]}
    last = (await client.get(f"{PODS}", params={"limit": 10})).json()
    assert "p3a" in _names(last) and "p4" not in _names(last)


async def test_items_on_later_pages_are_as_they_were_at_the_snapshot(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    for index in range(3):
        sim.store.create("pods", pod(f"p{index}"))
    first = (await client.get(PODS, params={"limit": 1})).json()
    sim.store.patch("pods", "p2", {"metadata": {"labels": {"late": "yes"}}})
    token = first["metadata"]["continue"]
    page = (await client.get(PODS, params={"limit": 5, "continue": token})).json()
    assert [p["metadata"].get("labels") for p in page["items"]] == [None, None]


async def test_expired_continue_token_is_410_with_a_token_for_the_latest_state(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    for index in range(3):
        sim.store.create("pods", pod(f"p{index}"))
    token = (await client.get(PODS, params={"limit": 1})).json()["metadata"]["continue"]
    sim.store.create("pods", pod("p1a"))
    sim.faults.expire_before()
    response = await client.get(PODS, params={"limit": 1, "continue": token})
    assert response.status_code == 410
    status = response.json()
    assert status["reason"] == "Expired"
    assert "inconsistent list" in status["message"]
    inconsistent = status["metadata"]["continue"]
    rest = (await client.get(PODS, params={"limit": 10, "continue": inconsistent})).json()
    assert _names(rest) == ["p1", "p1a", "p2"]
    assert rest["metadata"]["resourceVersion"] == str(sim.store.resource_version)


async def test_exact_match_serves_the_list_at_a_retained_version(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    version = str(sim.store.resource_version)
    sim.store.create("pods", pod("b"))
    sim.store.delete("pods", "a")
    params = {"resourceVersion": version, "resourceVersionMatch": "Exact"}
    body = (await client.get(PODS, params=params)).json()
    assert _names(body) == ["a"] and body["metadata"]["resourceVersion"] == version
    newer = {"resourceVersion": version, "resourceVersionMatch": "NotOlderThan"}
    assert _names((await client.get(PODS, params=newer)).json()) == ["b"]


async def test_paged_list_at_a_version_without_match_is_exact(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    version = str(sim.store.resource_version)
    sim.store.create("pods", pod("b"))
    body = (await client.get(PODS, params={"resourceVersion": version, "limit": 5})).json()
    assert _names(body) == ["a"]


async def test_exact_match_older_than_the_history_is_expired(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    version = str(sim.store.resource_version)
    sim.store.create("pods", pod("b"))
    sim.faults.expire_before()
    params = {"resourceVersion": version, "resourceVersionMatch": "Exact"}
    response = await client.get(PODS, params=params)
    assert response.status_code == 410 and response.json()["reason"] == "Expired"


async def test_exact_match_in_the_future_is_too_large(client: httpx.AsyncClient) -> None:
    params = {"resourceVersion": "99999", "resourceVersionMatch": "Exact"}
    assert (await client.get(PODS, params=params)).status_code == 504
