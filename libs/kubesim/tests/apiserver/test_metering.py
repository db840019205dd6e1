"""Requests and response bytes counted by client, verb and resource, as an operator reads
kube-apiserver's request metrics, over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from rgpu_kubesim import RequestCount, RequestKey, SimApiServer

pytestmark = pytest.mark.anyio

PODS = "/api/v1/namespaces/default/pods"
POD = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "m", "image": "x:1"}]}}


def key(verb: str, resource: str = "pods", client: str = "bench") -> RequestKey:
    return RequestKey(client=client, verb=verb, resource=resource)


async def test_requests_are_counted_by_user_agent_verb_and_resource_with_body_bytes(
    sim: SimApiServer,
) -> None:
    async with httpx.AsyncClient(base_url=sim.url, headers={"User-Agent": "bench/1.0"}) as c:
        created = await c.post(PODS, json=POD)
        listed = await c.get(PODS)
        await c.get(f"{PODS}/p")
        await c.get(f"{PODS}/missing")
    counts = sim.meter.snapshot()
    assert counts[key("create")] == RequestCount(requests=1, bytes=len(created.content))
    assert counts[key("list")] == RequestCount(requests=1, bytes=len(listed.content))
    assert counts[key("get")].requests == 2


async def test_watch_bytes_count_as_events_are_sent_and_other_paths_are_not_counted(
    sim: SimApiServer,
) -> None:
    sim.store.create("pods", {**POD, "metadata": {"name": "p", "namespace": "default"}})
    async with httpx.AsyncClient(base_url=sim.url, headers={"User-Agent": "w"}) as c:
        await c.get("/healthz")
        await c.get("/api/v1")
        response = await c.get(PODS, params={"watch": "True", "timeoutSeconds": "1"})
    counts = sim.meter.snapshot()
    assert set(counts) == {key("watch", client="w")}
    assert counts[key("watch", client="w")].bytes == len(response.content) > 0
