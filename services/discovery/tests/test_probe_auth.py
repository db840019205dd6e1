"""Only the allocator may make discovery probe a server on demand (docs/design.md §10), tried as an
attacker would: against discovery's real loopback listener, with tokens minted by the simulated
apiserver's TokenRequest and judged by its TokenReview. No token, another audience, an expired
token: 401; a real account not on ``RGPU_PROBE_CALLERS``: 403 naming it. The fleet and the
topology stay open to anyone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from rgpu_discovery import create_app
from rgpu_kubesim import ApiOptions, run_apiserver
from rgpu_runtime.serving import Listener, running
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

NAMESPACE = "rgpu-system"
ALLOCATOR = f"system:serviceaccount:{NAMESPACE}:rgpu-allocator"
INTRUDER = f"system:serviceaccount:{NAMESPACE}:intruder"
APISERVER_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
PROBE = "/v1/servers/gpu-a/probe"


@dataclass
class FakeClock:
    """The simulated apiserver's wall clock: tokens are issued and expire by it."""

    now: float

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    url: str
    sim_url: str
    clock: FakeClock


@pytest.fixture
async def served(make_settings) -> AsyncIterator[Served]:
    clock = FakeClock(now=time.time())
    async with run_apiserver(options=ApiOptions(clock=clock)) as sim:
        sim.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        for account in ("rgpu-allocator", "intruder"):
            meta = {"name": account, "namespace": NAMESPACE}
            sim.store.create("serviceaccounts", {"metadata": meta})
        app = create_app(make_settings(RGPU_KUBE_URL=sim.url))
        async with running(app, Listener(listen="127.0.0.1:0")) as (url,):
            await ready(url)
            yield Served(url=url, sim_url=sim.url, clock=clock)


async def ready(url: str) -> None:
    """Wait for ``/readyz``: the fleet and topology are served from the first Node list on."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def answered() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await eventually(answered, timeout=5.0, what="discovery's /readyz answering 200")


async def probe(served: Served, auth: httpx.Auth | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url, timeout=10, auth=auth) as client:
        return await client.post(PROBE)


async def test_a_probe_without_a_token_is_refused_with_401_naming_the_fix(served):
    got = await probe(served)
    assert got.status_code == 401, got.text
    assert got.json()["code"] == "unauthorized"
    assert "Authorization: Bearer" in got.json()["message"]


async def test_a_token_for_another_audience_is_refused_with_401(served, token_caller):
    async with token_caller(served.sim_url, audience=APISERVER_AUDIENCE) as auth:
        got = await probe(served, auth)
    assert got.status_code == 401, got.text
    assert "audience" in got.json()["message"]


async def test_an_expired_token_is_refused_with_401(served, token_caller):
    async with token_caller(served.sim_url, seconds=600) as auth:
        await auth.source.token()  # minted now, expiring in ten minutes
        served.clock.now += 601
        got = await probe(served, auth)
    assert got.status_code == 401, got.text
    assert "expired" in got.json()["message"]


async def test_a_confirmed_account_not_allowed_is_refused_with_403_naming_it(served, token_caller):
    async with token_caller(served.sim_url, account="intruder") as auth:
        got = await probe(served, auth)
    assert got.status_code == 403, got.text
    message = got.json()["message"]
    assert message.startswith(f"{INTRUDER} may not ")
    assert ALLOCATOR in message
    assert "RGPU_PROBE_CALLERS" in message


async def test_the_allocators_token_reaches_the_probe(served, token_caller):
    async with token_caller(served.sim_url) as auth:
        got = await probe(served, auth)
    # Past the guard: the fleet is empty, so the server is unknown.
    assert got.status_code == 404, got.text


async def test_the_fleet_and_topology_stay_open_without_a_token(served):
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as anyone:
        fleet = await anyone.get("/v1/fleet")
        topology = await anyone.get("/v1/topology")
    assert fleet.status_code == 200, fleet.text
    assert topology.status_code == 200, topology.text
