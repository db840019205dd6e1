"""Watch streams: replay, bookmarks, 410, selector transitions, timeouts and slow watchers."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver

pytestmark = pytest.mark.anyio

Loader = Callable[[str], Any]
Lines = Callable[[str], list[Any]]
Eventually = Callable[..., Awaitable[None]]
Manifest = Callable[..., dict[str, Any]]
Opener = Callable[[str], contextlib.AbstractAsyncContextManager[Any]]
PODS = "/api/v1/namespaces/default/pods"


def _names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


async def test_watch_from_zero_sends_state_as_added_then_live_events(
    sim: SimApiServer, open_watch: Opener, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    async with open_watch(f"{PODS}?watch=true&resourceVersion=0") as events:
        assert _names([await events.next()]) == [("ADDED", "a")]
        sim.store.create("pods", pod("b"))
        sim.store.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}})
        sim.store.delete("pods", "b")
        live = await events.take(3)
    assert _names(live) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert all(e["object"]["kind"] == "Pod" and e["object"]["apiVersion"] == "v1" for e in live)


async def test_watch_from_a_version_replays_only_later_changes(
    sim: SimApiServer, open_watch: Opener, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    since = sim.store.resource_version
    sim.store.create("pods", pod("b"))
    sim.store.delete("pods", "a")
    async with open_watch(f"{PODS}?watch=1&resourceVersion={since}") as events:
        assert _names(await events.take(2)) == [("ADDED", "b"), ("DELETED", "a")]


async def test_deleted_event_carries_the_deletion_version(
    sim: SimApiServer, open_watch: Opener, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    async with open_watch(f"{PODS}?watch=1&resourceVersion={sim.store.resource_version}") as events:
        sim.store.delete("pods", "a")
        event = await events.next()
    assert event["type"] == "DELETED"
    assert event["object"]["metadata"]["resourceVersion"] == str(sim.store.resource_version)


async def test_too_old_version_gets_an_error_event_with_http_200(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, jsonl: Lines
) -> None:
    for index in range(3):
        sim.store.create("pods", pod(f"p{index}"))
    sim.faults.expire_before()
    response = await client.get(PODS, params={"watch": "1", "resourceVersion": "2"})
    assert response.status_code == 200
    (expected,) = jsonl("watch-error-410.jsonl")
    expected["object"]["message"] = f"too old resource version: 2 ({sim.store.resource_version})"
    assert response.json() == expected


async def test_window_overflow_expires_old_versions(pod: Manifest) -> None:
    async with run_apiserver(options=ApiOptions(watch_window=3)) as sim:
        start = sim.store.resource_version
        for index in range(5):
            sim.store.create("pods", pod(f"p{index}"))
        async with httpx.AsyncClient(base_url=sim.url) as client:
            old = await client.get(PODS, params={"watch": "1", "resourceVersion": str(start)})
            assert old.json()["object"]["code"] == 410
            recent = sim.store.resource_version - 2
            params = {"watch": "1", "resourceVersion": str(recent), "timeoutSeconds": "1"}
            replay = await client.get(PODS, params=params)
    assert next(line for line in replay.text.splitlines() if line).startswith('{"type":"ADDED"')


async def test_bookmarks_are_sent_when_allowed(
    sim: SimApiServer, open_watch: Opener, jsonl: Lines
) -> None:
    async with open_watch(f"{PODS}?watch=1&allowWatchBookmarks=true&resourceVersion=0") as events:
        event = await events.next()
    expected = next(e for e in jsonl("watch-pods.jsonl") if e["type"] == "BOOKMARK")
    expected["object"]["metadata"]["resourceVersion"] = str(sim.store.resource_version)
    assert event == expected


async def test_no_bookmarks_unless_asked(sim: SimApiServer, client: httpx.AsyncClient) -> None:
    response = await client.get(PODS, params={"watch": "1", "timeoutSeconds": "1"})
    assert response.text == ""


async def test_timeout_seconds_ends_the_stream(open_watch: Opener) -> None:
    async with open_watch(f"{PODS}?watch=1&timeoutSeconds=1") as events:
        assert await events.ended(timeout=3)


async def test_send_initial_events_ends_with_an_annotated_bookmark(
    sim: SimApiServer, open_watch: Opener, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    query = (
        "watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
    )
    async with open_watch(f"{PODS}?{query}") as events:
        added, bookmark = await events.take(2)
    assert added["type"] == "ADDED" and bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_label_selector_watch_turns_transitions_into_added_and_deleted(
    sim: SimApiServer, open_watch: Opener, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a", metadata={"labels": {"gpu": "yes"}}))
    version = sim.store.resource_version
    async with open_watch(
        f"{PODS}?watch=1&labelSelector=gpu%3Dyes&resourceVersion={version}"
    ) as events:
        sim.store.patch("pods", "a", {"metadata": {"labels": {"gpu": "no"}}})
        sim.store.patch("pods", "a", {"metadata": {"labels": {"gpu": "yes"}}})
        gone, back = await events.take(2)
    assert gone["type"] == "DELETED" and back["type"] == "ADDED"
    assert gone["object"]["metadata"]["labels"] == {"gpu": "yes"}
    assert int(gone["object"]["metadata"]["resourceVersion"]) == version + 1


async def test_field_selector_watch_sees_binding_as_deleted_from_unbound_view(
    sim: SimApiServer, open_watch: Opener, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    async with open_watch(f"{PODS}?watch=1&fieldSelector=spec.nodeName%3D") as events:
        assert (await events.next())["type"] == "ADDED"
        sim.store.bind("a", "gpu-a")
        assert (await events.next())["type"] == "DELETED"


async def test_binding_sets_node_and_annotations_in_one_modified_event(
    client: httpx.AsyncClient, sim: SimApiServer, open_watch: Opener, pod: Manifest, fixture: Loader
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "ml-team"}})
    uid = sim.store.create("pods", pod("trainer-0", namespace="ml-team"))["metadata"]["uid"]
    binding = fixture("binding-request.json")
    binding["metadata"]["uid"] = uid
    path = "/api/v1/namespaces/ml-team/pods"
    async with open_watch(f"{path}?watch=1&resourceVersion={sim.store.resource_version}") as events:
        assert (await client.post(f"{path}/trainer-0/binding", json=binding)).status_code == 201
        sim.store.patch(
            "pods", "trainer-0", {"metadata": {"labels": {"after": "bind"}}}, namespace="ml-team"
        )
        first, second = await events.take(2)
    assert first["type"] == "MODIFIED"
    assert first["object"]["spec"]["nodeName"] == "gpu-node-1"
    assert first["object"]["metadata"]["annotations"] == {
        "hami.io/lupine-endpoint": "10.0.3.50:50051"
    }
    assert second["object"]["metadata"]["labels"] == {"after": "bind"}


async def test_namespaced_watch_ignores_other_namespaces(
    sim: SimApiServer, open_watch: Opener, pod: Manifest
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "other"}})
    async with open_watch(f"{PODS}?watch=1&resourceVersion={sim.store.resource_version}") as events:
        sim.store.create("pods", pod("elsewhere", namespace="other"))
        sim.store.create("pods", pod("here"))
        assert _names([await events.next()]) == [("ADDED", "here")]


async def test_cut_watches_ends_every_stream(
    sim: SimApiServer, open_watch: Opener, eventually: Eventually
) -> None:
    async with (
        open_watch(f"{PODS}?watch=1") as first,
        open_watch("/api/v1/nodes?watch=1") as second,
    ):
        await eventually(lambda: sim.faults.to_dict()["openWatches"] == 2)
        sim.faults.cut_watches()
        assert await first.ended() and await second.ended()
    await eventually(lambda: sim.faults.to_dict()["openWatches"] == 0)


async def test_client_disconnect_unregisters_the_watcher(
    sim: SimApiServer, open_watch: Opener, eventually: Eventually
) -> None:
    async with open_watch(f"{PODS}?watch=1"):
        await eventually(lambda: sim.faults.to_dict()["openWatches"] == 1)
    await eventually(lambda: sim.faults.to_dict()["openWatches"] == 0)


@pytest.fixture
def options() -> ApiOptions:
    return ApiOptions(bookmark_interval_seconds=0.05, watch_buffer=20)


async def test_slow_watcher_is_cut_without_blocking_writers(
    sim: SimApiServer, open_watch: Opener, pod: Manifest, eventually: Eventually
) -> None:
    async with open_watch(f"{PODS}?watch=1&resourceVersion={sim.store.resource_version}") as events:
        await eventually(lambda: sim.faults.to_dict()["openWatches"] == 1)
        for index in range(500):
            sim.store.create("pods", pod(f"p{index}"))
        await eventually(lambda: sim.faults.to_dict()["openWatches"] == 0)
        assert await events.ended()
    assert len(sim.store.list("pods")) == 500


async def test_in_process_store_watch_yields_events(sim: SimApiServer, pod: Manifest) -> None:
    sim.store.create("pods", pod("a"))
    async with sim.store.watch("pods", namespace="default") as events:
        first = await anext(events)
        sim.store.delete("pods", "a")
        second = await anext(events)
    assert (first["type"], second["type"]) == ("ADDED", "DELETED")
    assert sim.faults.to_dict()["openWatches"] == 0
