"""Fault injection: seeded error rates, Retry-After, latency, cut watches, expiry, /_sim/faults."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest

from rgpu_kubesim import ApiOptions, FaultSpecError, SimApiServer, run_apiserver

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]
Eventually = Callable[..., Awaitable[None]]
PODS = "/api/v1/namespaces/default/pods"


async def _codes(client: httpx.AsyncClient, count: int) -> list[int]:
    return [(await client.get(PODS)).status_code for _ in range(count)]


async def _fault_sequence(seed: int) -> list[int]:
    async with run_apiserver(options=ApiOptions(seed=seed)) as sim:
        sim.faults.set_error(verb="list", resource="pods", rate=0.5, code=503)
        async with httpx.AsyncClient(base_url=sim.url) as client:
            return await _codes(client, 30)


async def test_error_rate_is_deterministic_by_seed() -> None:
    first, again, other = (
        await _fault_sequence(1),
        await _fault_sequence(1),
        await _fault_sequence(2),
    )
    assert first == again and first != other
    assert set(first) == {200, 503}


async def test_full_error_rate_fails_every_matching_request_only(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    sim.faults.set_error(verb="list", resource="pods", rate=1.0, code=500)
    failed = await client.get(PODS)
    assert failed.status_code == 500 and failed.json()["reason"] == "InternalError"
    assert (await client.get("/api/v1/nodes")).status_code == 200
    assert (await client.get(f"{PODS}/missing")).status_code == 404


async def test_429_carries_retry_after(client: httpx.AsyncClient, sim: SimApiServer) -> None:
    sim.faults.set_error(rate=1.0, code=429, retry_after=3)
    response = await client.get("/api/v1/nodes")
    assert response.status_code == 429 and response.headers["Retry-After"] == "3"
    assert response.json()["reason"] == "TooManyRequests"
    assert response.json()["details"] == {"retryAfterSeconds": 3}


async def test_an_error_rule_lets_the_first_requests_it_skips_through(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    sim.faults.set_error(verb="list", resource="pods", rate=1.0, code=429, skip=2)
    assert await _codes(client, 4) == [200, 200, 429, 429]
    sim.faults.set_error(verb="list", resource="pods", rate=1.0, code=429, skip=1)
    assert await _codes(client, 2) == [200, 429]
    with pytest.raises(FaultSpecError, match="skip"):
        sim.faults.set_error(rate=1.0, skip=-1)


async def test_plural_rule_covers_subresources_but_specific_rule_wins(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    sim.faults.set_error(resource="pods", rate=1.0, code=503)
    sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=500)
    binding = {"metadata": {"name": "a"}, "target": {"name": "n"}}
    assert (await client.post(f"{PODS}/a/binding", json=binding)).status_code == 500
    assert (await client.get(f"{PODS}/a/status")).status_code == 503


async def test_faulted_write_changes_nothing(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    before = sim.store.resource_version
    sim.faults.set_error(verb="create", rate=1.0, code=503)
    assert (await client.post(PODS, json=pod("a"))).status_code == 503
    assert sim.store.resource_version == before


async def test_latency_delays_matching_requests(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    sim.faults.set_latency(verb="get", seconds=0.3)
    started = anyio.current_time()
    await client.get("/api/v1/namespaces/default")
    slow = anyio.current_time() - started
    started = anyio.current_time()
    await client.get("/api/v1/namespaces")
    assert slow >= 0.3 and anyio.current_time() - started < 0.3


async def test_clear_removes_errors_and_latency(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    sim.faults.set_error(rate=1.0)
    sim.faults.set_latency(seconds=1)
    sim.faults.clear()
    assert (await client.get(PODS)).status_code == 200
    assert sim.faults.to_dict()["errors"] == [] and sim.faults.to_dict()["latencies"] == []


async def test_expire_before_makes_old_watch_versions_410(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    old = sim.store.resource_version
    sim.store.create("pods", pod("a"))
    sim.faults.expire_before(sim.store.resource_version)
    response = await client.get(PODS, params={"watch": "1", "resourceVersion": str(old)})
    assert response.json()["type"] == "ERROR" and response.json()["object"]["code"] == 410


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda f: f.set_error(rate=1.5), "rate"),
        (lambda f: f.set_error(rate=0.5, code=302), "code"),
        (lambda f: f.set_error(rate=0.5, retry_after=-1), "retry_after"),
        (lambda f: f.set_latency(seconds=-1), "seconds"),
    ],
)
async def test_invalid_fault_settings_name_the_field(
    sim: SimApiServer, call: Callable[[Any], None], field: str
) -> None:
    with pytest.raises(FaultSpecError, match=field):
        call(sim.faults)


async def test_http_control_sets_shows_and_replaces_faults(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    body = {
        "errors": [{"verb": "list", "resource": "pods", "rate": 1, "code": 429, "retryAfter": 2}],
        "latencies": [{"verb": "get", "seconds": 0.01}],
    }
    shown = (await client.post("/_sim/faults", json=body)).json()
    assert shown["errors"] == [
        {"verb": "list", "resource": "pods", "rate": 1.0, "code": 429, "retryAfter": 2, "skip": 0}
    ]
    assert shown["latencies"] == [{"verb": "get", "resource": "*", "seconds": 0.01}]
    assert (await client.get(PODS)).status_code == 429
    replaced = (await client.put("/_sim/faults", json={"latencies": []})).json()
    assert replaced["errors"] == [] and (await client.get(PODS)).status_code == 200
    assert (await client.get("/_sim/faults")).json() == replaced


async def test_http_control_cuts_watches_and_expires_versions(
    client: httpx.AsyncClient, sim: SimApiServer, eventually: Eventually
) -> None:
    async with client.stream("GET", PODS, params={"watch": "1"}) as stream:
        await eventually(lambda: sim.faults.to_dict()["openWatches"] == 1)
        await client.post("/_sim/faults", json={"cutWatches": True, "expireBefore": None})
        assert [line async for line in stream.aiter_lines() if line] == []
    assert sim.faults.to_dict()["expiredBefore"] == sim.store.resource_version


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"errors": [{"rate": "high"}]}, "errors[0].rate must be a number"),
        ({"errors": {"rate": 1}}, "errors must be a list of objects"),
        ({"latencies": [{"seconds": 1, "verb": ""}]}, "latencies[0].verb"),
        ({"expireBefore": "soon"}, "expireBefore must be an integer"),
        ([], "expects a JSON object"),
    ],
)
async def test_http_control_rejects_bad_bodies_with_the_field(
    client: httpx.AsyncClient, body: Any, fragment: str
) -> None:
    response = await client.post("/_sim/faults", json=body)
    assert response.status_code == 400 and fragment in response.json()["message"]


async def test_an_audit_watch_sees_every_change_through_cuts_expiry_and_a_full_buffer() -> None:
    async with run_apiserver(options=ApiOptions(watch_buffer=2)) as sim:
        body = {"metadata": {"name": "cm-0"}, "data": {}}
        sim.store.create("configmaps", body, namespace="default")
        version = str(sim.store.resource_version)
        async with (
            sim.store.watch("configmaps", resource_version=version, audit=True) as audited,
            sim.store.watch("configmaps", resource_version=version) as plain,
        ):
            for i in range(1, 6):
                sim.store.create(
                    "configmaps", {"metadata": {"name": f"cm-{i}"}}, namespace="default"
                )
            sim.faults.expire_before()
            sim.faults.cut_watches()
            seen = [(await anext(audited))["object"]["metadata"]["name"] for _ in range(5)]
            assert [e async for e in plain] == []
    assert seen == [f"cm-{i}" for i in range(1, 6)]
