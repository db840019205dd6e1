"""Guarded routes admit only callers TokenReview confirms, for this service's audience, and
the route's allow-list names; tokens that cannot be for this service cost no review, and the
reviews the rest cost are budgeted.

Each test runs a real app (LifespanManager + ASGITransport) whose guard reviews tokens with the
simulated apiserver over real HTTP; callers get their tokens through TokenRequest, as the
services do in the simulated cluster.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.kube import KubeClient, kube_client
from rgpu_runtime.peers import (
    ALLOCATOR_AUDIENCE,
    CALLER_AUTH_STATE,
    DISCOVERY_AUDIENCE,
    BearerAuth,
    CallerAuth,
    TokenRequestSource,
    bearer_auth,
    caller_auth,
    http_client,
    require_caller,
)
from rgpu_runtime.peers._authguard import VerdictCache, Verdicts, caller_of
from rgpu_runtime.peers._tokencheck import ReviewBudget
from rgpu_runtime.serving import Listener, create_service_app, json_response, running
from rgpu_runtime.settings import Settings

kubesim = pytest.importorskip("rgpu_kubesim")

pytestmark = pytest.mark.anyio

NS = "rgpu-system"
EXTENDER = f"system:serviceaccount:{NS}:rgpu-extender"
ALLOCATOR = f"system:serviceaccount:{NS}:rgpu-allocator"


@dataclass
class FakeClock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    sim: Any
    kube: KubeClient
    clock: FakeClock

    def source(self, account: str = "rgpu-extender", **kwargs: Any) -> TokenRequestSource:
        kwargs.setdefault("audience", ALLOCATOR_AUDIENCE)
        return TokenRequestSource(self.kube, namespace=NS, account=account, **kwargs)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    clock = FakeClock()
    async with kubesim.run_apiserver(options=kubesim.ApiOptions(clock=clock)) as sim:
        sim.store.create("namespaces", {"metadata": {"name": NS}})
        for name in ("rgpu-extender", "rgpu-allocator", "intruder"):
            sim.store.create("serviceaccounts", {"metadata": {"name": name, "namespace": NS}})
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="allocator")
        async with kube_client(settings, timeout=2.0) as kube:
            yield Cluster(sim=sim, kube=kube, clock=clock)


async def book(request: Request) -> Response:
    caller = caller_of(request.scope)
    return json_response({"caller": None if caller is None else caller.username})


def guarded_app(auth: CallerAuth) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        yield {CALLER_AUTH_STATE: auth}

    guard = [require_caller("allocation")]
    routes = [Route("/v1/allocations", book, methods=["POST"], middleware=guard)]
    open_route = Route("/v1/fleet", book, methods=["GET"])
    return create_service_app(service="allocator", routes=[*routes, open_route], lifespan=lifespan)


@asynccontextmanager
async def serving(
    auth: CallerAuth, client_auth: httpx.Auth | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    async with LifespanManager(guarded_app(auth)) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://allocator", auth=client_auth
        ) as client:
            yield client


def auth_for(cluster: Cluster, **settings: str) -> CallerAuth:
    env = {"RGPU_KUBE_URL": cluster.sim.url, "RGPU_ALLOCATION_CALLERS": EXTENDER, **settings}
    return caller_auth(
        Settings.from_env(env, service="allocator"),
        cluster.kube,
        routes=("allocation",),
        clock=cluster.clock,
    )


async def test_a_confirmed_allowed_caller_gets_through_and_is_named(cluster: Cluster) -> None:
    async with serving(auth_for(cluster), BearerAuth(cluster.source())) as client:
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"caller": EXTENDER}


async def test_a_request_without_a_token_is_refused_with_401_naming_the_fix(
    cluster: Cluster,
) -> None:
    async with serving(auth_for(cluster)) as client:
        reply = await client.post("/v1/allocations")
        unguarded = await client.get("/v1/fleet")
    assert reply.status_code == 401
    body = reply.json()
    assert body["code"] == "unauthorized"
    assert "Authorization: Bearer" in body["message"] and "RGPU_TOKEN_DIR" in body["message"]
    assert unguarded.status_code == 200


async def test_a_token_for_another_audience_is_refused_with_401(cluster: Cluster) -> None:
    source = cluster.source(audience="https://kubernetes.default.svc.cluster.local")
    async with serving(auth_for(cluster), BearerAuth(source)) as client:
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 401
    assert "audience" in reply.json()["message"]


async def test_a_garbage_or_oversized_token_is_refused_with_401(cluster: Cluster) -> None:
    async with serving(auth_for(cluster)) as client:
        forged = await client.post("/v1/allocations", headers={"Authorization": "Bearer a.b.c"})
        huge = await client.post(
            "/v1/allocations", headers={"Authorization": "Bearer " + "x" * 20000}
        )
    assert (forged.status_code, huge.status_code) == (401, 401)
    assert "longer than" in huge.json()["message"]


async def test_an_expired_token_is_refused_with_401(cluster: Cluster) -> None:
    token = await cluster.source(seconds=600).token()
    cluster.clock.now += 601
    async with serving(auth_for(cluster)) as client:
        reply = await client.post("/v1/allocations", headers={"Authorization": f"Bearer {token}"})
    assert reply.status_code == 401
    assert "expired" in reply.json()["message"]


async def test_a_confirmed_account_not_on_the_allow_list_gets_403_naming_it_and_the_setting(
    cluster: Cluster,
) -> None:
    async with serving(auth_for(cluster), BearerAuth(cluster.source("intruder"))) as client:
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 403
    message = reply.json()["message"]
    assert f"system:serviceaccount:{NS}:intruder may not POST /v1/allocations" in message
    assert EXTENDER in message and "RGPU_ALLOCATION_CALLERS" in message


async def test_tokenreview_down_is_503_retryable_never_a_pass(cluster: Cluster) -> None:
    cluster.sim.faults.set_error(verb="create", resource="tokenreviews", rate=1.0, code=503)
    async with serving(auth_for(cluster), BearerAuth(cluster.source())) as client:
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 503
    assert reply.json()["retryable"] is True
    assert "TokenReview is unreachable" in reply.json()["message"]


def tokenreviews_asked(cluster: Cluster) -> int:
    counts = cluster.sim.meter.snapshot().items()
    return sum(c.requests for k, c in counts if k.resource == "tokenreviews" and k.verb == "create")


async def test_a_throttled_tokenreview_is_asked_again_and_the_caller_gets_through(
    cluster: Cluster,
) -> None:
    source = cluster.source()
    await source.token()
    cluster.sim.faults.set_error(verb="create", resource="tokenreviews", rate=1.0, code=429)

    async def lift_after_the_first_refusal() -> None:
        while tokenreviews_asked(cluster) < 1:
            await anyio.sleep(0.005)
        cluster.sim.faults.set_error(verb="create", resource="tokenreviews", rate=0.0)

    auth = auth_for(cluster)
    async with serving(auth, BearerAuth(source)) as client, anyio.create_task_group() as tg:
        tg.start_soon(lift_after_the_first_refusal)
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 200, reply.text
    assert tokenreviews_asked(cluster) >= 2


async def test_a_cached_verdict_is_reused_within_the_ttl_without_tokenreview(
    cluster: Cluster,
) -> None:
    auth = auth_for(cluster, RGPU_AUTH_CACHE_SECONDS="60")
    async with serving(auth, BearerAuth(cluster.source())) as client:
        assert (await client.post("/v1/allocations")).status_code == 200
        cluster.sim.faults.set_error(verb="create", resource="tokenreviews", rate=1.0, code=503)
        cluster.clock.now += 59
        assert (await client.post("/v1/allocations")).status_code == 200
        cluster.clock.now += 2
        assert (await client.post("/v1/allocations")).status_code == 503


async def test_a_cached_verdict_never_outlives_the_tokens_own_expiry(cluster: Cluster) -> None:
    auth = auth_for(cluster, RGPU_AUTH_CACHE_SECONDS="86400")
    token = await cluster.source(seconds=600).token()
    headers = {"Authorization": f"Bearer {token}"}
    async with serving(auth) as client:
        assert (await client.post("/v1/allocations", headers=headers)).status_code == 200
        cluster.clock.now += 601
        reply = await client.post("/v1/allocations", headers=headers)
    assert reply.status_code == 401


async def test_the_cache_is_keyed_by_hash_and_bounded_in_size(cluster: Cluster) -> None:
    cache = VerdictCache(max_entries=2)
    auth = CallerAuth(
        kube=cluster.kube,
        audience=ALLOCATOR_AUDIENCE,
        allowed={"allocation": (EXTENDER,)},
        cache_seconds=60.0,
        clock=cluster.clock,
        verdicts=Verdicts(confirmed=cache),
    )
    tokens = [await cluster.source(seconds=600 + i).token() for i in range(3)]
    async with serving(auth) as client:
        for token in tokens:
            reply = await client.post(
                "/v1/allocations", headers={"Authorization": f"Bearer {token}"}
            )
            assert reply.status_code == 200
    assert len(cache) == 2
    keys = list(cache._entries)
    assert all(len(key) == 32 and key not in {t.encode() for t in tokens} for key in keys)


async def test_an_empty_allow_list_refuses_everyone_and_warns_at_start(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    auth = auth_for(cluster, RGPU_ALLOCATION_CALLERS="")
    assert any("RGPU_ALLOCATION_CALLERS is empty" in r.getMessage() for r in caplog.records)
    async with serving(auth, BearerAuth(cluster.source())) as client:
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 403
    assert "this route's callers are nobody" in reply.json()["message"]


async def test_auth_none_admits_anyone_and_warns_at_start(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    auth = auth_for(cluster, RGPU_AUTH="none")
    assert any("RGPU_AUTH=none" in r.getMessage() for r in caplog.records)
    async with serving(auth) as client:
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 200
    assert reply.json() == {"caller": None}


async def test_a_caller_configured_by_settings_reaches_a_guarded_route_over_loopback(
    cluster: Cluster, tmp_path: Path
) -> None:
    # What the kubelet would project: one token per audience, named for it.
    (tmp_path / ALLOCATOR_AUDIENCE).write_text(await cluster.source().token())
    caller = Settings.from_env({"RGPU_TOKEN_DIR": str(tmp_path)}, service="extender")
    auth = bearer_auth(caller, audience=ALLOCATOR_AUDIENCE)
    assert auth is not None
    app = guarded_app(auth_for(cluster))
    async with running(app, Listener(listen="127.0.0.1:0")) as (url,):
        client = http_client(base_url=url, timeout=5.0)
        client.auth = auth
        async with client:
            reply = await client.post("/v1/allocations")
    assert reply.status_code == 200
    assert reply.json() == {"caller": EXTENDER}


# -- one audience per receiving service, one allow-list per route ---------------------------------


async def test_a_token_for_another_rgpu_service_is_refused_without_a_review(
    cluster: Cluster,
) -> None:
    # The allocator's token as discovery receives it, replayed at the allocator.
    replayed = cluster.source("rgpu-allocator", audience=DISCOVERY_AUDIENCE)
    auth = auth_for(cluster, RGPU_ALLOCATION_CALLERS=f"{EXTENDER},{ALLOCATOR}")
    async with serving(auth, BearerAuth(replayed)) as client:
        reply = await client.post("/v1/allocations")
    assert reply.status_code == 401
    assert "do not include 'rgpu-allocator'" in reply.json()["message"]
    assert auth.reviews == 0


async def test_a_confirmed_caller_of_another_route_is_refused_with_403(cluster: Cluster) -> None:
    env = {"RGPU_KUBE_URL": cluster.sim.url, "RGPU_PROBE_CALLERS": ALLOCATOR}
    settings = Settings.from_env(env, service="discovery")
    auth = caller_auth(settings, cluster.kube, routes=("probe",), clock=cluster.clock)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        yield {CALLER_AUTH_STATE: auth}

    guard = [require_caller("probe")]
    probe = Route("/v1/servers/{name}/probe", book, methods=["POST"], middleware=guard)
    app = create_service_app(service="discovery", routes=[probe], lifespan=lifespan)
    extender = cluster.source("rgpu-extender", audience=DISCOVERY_AUDIENCE)
    allocator = cluster.source("rgpu-allocator", audience=DISCOVERY_AUDIENCE)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://discovery") as client:
            refused = await client.post("/v1/servers/a/probe", auth=BearerAuth(extender))
            allowed = await client.post("/v1/servers/a/probe", auth=BearerAuth(allocator))
    assert refused.status_code == 403
    assert "RGPU_PROBE_CALLERS" in refused.json()["message"]
    assert allowed.json() == {"caller": ALLOCATOR}


def test_an_unknown_route_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="expected one of allocation, probe"):
        require_caller("bookings")


# -- what a flood of made-up tokens costs ---------------------------------------------------------


async def test_3000_random_tokens_cost_no_tokenreview(cluster: Cluster) -> None:
    auth = auth_for(cluster)
    async with serving(auth) as client:
        for n in range(3000):
            token = f"{n:x}.{n * 7919:x}.{n * 104729:x}" if n % 2 else f"random-{n}"
            reply = await client.post(
                "/v1/allocations", headers={"Authorization": f"Bearer {token}"}
            )
            assert reply.status_code == 401
    assert auth.reviews == 0 and tokenreviews_asked(cluster) == 0


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def forged(n: int, exp: float, audience: str = ALLOCATOR_AUDIENCE) -> str:
    """A JWT-shaped token claiming this service's audience, signed by nobody."""

    def part(value: object) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(value)).rstrip(b"=").decode()

    claims = {"aud": [audience], "exp": int(exp), "sub": EXTENDER, "jti": n}
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


async def test_3000_forged_tokens_of_our_audience_cost_a_bounded_number_of_reviews(
    cluster: Cluster,
) -> None:
    auth = auth_for(cluster)
    # The budget's clock stands still: what the flood may spend is the burst, exactly.
    auth.budget = ReviewBudget(rate=10.0, burst=20, wait_seconds=0.0, clock=lambda: 0.0)
    honest = await cluster.source().token()
    async with serving(auth) as client:
        assert (await client.post("/v1/allocations", headers=bearer(honest))).is_success
        statuses: dict[int, int] = {}
        for n in range(3000):
            token = forged(n, cluster.clock.now + 3600)
            reply = await client.post(
                "/v1/allocations", headers={"Authorization": f"Bearer {token}"}
            )
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
        # The honest caller's confirmed verdict survived the flood of refusals.
        kept = await client.post("/v1/allocations", headers={"Authorization": f"Bearer {honest}"})
    assert kept.status_code == 200
    assert set(statuses) <= {401, 503}
    assert auth.reviews == 20  # the honest caller's review, and 19 of the flood
    assert statuses == {401: 19, 503: 3000 - 19}
    assert len(auth.verdicts.refused) == 19


async def test_an_unjudged_token_waits_briefly_for_the_review_budget_then_gets_503(
    cluster: Cluster,
) -> None:
    auth = auth_for(cluster)
    auth.budget = ReviewBudget(rate=1.0, burst=1, wait_seconds=0.2)
    async with serving(auth) as client:
        first = forged(1, cluster.clock.now + 3600)
        second = forged(2, cluster.clock.now + 3600)
        assert (
            await client.post("/v1/allocations", headers={"Authorization": f"Bearer {first}"})
        ).status_code == 401
        reply = await client.post("/v1/allocations", headers={"Authorization": f"Bearer {second}"})
    assert reply.status_code == 503
    assert reply.json()["retryable"] is True
    assert "TokenReviews a second" in reply.json()["message"]
