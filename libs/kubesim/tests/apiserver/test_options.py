"""Request options over HTTP: list/watch combinations kube refuses, streaming lists, dryRun."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

Manifest = Any
PODS = "/api/v1/namespaces/default/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


async def _invalid(response: httpx.Response, kind: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    status: dict[str, Any] = response.json()
    assert status["reason"] == "Invalid"
    assert status["message"].startswith(f'{kind}.meta.k8s.io "" is invalid: ')
    assert status["details"]["kind"] == kind and status["details"]["group"] == "meta.k8s.io"
    return status


@pytest.mark.parametrize(
    ("params", "field", "detail"),
    [
        (
            {"resourceVersionMatch": "Exact"},
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            {"resourceVersionMatch": "Exact", "resourceVersion": "0"},
            "resourceVersionMatch",
            'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
        ),
        (
            {"resourceVersionMatch": "Newest", "resourceVersion": "1"},
            "resourceVersionMatch",
            'Unsupported value: "Newest"',
        ),
        ({"sendInitialEvents": "true"}, "sendInitialEvents", "forbidden for list"),
    ],
)
async def test_list_option_combinations_kube_refuses_are_422(
    client: httpx.AsyncClient, params: dict[str, str], field: str, detail: str
) -> None:
    status = await _invalid(await client.get(PODS, params=params), "ListOptions")
    assert status["details"]["causes"][0]["field"] == field
    assert detail in status["message"]


@pytest.mark.parametrize(
    ("params", "detail"),
    [
        (
            {"sendInitialEvents": "true", "allowWatchBookmarks": "true"},
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ),
        (
            {"resourceVersionMatch": "NotOlderThan"},
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
        (
            {"sendInitialEvents": "true", "resourceVersionMatch": "Exact"},
            'Unsupported value: "Exact": supported values: "NotOlderThan"',
        ),
    ],
)
async def test_watch_option_combinations_kube_refuses_are_422(
    client: httpx.AsyncClient, params: dict[str, str], detail: str
) -> None:
    response = await client.get(PODS, params={"watch": "true", **params})
    status = await _invalid(response, "ListOptions")
    assert detail in status["message"]


async def test_streaming_list_without_bookmarks_is_a_400(client: httpx.AsyncClient) -> None:
    params = {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
    response = await client.get(PODS, params=params)
    assert response.status_code == 400 and "allowWatchBookmarks" in response.json()["message"]


async def test_streaming_list_sends_state_then_the_initial_events_end_bookmark(
    open_watch: Any, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    sim.store.create("pods", pod("b"))
    version = str(sim.store.resource_version)
    query = (
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        "&allowWatchBookmarks=true&resourceVersion="
    )
    async with open_watch(f"{PODS}?{query}") as reader:
        added = [await reader.next(), await reader.next()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in added] == [
            ("ADDED", "a"),
            ("ADDED", "b"),
        ]
        end = await reader.next()
        assert end["type"] == "BOOKMARK"
        assert end["object"]["metadata"]["resourceVersion"] == version
        assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        sim.store.create("pods", pod("c"))
        live = await reader.next()
        assert (live["type"], live["object"]["metadata"]["name"]) == ("ADDED", "c")


async def _quiet_after(client: httpx.AsyncClient, version: int) -> list[str]:
    """Event types a watch from ``version`` replays (a watch from the newest version is quiet)."""
    params = {"watch": "true", "resourceVersion": str(version), "timeoutSeconds": "1"}
    response = await client.get(PODS, params=params)
    return [orjson.loads(line)["type"] for line in response.text.splitlines() if line]


async def test_dry_run_create_answers_the_object_and_stores_nothing(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    before = sim.store.resource_version
    response = await client.post(PODS, params={"dryRun": "All"}, json=pod("a"))
    assert response.status_code == 201
    body = response.json()
    assert body["metadata"]["uid"] and "resourceVersion" not in body["metadata"]
    assert body["spec"]["schedulerName"] == "default-scheduler"
    assert (await client.get(f"{PODS}/a")).status_code == 404
    assert sim.store.resource_version == before
    assert await _quiet_after(client, before) == []


async def test_dry_run_create_is_still_validated(client: httpx.AsyncClient, pod: Manifest) -> None:
    bad = pod("a", spec={"containers": []})
    response = await client.post(PODS, params={"dryRun": "All"}, json=bad)
    assert response.status_code == 422 and "spec.containers" in response.json()["message"]


async def test_dry_run_update_patch_and_delete_change_nothing(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    stored = sim.store.create("pods", pod("a"))
    before = sim.store.resource_version
    changed = {**stored, "metadata": {**stored["metadata"], "labels": {"x": "1"}}}
    put = await client.put(f"{PODS}/a", params={"dryRun": "All"}, json=changed)
    assert put.status_code == 200 and put.json()["metadata"]["labels"] == {"x": "1"}
    patch = {"metadata": {"labels": {"y": "2"}}}
    patched = await client.patch(
        f"{PODS}/a", params={"dryRun": "All"}, content=orjson.dumps(patch), headers=MERGE
    )
    assert patched.status_code == 200 and patched.json()["metadata"]["labels"] == {"y": "2"}
    deleted = await client.delete(f"{PODS}/a", params={"dryRun": "All"})
    assert deleted.status_code == 200
    assert sim.store.get("pods", "a") == stored
    assert sim.store.resource_version == before
    assert await _quiet_after(client, before) == []


async def test_unknown_dry_run_value_is_refused_like_kube(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    response = await client.post(PODS, params={"dryRun": "Maybe"}, json=pod("a"))
    status = await _invalid(response, "CreateOptions")
    assert 'dryRun: Unsupported value: ["Maybe"]: supported values: "All"' in (status["message"])
    assert (await client.get(f"{PODS}/a")).status_code == 404


async def test_streaming_list_at_a_future_version_reports_too_large(
    client: httpx.AsyncClient,
) -> None:
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "resourceVersion": "99999",
    }
    response = await client.get(PODS, params=params)
    event = orjson.loads(response.text.splitlines()[0])
    assert event["type"] == "ERROR" and event["object"]["code"] == 504
