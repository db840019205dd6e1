"""Only the extender may book, commit and release
(docs/design.md#services-authenticate-each-other), tried as an attacker would: against the
allocator's real loopback listener, with tokens minted by the simulated apiserver's
TokenRequest and judged by its TokenReview.

No token, a token for another audience, an expired token: 401. A token of a real account that
is not on ``RGPU_ALLOCATION_CALLERS``: 403 naming it. None of them books anything; reads and dry
runs stay open; the extender's own token gets through.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from rgpu_allocator import create_app
from rgpu_kubesim import ApiOptions, run_apiserver
from rgpu_runtime.serving import Listener, running

pytestmark = pytest.mark.anyio

EXTENDER = "system:serviceaccount:rgpu-system:rgpu-extender"
INTRUDER = "system:serviceaccount:rgpu-system:intruder"
APISERVER_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


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
async def served(build, kit) -> AsyncIterator[Served]:
    clock = FakeClock(now=time.time())
    options = ApiOptions(bookmark_interval_seconds=0.2, clock=clock)
    async with run_apiserver(options=options) as sim:
        kit.prepare(sim)
        discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
        settings = kit.settings_for(sim.url)
        app = create_app(settings, discovery_transport=discovery.transport)
        async with running(app, Listener(listen="127.0.0.1:0")) as (url,):
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                await kit.wait_fleet(client)
            yield Served(url=url, sim_url=sim.url, clock=clock)


WRITES = [
    ("POST", "/v1/allocations"),
    ("POST", "/v1/allocations/u-1/commit"),
    ("DELETE", "/v1/allocations/u-1"),
]


def body_for(build, kit, path: str) -> object:
    if path.endswith("/commit"):
        return {"node": "client-1"}
    return kit.ask(build.pod("p", uid="u-1"), build.container()) if path == WRITES[0][1] else None


async def send(served: Served, method: str, path: str, body: object, auth=None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url, timeout=10, auth=auth) as client:
        return await client.request(method, path, json=body)


async def held(served: Served) -> list[object]:
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
        return (await client.get("/v1/claims")).json()["claims"]


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_a_write_without_a_token_is_refused_with_401_naming_the_fix(
    build, kit, served, method, path
):
    got = await send(served, method, path, body_for(build, kit, path))
    assert got.status_code == 401, got.text
    assert got.json()["code"] == "unauthorized"
    assert "Authorization: Bearer" in got.json()["message"]
    assert await held(served) == []


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_a_token_for_another_audience_is_refused_with_401(build, kit, served, method, path):
    async with kit.caller(served.sim_url, audience=APISERVER_AUDIENCE) as auth:
        got = await send(served, method, path, body_for(build, kit, path), auth)
    assert got.status_code == 401, got.text
    assert "audience" in got.json()["message"]
    assert await held(served) == []


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_an_expired_token_is_refused_with_401(build, kit, served, method, path):
    async with kit.caller(served.sim_url, seconds=600) as auth:
        await auth.source.token()  # minted now, expiring in ten minutes
        served.clock.now += 601
        got = await send(served, method, path, body_for(build, kit, path), auth)
    assert got.status_code == 401, got.text
    assert "expired" in got.json()["message"]
    assert await held(served) == []


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_a_confirmed_account_not_allowed_is_refused_with_403_naming_it(
    build, kit, served, method, path
):
    async with kit.caller(served.sim_url, account="intruder") as auth:
        got = await send(served, method, path, body_for(build, kit, path), auth)
    assert got.status_code == 403, got.text
    message = got.json()["message"]
    assert message.startswith(f"{INTRUDER} may not ")
    assert EXTENDER in message
    assert "RGPU_ALLOCATION_CALLERS" in message
    assert await held(served) == []


async def test_the_extenders_token_books_commits_and_releases(build, kit, served):
    pod = build.pod("p", uid="u-1")
    async with (
        kit.caller(served.sim_url) as auth,
        httpx.AsyncClient(base_url=served.url, timeout=10, auth=auth) as extender,
    ):
        booked = await extender.post("/v1/allocations", json=kit.ask(pod, build.container()))
        committed = await extender.post("/v1/allocations/u-1/commit", json={"node": "client-1"})
        claims = await held(served)
        released = await extender.delete("/v1/allocations/u-1")
    assert booked.status_code == 200, booked.text
    assert committed.status_code == 200, committed.text
    assert [c["pod"]["uid"] for c in claims] == ["u-1"]  # type: ignore[index]
    assert released.status_code == 204
    assert await held(served) == []


async def test_reads_and_dry_runs_stay_open_without_a_token(build, kit, served):
    ask = kit.ask(build.pod("p", uid="u-1"), build.container(), dry_run=True)
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as anyone:
        dry_run = await anyone.post("/v1/allocations", json=ask)
        claims = await anyone.get("/v1/claims")
        lookup = await anyone.get("/v1/allocations/u-1")
        status = await anyone.get("/v1/status")
    assert dry_run.status_code == 200, dry_run.text
    assert dry_run.json()["server"] == "gpu-a"
    assert claims.status_code == 200
    assert lookup.status_code == 404
    assert status.status_code == 200
    assert await held(served) == []
