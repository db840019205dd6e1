"""The fuzz suite's stack and its one judge of a reply.

The four services run as their real ASGI apps in one process, wired to each other through
``httpx.ASGITransport`` and to kubesim (the apiserver) and a fake lupine server over real
loopback HTTP, as ``tests/test_cross_service.py`` wires them. One stack per test module: a fuzz
input that leaves a service broken must show up in the examples after it, so the state is
shared on purpose.

Every request goes through ``Stack.send``, which holds the properties the suite exists for: an
answer below 500 (an exception escaping the app is a 500), within a bound, and the service
still ready afterwards. A 5xx that matches a ``KnownBug`` (the endpoint, the exception type and
the function that raised it) is tolerated, so bugs owned by other packages keep the suite green
until they are fixed; each known bug's minimal reproduction runs as a strict xfail, which turns
red once the fix lands and says the entry must go.

Hypothesis runs under the ``rgpu-fuzz`` profile: derandomized with a bounded number of examples
for ``make test`` (``quick``, fewer, for ``make test-fast``); ``RGPU_FUZZ_PROFILE=long``
(``make fuzz``) runs many more, randomized.
"""

from __future__ import annotations

import copy
import json
import os
import traceback
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from hypothesis import HealthCheck, settings

import rgpu_allocator
import rgpu_discovery
import rgpu_extender
import rgpu_metrics
from rgpu_allocator.settings import AllocatorSettings
from rgpu_discovery.settings import DiscoverySettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import FakeLupine, SimApiServer, run_apiserver, run_lupine
from rgpu_runtime.settings import Settings


def _kind(service: str) -> type[Settings]:
    # Discovery, the allocator and the extender read settings of their own besides the shared.
    own: dict[str, type[Settings]] = {
        "allocator": AllocatorSettings,
        "discovery": DiscoverySettings,
        "extender": ExtenderSettings,
    }
    return own.get(service, Settings)


PROFILE_ENV = "RGPU_FUZZ_PROFILE"
PROFILES: Mapping[str, Mapping[str, Any]] = {
    # make test: the same inputs on every run (no database, derandomized), about a minute.
    "ci": {"derandomize": True, "max_examples": 60},
    # make test-fast: the same inputs as ci, fewer of them, for the edit-test loop.
    "quick": {"derandomize": True, "max_examples": 10},
    # make fuzz: fresh random inputs on every run, many more of them.
    "long": {"derandomize": False, "max_examples": 2000},
}
REPLY_SECONDS = 10.0
"""Longest any reply may take in process: above the extender's 4 s budget, far below a hang."""
SERVICES = ("discovery", "allocator", "extender", "metrics")
NAMESPACE = "ml-team"
POD = "trainer-0"
SERVER_NODE = "gpu-node-2"
CLIENT_NODES = ("gpu-node-1", "cpu-node-1")
GPUS = ("GPU-fuzz-0", "GPU-fuzz-1")


def _register_profiles() -> None:
    chosen = os.environ.get(PROFILE_ENV, "ci")
    if chosen not in PROFILES:
        raise pytest.UsageError(f"{PROFILE_ENV}={chosen!r}: expected one of {', '.join(PROFILES)}")
    settings.register_profile(
        "rgpu-fuzz",
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
        **PROFILES[chosen],
    )


_register_profiles()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long profile outlives the suite's per-test timeout; lift it for fuzz tests only."""
    if os.environ.get(PROFILE_ENV) != "long":
        return
    for item in items:
        if "tests/fuzz/" in item.nodeid:
            item.add_marker(pytest.mark.timeout(3600))


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One request to one service; ``route`` is the endpoint's template (``{uid}`` unfilled)."""

    service: str
    method: str
    route: str
    path: str = ""
    body: bytes | None = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    hold: float = 0.0
    """Seconds a valid long-poll may hold the request, on top of the reply bound."""

    @property
    def endpoint(self) -> str:
        return f"{self.method} {self.route}"


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownBug:
    """A 5xx the fuzz found in code this suite does not own, reported to its owner.

    It matches a request to the endpoint of ``minimal`` (the smallest input found, sent after
    ``before``) that raised ``raised`` (the exception's type name) from ``where``, the
    innermost frame of rgpu's code (``"rgpu_placement/_podreading.py:_problem"``), or that
    was answered ``raised`` (``"HTTP 502"``) with the ``ErrorBody`` code ``where``.
    """

    id: str
    reason: str
    raised: str
    where: str
    minimal: Request
    before: tuple[Request, ...] = ()
    every_endpoint: bool = False
    """The bug sits in the shared edge, before routing: any endpoint shows it."""

    def matches(self, request: Request, exc: BaseException) -> bool:
        return self._at(request) and (type(exc).__name__, raised_in(exc)) == (
            self.raised,
            self.where,
        )

    def answered(self, request: Request, response: httpx.Response) -> bool:
        if not self._at(request) or self.raised != f"HTTP {response.status_code}":
            return False
        try:
            return bool(response.json().get("code") == self.where)
        except ValueError:
            return False

    def _at(self, request: Request) -> bool:
        return self.every_endpoint or request.endpoint == self.minimal.endpoint


def raised_in(exc: BaseException) -> str:
    """``package/module.py:function`` of the innermost frame of rgpu's own code."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if "/src/rgpu_" in f.filename]
    if not ours:
        return "?"
    frame = ours[-1]
    return f"{frame.filename.rpartition('/src/')[2]}:{frame.name}"


def _pod_asking(quantity: str) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/remote-gpu": quantity}}
    return {
        "metadata": {"name": POD, "namespace": NAMESPACE, "uid": "fuzz-uid"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]},
    }


def _review(pod: Mapping[str, Any]) -> dict[str, Any]:
    request = {
        "uid": "fuzz-review",
        "operation": "CREATE",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "object": pod,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _extender(route: str, body: object) -> Request:
    return Request(service="extender", method="POST", route=route, body=json.dumps(body).encode())


def _booking(uid: str, namespace: str) -> Request:
    pod = {"uid": uid, "namespace": namespace, "name": POD}
    body = {"pod": pod, "containers": [{"name": "c", "count": 1}], "candidateNodes": ["n"]}
    return Request(
        service="allocator", method="POST", route="/v1/allocations", body=json.dumps(body).encode()
    )


LONG_UID = "u" * 70_000
FIXED_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        id="filter-quantity-digits",
        reason="a count quantity of 5000 digits reaches int() (4300-digit limit): ValueError",
        raised="ValueError",
        where="rgpu_placement/_podreading.py:_problem",
        minimal=_extender("/filter", {"Pod": _pod_asking("9" * 5000), "NodeNames": ["n"]}),
    ),
    KnownBug(
        id="mutate-quantity-digits",
        reason="a count quantity of 5000 digits reaches int() (4300-digit limit): ValueError",
        raised="ValueError",
        where="rgpu_placement/_podreading.py:_problem",
        minimal=_extender("/mutate", _review(_pod_asking("9" * 5000))),
    ),
    KnownBug(
        id="mutate-env-name-list",
        reason="an env entry whose name is a list is used as a set member: TypeError",
        raised="TypeError",
        where="rgpu_extender/container_env.py:<listcomp>",
        minimal=_extender(
            "/mutate",
            _review(
                {
                    **_pod_asking("1"),
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "i",
                                "env": [{"name": ["x"]}],
                                "resources": {"limits": {"nvidia.com/remote-gpu": "1"}},
                            }
                        ]
                    },
                }
            ),
        ),
    ),
    KnownBug(
        id="bind-long-uid",
        reason="a 70,000-character PodUID goes into the allocator URL: httpx InvalidURL",
        raised="InvalidURL",
        where="rgpu_extender/clients.py:_send",
        minimal=_extender(
            "/bind",
            {"PodName": POD, "PodNamespace": NAMESPACE, "PodUID": LONG_UID, "Node": "n"},
        ),
    ),
    KnownBug(
        id="prioritize-long-uid",
        reason="a 70,000-character pod uid goes into the allocator URL: httpx InvalidURL",
        raised="InvalidURL",
        where="rgpu_extender/clients.py:_send",
        minimal=_extender(
            "/prioritize",
            {"Pod": {**_pod_asking("1"), "metadata": {"uid": LONG_UID}}, "NodeNames": ["n"]},
        ),
    ),
    KnownBug(
        id="allocations-holder-namespace-too-long",
        reason="a claim booked with a 70,000-character namespace makes the next refusal's "
        "re-read of its holder (read_namespaced_pod) fail: 502 kube_invalid",
        raised="HTTP 502",
        where="kube_invalid",
        before=(_booking("fuzz-holder", "n" * 70_000),),
        minimal=_booking("fuzz-second", NAMESPACE),
    ),
    KnownBug(
        id="content-length-digits",
        reason="a Content-Length of 5000 digits reaches int() in the body limit: ValueError "
        "(uvicorn's httptools refuses such a header first; in process it is a 500)",
        raised="ValueError",
        where="rgpu_runtime/serving/_bodylimit.py:_declared_length",
        minimal=Request(
            service="discovery",
            method="GET",
            route="/v1/fleet",
            headers={"content-length": "9" * 5000},
        ),
        every_endpoint=True,
    ),
)
"""Every 5xx the fuzz has found, each now fixed: their minimal inputs are replayed as
regression tests (test_fuzz_known_bugs.py) that must answer below 500."""

KNOWN_BUGS: tuple[KnownBug, ...] = ()
"""5xx the fuzz tolerates while a fix is pending, each with its minimal input; empty now.
An entry added here must also be added to FIXED_BUGS once the fix lands."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each fixed bug's minimal input, replayed: it must be answered below 500 again."""
    if "fixed_bug" in metafunc.fixturenames:
        metafunc.parametrize("fixed_bug", [pytest.param(b, id=b.id) for b in FIXED_BUGS])


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """What the service answered, or the known bug that made it fail (``response`` None)."""

    response: httpx.Response | None
    known: KnownBug | None = None


class Failure(AssertionError):
    """A property the suite holds was broken: a 5xx, a hang, or a service no longer ready."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """The four running services, their clients and the pod the valid bodies are about."""

    sim: SimApiServer
    lupine: FakeLupine
    clients: Mapping[str, httpx.AsyncClient]
    pod: Mapping[str, Any]

    @property
    def uid(self) -> str:
        """The seeded pod's uid."""
        return str(self.pod["metadata"]["uid"])

    async def call(self, service: str, method: str, route: str, **fields: Any) -> Reply:
        """``send`` a ``Request`` built from its fields (test modules cannot import it)."""
        return await self.send(Request(service=service, method=method, route=route, **fields))

    async def send(self, request: Request, *, known: Sequence[KnownBug] = KNOWN_BUGS) -> Reply:
        """Send ``request`` and hold the suite's properties: no 5xx unless a known bug, an
        answer within the bound, the service still ready after."""
        reply = await self._answer(request, known)
        response = reply.response
        if response is not None and response.status_code >= 500:
            raise Failure(f"{request.endpoint} answered {response.status_code}: {response.text}")
        await self.ready(request.service, after=request.endpoint)
        return reply

    async def _answer(self, request: Request, known: Sequence[KnownBug]) -> Reply:
        bound = REPLY_SECONDS + request.hold
        try:
            with anyio.fail_after(bound):
                response = await self.clients[request.service].request(
                    request.method,
                    request.path or request.route,
                    content=request.body,
                    params=request.params,
                    headers=request.headers,
                )
        except TimeoutError as exc:
            raise Failure(f"{request.endpoint} did not answer within {bound} s") from exc
        except Exception as exc:  # the app raised: ServerErrorMiddleware answered 500
            bug = next((bug for bug in known if bug.matches(request, exc)), None)
            if bug is None:
                summary = "".join(traceback.format_exception(exc)[-6:])
                raise Failure(f"{request.endpoint} raised (a 500):\n{summary}") from exc
            return Reply(response=None, known=bug)
        if response.status_code >= 500:
            bug = next((bug for bug in known if bug.answered(request, response)), None)
            if bug is not None:
                return Reply(response=None, known=bug)
        return Reply(response=response)

    async def ready(self, service: str, *, after: str = "start") -> None:
        """Raise ``Failure`` unless ``service``'s ``/readyz`` answers 200."""
        with anyio.fail_after(REPLY_SECONDS):
            response = await self.clients[service].get("/readyz")
        if response.status_code != 200:
            raise Failure(f"{service} not ready after {after}: {response.text}")


def _node(name: str, *, server_port: int | None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "topology.rgpu.io/rack": "r1"}
    annotations = {}
    if server_port is not None:
        labels["hami.io/lupine-server"] = str(server_port)
        cards = [
            {
                "id": uuid,
                "index": index,
                "count": 10,
                "devmem": 40960,
                "devcore": 100,
                "type": "NVIDIA-A100-SXM4-40GB",
                "mode": "remote",
                "health": True,
            }
            for index, uuid in enumerate(GPUS)
        ]
        annotations["hami.io/node-nvidia-register"] = json.dumps(cards)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _seed(sim: SimApiServer, lupine: FakeLupine, filter_args: Mapping[str, Any]) -> dict[str, Any]:
    """Namespaces, a server node served by ``lupine``, two client nodes and the fixture pod."""
    for namespace in (NAMESPACE, "rgpu-system"):
        sim.store.create("namespaces", {"metadata": {"name": namespace}})
    sim.store.create("nodes", _node(SERVER_NODE, server_port=lupine.port))
    for name in CLIENT_NODES:
        sim.store.create("nodes", _node(name, server_port=None))
    pod = copy.deepcopy(dict(filter_args["Pod"]))
    pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    pod["metadata"]["name"] = POD
    pod.pop("status", None)
    return dict(sim.store.create("pods", pod, namespace=NAMESPACE))


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # One event loop for the module: the stack outlives each test; kubernetes-asyncio is
    # asyncio-only.
    return "asyncio"


@pytest.fixture(scope="module")
async def stack(load_fixture: Callable[[str], Any]) -> AsyncIterator[Stack]:
    """The four services against kubesim and a fake lupine, every one ready."""
    async with AsyncExitStack() as exits:
        sim = await exits.enter_async_context(run_apiserver())
        lupine = await exits.enter_async_context(run_lupine(gpus=GPUS, name=SERVER_NODE))
        pod = _seed(sim, lupine, load_fixture("k8s/extender-filter-args.json"))
        clients = await _start(exits, sim)
        stack = Stack(
            sim=sim,
            lupine=lupine,
            clients=clients,
            pod=pod,
        )
        await _warm(clients)
        yield stack
        # An input to one service may have broken another (the extender's reach the allocator).
        for service in SERVICES:
            await stack.ready(service, after="this module's inputs")


async def _warm(clients: Mapping[str, httpx.AsyncClient]) -> None:
    """Wait until every service is ready and the allocator holds the fleet: it turns ready
    before its first fleet and answers a booking 503 (retryable) until then, by design."""
    with anyio.fail_after(REPLY_SECONDS):
        for service in SERVICES:
            while (await clients[service].get("/readyz")).status_code != 200:
                await anyio.sleep(0.02)
        while not (await clients["allocator"].get("/v1/status")).json()["servers"]:
            await anyio.sleep(0.02)


async def _start(exits: AsyncExitStack, sim: SimApiServer) -> dict[str, httpx.AsyncClient]:
    # Authenticated as k8s/ deploys it: each service mints its own token, and the fuzzing
    # client carries the extender's, so the fuzz reaches the code behind the guards.
    env = {
        "RGPU_KUBE_URL": sim.url,
        "RGPU_LOG_FORMAT": "text",
        "RGPU_AUTH": "tokenreview",
        "RGPU_ALLOCATION_CALLERS": "system:serviceaccount:rgpu-system:rgpu-extender",
        "RGPU_PROBE_CALLERS": "system:serviceaccount:rgpu-system:rgpu-allocator",
    }
    for account in ("rgpu-allocator", "rgpu-extender"):
        sim.store.create(
            "serviceaccounts", {"metadata": {"name": account, "namespace": "rgpu-system"}}
        )

    def settings_for(service: str) -> Settings:
        return _kind(service).from_env(
            {**env, "RGPU_TOKEN_ACCOUNT": f"rgpu-{service}"}, service=service
        )

    async def serve(app: Any) -> httpx.ASGITransport:
        manager = await exits.enter_async_context(LifespanManager(app))
        return httpx.ASGITransport(app=manager.app)

    discovery = await serve(rgpu_discovery.create_app(settings_for("discovery")))
    allocator = await serve(
        rgpu_allocator.create_app(settings_for("allocator"), discovery_transport=discovery)
    )
    extender = await serve(
        rgpu_extender.create_app(
            settings_for("extender"),
            allocator_transport=allocator,
            discovery_transport=discovery,
        )
    )
    metrics = await serve(
        rgpu_metrics.create_app(
            settings_for("metrics"), discovery_transport=discovery, allocator_transport=allocator
        )
    )
    transports = dict(zip(SERVICES, (discovery, allocator, extender, metrics), strict=True))
    token = await _extender_token(sim.url)
    return {
        name: await exits.enter_async_context(
            httpx.AsyncClient(
                transport=transport,
                base_url=f"http://{name}",
                headers={"Authorization": f"Bearer {token}"},
            )
        )
        for name, transport in transports.items()
    }


async def _extender_token(sim_url: str) -> str:
    """The extender's token for the allocator, minted by TokenRequest (what its kubelet would
    project)."""
    path = "/api/v1/namespaces/rgpu-system/serviceaccounts/rgpu-extender/token"
    async with httpx.AsyncClient(base_url=sim_url, timeout=10) as api:
        answer = await api.post(path, json={"spec": {"audiences": ["rgpu-allocator"]}})
    token: str = answer.json()["status"]["token"]
    return token
