"""Failures at the process boundary become our errors and values, never library exceptions."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from rgpu_allocator.policy import Policy
from rgpu_allocator.settings import AllocatorSettings
from rgpu_contracts import Fleet
from rgpu_placement import FleetView
from rgpu_runtime.errors import Unavailable, UpstreamError
from rgpu_runtime.feeds import DiscoveryMirror, Follower, FollowPolicy
from rgpu_runtime.peers import http_client

pytestmark = [pytest.mark.anyio, pytest.mark.process]


def client_for(handler) -> httpx.AsyncClient:
    return http_client(
        base_url="http://discovery.test", timeout=1.0, transport=httpx.MockTransport(handler)
    )


def fleet_follower(http: httpx.AsyncClient, wait: float = 30.0) -> Follower[Fleet]:
    discovery = DiscoveryMirror(FleetView.build, topology_keys=())
    fleet, _ = discovery.followers(http, policy=FollowPolicy(wait_seconds=wait))
    return fleet


async def test_unreachable_discovery_is_unavailable_naming_the_fleet():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with client_for(refuse) as http:
        with pytest.raises(Unavailable, match="/v1/fleet") as caught:
            await fleet_follower(http).poll_once()
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


async def test_garbage_from_discovery_is_an_upstream_error_naming_the_field():
    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"revision": "x", "observedAt": 1, "servers": []})

    async with client_for(garbage) as http:
        with pytest.raises(UpstreamError, match="revision"):
            await fleet_follower(http).poll_once()


async def test_long_poll_asks_discovery_to_hold_and_waits_longer_than_it(build):
    seen: list[httpx.Request] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        revision = 7 if len(seen) == 1 else 8
        return httpx.Response(200, json=build.fleet(build.server("a"), revision=revision).to_dict())

    async with client_for(answer) as http:
        follower = fleet_follower(http, wait=0.5)
        await follower.poll_once()
        await follower.poll_once()
    assert follower.status.revision == 8
    assert seen[1].url.params["since"] == "7"
    assert seen[1].url.params["wait"] == "0.5"
    assert seen[1].extensions["timeout"]["read"] == 5.5


async def test_claims_query_parameters_are_checked(build, kit, sim):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        since = await client.get("/v1/claims", params={"since": "abc"})
        wait = await client.get("/v1/claims", params={"since": "1", "wait": "600"})
    assert since.status_code == 400
    assert "since='abc'" in since.json()["message"]
    assert wait.status_code == 400
    assert "wait='600'" in wait.json()["message"]


async def test_readyz_turns_ready_once_the_caches_are_listed(build, kit, sim):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 200


def test_bad_setting_stops_the_process_naming_the_key():
    done = subprocess.run(
        [sys.executable, "-m", "rgpu_allocator"],
        env={"RGPU_GRANULARITY": "rack", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "RGPU_GRANULARITY" in done.stderr
    assert "rack" in done.stderr
    assert "Traceback" not in done.stderr


def test_settings_for_the_allocator_read_every_key_it_uses():
    settings = AllocatorSettings.from_env(
        {
            "RGPU_GRANULARITY": "card",
            "RGPU_BOOKING_TTL_SECONDS": "12",
            "RGPU_NAMESPACE": "gpu-system",
            "RGPU_SCHEDULER_NAME": "my-scheduler",
        },
        service="allocator",
    )
    policy = Policy.from_settings(settings)
    assert (policy.granularity, policy.ttl, policy.namespace, policy.scheduler_name) == (
        "card",
        12.0,
        "gpu-system",
        "my-scheduler",
    )
