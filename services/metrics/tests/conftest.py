"""Fixtures for the metrics service: contract builders, fake peers at the transport, the app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import anyio
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

import rgpu_testkit as testkit
from rgpu_contracts import (
    Card,
    Claim,
    ClaimSet,
    Fleet,
    Server,
)
from rgpu_metrics import FollowPolicy, create_app
from rgpu_runtime.settings import Settings
from rgpu_testkit import eventually

T = TypeVar("T", Fleet, ClaimSet)

MIB = 1 << 20


class Make:
    """The kit's builders for the contract values the sources serve; defaults make a healthy
    server."""

    @staticmethod
    def card(server: str, index: int, *, healthy: bool = True, memory_mib: int = 40960) -> Card:
        return testkit.card(server=server, index=index, healthy=healthy, memory_mib=memory_mib)

    @staticmethod
    def server(
        name: str,
        *,
        cards: int = 4,
        ready: bool = True,
        reachable: bool = True,
        busy: Iterable[int] = (),
        unhealthy: Iterable[int] = (),
        endpoint: str | None = "10.0.0.1:14833",
    ) -> Server:
        return testkit.server(
            name=name,
            cards=cards,
            ready=ready,
            reachable=reachable,
            busy=busy,
            unhealthy=unhealthy,
            endpoint=endpoint,
        )

    @staticmethod
    def fleet(*servers: Server, revision: int = 1) -> Fleet:
        return testkit.fleet(servers=servers, revision=revision)

    @staticmethod
    def claim(
        server: str,
        indices: Iterable[int],
        *,
        state: str = "bound",
        pod: str = "train-0",
        namespace: str = "team-a",
        booked_at: float = 1.0,
    ) -> Claim:
        ref = testkit.pod_ref(name=pod, namespace=namespace, uid=f"uid-{namespace}-{pod}")
        return testkit.claim(
            server=server, cards=indices, pod=ref, state=state, booked_at=booked_at
        )

    @staticmethod
    def claims(*claims: Claim, revision: int = 1) -> ClaimSet:
        return testkit.claim_set(claims=claims, revision=revision)


@pytest.fixture
def make() -> Make:
    return Make()


Mode = Literal["up", "down", "error"]


class FakeSource(Generic[T]):
    """A peer's long-poll endpoint at the transport: counts requests, can go away.

    A request with ``since`` equal to the current revision is held until the value changes,
    the mode changes, or ``wait`` passes, as discovery and the allocator do.
    """

    def __init__(self, value: T | None) -> None:
        self.value = value
        self.mode: Mode = "up" if value is not None else "down"
        self.requests: list[httpx.Request] = []
        self._changed: anyio.Event | None = None

    def publish(self, value: T) -> None:
        self.value = value
        self.set_mode("up")

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        since = request.url.params.get("since")
        if self._holds(since):
            self._changed = self._changed or anyio.Event()
            with anyio.move_on_after(float(request.url.params["wait"])):
                await self._changed.wait()
        if self.mode == "down" or self.value is None:
            raise httpx.ConnectError("connection refused", request=request)
        if self.mode == "error":
            return httpx.Response(503, json={"code": "unavailable", "message": "restarting"})
        return httpx.Response(200, content=orjson.dumps(self.value.to_dict()))

    def _holds(self, since: str | None) -> bool:
        current = self.value
        return (
            since is not None
            and self.mode == "up"
            and current is not None
            and (int(since) == current.revision)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Peers:
    discovery: FakeSource[Fleet]
    allocator: FakeSource[ClaimSet]


@pytest.fixture
def peers(make: Make) -> Peers:
    fleet = make.fleet(make.server("gpu-a"))
    return Peers(discovery=FakeSource(fleet), allocator=FakeSource(make.claims()))


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env(
        {"RGPU_DISCOVERY_URL": "http://discovery", "RGPU_ALLOCATOR_URL": "http://allocator"},
        service="metrics",
    )


@pytest.fixture
def policy() -> FollowPolicy:
    # A long wait: held polls are released by the fake peers' events, never by a timer, so
    # request counts only move when a test changes something.
    return FollowPolicy(
        wait_seconds=30.0,
        margin_seconds=2.0,
        min_interval_seconds=0.0,
        backoff_initial_seconds=0.01,
        backoff_cap_seconds=0.05,
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


OpenClient = Callable[[], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def open_client(
    settings: Settings, peers: Peers, policy: FollowPolicy, registry: CollectorRegistry
) -> OpenClient:
    """Start the app (lifespan included) when the test chooses, e.g. after setting up peers."""

    @asynccontextmanager
    async def start() -> AsyncIterator[httpx.AsyncClient]:
        app = create_app(
            settings,
            discovery_transport=httpx.MockTransport(peers.discovery.handle),
            allocator_transport=httpx.MockTransport(peers.allocator.handle),
            registry=registry,
            policy=policy,
        )
        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://metrics") as http:
                yield http

    return start


@pytest.fixture
async def client(open_client: OpenClient) -> AsyncIterator[httpx.AsyncClient]:
    async with open_client() as http:
        yield http


@pytest.fixture
def until() -> Callable[[Callable[[], Awaitable[bool]]], Awaitable[None]]:
    return eventually


Families = dict[str, Metric]


async def scrape(http: httpx.AsyncClient, *, openmetrics: bool = False) -> Families:
    """Scrape ``/metrics`` and parse it with prometheus_client's own parser for the format."""
    accept = "application/openmetrics-text; version=1.0.0" if openmetrics else ""
    response = await http.get("/metrics", headers={"accept": accept})
    assert response.status_code == 200
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    return {family.name: family for family in parse(response.text)}


@pytest.fixture
def scraper() -> Callable[..., Awaitable[Families]]:
    return scrape


async def _ready(http: httpx.AsyncClient) -> bool:
    return (await http.get("/readyz")).status_code == 200


@pytest.fixture
async def ready_client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The app once both fake peers have answered."""
    await eventually(lambda: _ready(client))
    return client
