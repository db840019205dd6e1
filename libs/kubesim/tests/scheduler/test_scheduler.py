"""The kube-scheduler emulator against the simulated apiserver over HTTP and a fake extender
served by uvicorn on loopback, whose answers each test controls and whose bodies it checks."""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rgpu_kubesim import ApiError, SimApiServer, SimOptionError
from rgpu_kubesim.scheduler import PodRecord, SchedulerConfig, SchedulerEmulator
from rgpu_testkit import container_manifest, eventually, node_manifest, pod_manifest

pytestmark = pytest.mark.anyio

GPU = "nvidia.com/remote-gpu"
FAST: dict[str, Any] = {
    "initial_backoff_seconds": 0.05,
    "max_backoff_seconds": 0.2,
    "backoff_window_seconds": 0.01,
    "unschedulable_flush_seconds": 30.0,
    "http_timeout_seconds": 2.0,
}
QUIET = 0.15
"""How long a test watches for a retry that must not happen (many backoffs long)."""

Answer = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Call:
    verb: str
    body: dict[str, Any]
    at: float


@dataclass
class FakeExtender:
    """A scheduler extender whose answers the test sets per verb; it records every call."""

    sim: SimApiServer
    url: str = ""
    calls: list[Call] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.answers = {"filter": keep_all, "prioritize": no_scores, "bind": self.bind_in_sim}

    def bodies(self, verb: str) -> list[dict[str, Any]]:
        return [c.body for c in self.calls if c.verb == verb]

    def times(self, verb: str) -> list[float]:
        return [c.at for c in self.calls if c.verb == verb]

    async def bind_in_sim(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            self.sim.store.bind(
                body["PodName"], body["Node"], namespace=body["PodNamespace"], uid=body["PodUID"]
            )
        except ApiError as exc:
            return {"Error": str(exc)}
        return {"Error": ""}

    async def handle(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        body = await request.json()
        self.calls.append(Call(verb, body, time.monotonic()))
        answer = await self.answers[verb](body)
        return answer if isinstance(answer, Response) else JSONResponse(answer)


async def keep_all(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "Nodes": None,
        "NodeNames": body["NodeNames"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


async def no_scores(body: dict[str, Any]) -> list[dict[str, Any]]:
    return []


def refuse_all(reason: str = "1/4 CardBusyOnServer") -> Answer:
    async def answer(body: dict[str, Any]) -> dict[str, Any]:
        failed = dict.fromkeys(body["NodeNames"], reason)
        return {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": None,
            "Error": "",
        }

    return answer


def error(message: str = "remote GPU inventory not synced yet") -> Answer:
    async def answer(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": None,
            "FailedAndUnresolvableNodes": None,
            "Error": message,
        }

    return answer


def keep_only(*names: str) -> Answer:
    async def answer(body: dict[str, Any]) -> dict[str, Any]:
        kept = [n for n in body["NodeNames"] if n in names]
        failed = {n: "1/4 CardBusyOnServer" for n in body["NodeNames"] if n not in names}
        return {"Nodes": None, "NodeNames": kept, "FailedNodes": failed, "Error": ""}

    return answer


def scores(**by_node: int) -> Answer:
    async def answer(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"Host": n, "Score": by_node.get(n, 0)} for n in body["NodeNames"]]

    return answer


def sequence(*answers: Answer) -> Answer:
    """Answer with each in turn, then keep using the last."""
    remaining = list(answers)

    async def answer(body: dict[str, Any]) -> Any:
        current = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        return await current(body)

    return answer


def status(code: int) -> Answer:
    async def answer(body: dict[str, Any]) -> Response:
        return Response("boom", status_code=code)

    return answer


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on an ephemeral loopback port until the block exits."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only then, and
    # without it every answer stalls ~40 ms on Nagle + delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, ws="none")
    server = _Server(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(5):
                while True:
                    if server.started:
                        break
                    await anyio.sleep(0.005)
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


@dataclass
class _Dispatch:
    """Routes the shared server's requests to the current test's FakeExtender."""

    target: FakeExtender | None = None

    async def handle(self, request: Request) -> Response:
        assert self.target is not None, "no FakeExtender is installed"
        return await self.target.handle(request)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def extender_server() -> AsyncIterator[tuple[str, _Dispatch]]:
    """One uvicorn for the module: its graceful shutdown costs 0.2 s, too much per test."""
    dispatch = _Dispatch()
    app = Starlette(routes=[Route("/{verb}", dispatch.handle, methods=["POST"])])
    async with serve(app) as url:
        yield url, dispatch


@pytest.fixture
def extender(sim: SimApiServer, extender_server: tuple[str, _Dispatch]) -> FakeExtender:
    url, dispatch = extender_server
    fake = FakeExtender(sim, url=url)
    dispatch.target = fake
    return fake


Start = Callable[..., contextlib.AbstractAsyncContextManager[SchedulerEmulator]]


@pytest.fixture
def scheduler(client: httpx.AsyncClient, extender: FakeExtender) -> Start:
    """start(**config) -> async context manager running a SchedulerEmulator."""

    @contextlib.asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[SchedulerEmulator]:
        config = SchedulerConfig(extender_url=extender.url, **{**FAST, **overrides})
        emulator = SchedulerEmulator(config, client)
        async with anyio.create_task_group() as tg:
            await tg.start(emulator.run)
            yield emulator
            tg.cancel_scope.cancel()

    return start


def make_node(
    name: str,
    *,
    ready: str = "True",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    return node_manifest(
        name=name, ready=ready, labels=labels, taints=taints or (), unschedulable=unschedulable
    )


def make_pod(
    name: str,
    *,
    gpus: int | None = 1,
    scheduler_name: str = "rgpu-scheduler",
    spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = None if gpus is None else {GPU: str(gpus)}
    return pod_manifest(
        name=name,
        scheduler=scheduler_name,
        annotations=annotations or {},
        containers=[container_manifest(image="registry.local/cuda-app:1", limits=limits)],
        spec=spec,
    )


def add_nodes(sim: SimApiServer, *names: str) -> None:
    for name in names:
        sim.store.create("nodes", make_node(name))


def add_pod(sim: SimApiServer, name: str, **kwargs: Any) -> str:
    return str(sim.store.create("pods", make_pod(name, **kwargs))["metadata"]["uid"])


def node_of(sim: SimApiServer, name: str) -> str | None:
    node: str | None = sim.store.get("pods", name, namespace="default")["spec"].get("nodeName")
    return node


async def refused_once(emulator: SchedulerEmulator, uid: str) -> PodRecord:
    await eventually(lambda: uid in emulator.records and emulator.records[uid].refusals)
    return emulator.records[uid]


async def stays(check: Callable[[], bool], seconds: float = QUIET) -> bool:
    """True when ``check`` holds for the whole period."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not check():
            return False
        await anyio.sleep(0.01)
    return True


# -- the wire, as kube-scheduler speaks it -----------------------------------------------------


async def test_filter_body_has_kube_schedulers_shape_and_strips_type_meta_and_managed_fields(
    sim: SimApiServer,
    extender: FakeExtender,
    scheduler: Start,
    fixture: Callable[[str], Any],
) -> None:
    add_nodes(sim, "node-a", "node-b")
    manifest = make_pod("trainer")
    manifest["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    sim.store.create("pods", manifest)
    async with scheduler():
        await eventually(lambda: node_of(sim, "trainer"))
    reference = fixture("extender-filter-args.json")
    body = extender.bodies("filter")[0]
    assert list(body) == list(reference)
    assert body["Nodes"] is None
    assert body["NodeNames"] == ["node-a", "node-b"]
    assert set(body["Pod"]) == set(reference["Pod"])
    assert "managedFields" not in body["Pod"]["metadata"]
    assert body["Pod"]["metadata"]["name"] == "trainer"
    assert body["Pod"]["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}


async def test_bind_and_prioritize_bodies_match_kube_schedulers_shapes(
    sim: SimApiServer,
    extender: FakeExtender,
    scheduler: Start,
    fixture: Callable[[str], Any],
) -> None:
    add_nodes(sim, "node-a", "node-b")
    uid = add_pod(sim, "trainer")
    async with scheduler():
        await eventually(lambda: node_of(sim, "trainer"))
    prioritize = extender.bodies("prioritize")[0]
    assert list(prioritize) == list(fixture("extender-prioritize-args.json"))
    assert prioritize["Nodes"] is None and prioritize["NodeNames"] == ["node-a", "node-b"]
    bind = extender.bodies("bind")[0]
    assert list(bind) == list(fixture("extender-bind-args.json"))
    assert bind == {
        "PodName": "trainer",
        "PodNamespace": "default",
        "PodUID": uid,
        "Node": node_of(sim, "trainer"),
    }


async def test_extender_url_prefix_is_kept_before_the_verb(
    sim: SimApiServer, client: httpx.AsyncClient
) -> None:
    paths: list[str] = []

    async def handle(request: Request) -> Response:
        paths.append(request.url.path)
        return JSONResponse(await keep_all(await request.json()))

    app = Starlette(routes=[Route("/scheduler/{verb}", handle, methods=["POST"])])
    add_nodes(sim, "node-a")
    add_pod(sim, "trainer")
    async with serve(app) as url:
        config = SchedulerConfig(extender_url=f"{url}/scheduler", **FAST)
        emulator = SchedulerEmulator(config, client)
        async with anyio.create_task_group() as tg:
            await tg.start(emulator.run)
            await eventually(lambda: paths[-1:] == ["/scheduler/bind"])
            tg.cancel_scope.cancel()
    assert paths == ["/scheduler/filter", "/scheduler/bind"]


# -- who is scheduled, and how it is bound -------------------------------------------------------


async def test_pod_without_managed_resources_is_bound_directly_without_the_extender(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b")
    uid = add_pod(sim, "plain", gpus=None)
    async with scheduler() as emulator:
        await eventually(lambda: node_of(sim, "plain"))
        await eventually(lambda: emulator.records[uid].bound_at is not None)
    assert extender.calls == []
    assert emulator.records[uid].node == node_of(sim, "plain")


async def test_pod_of_another_scheduler_is_left_alone(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    add_pod(sim, "other", scheduler_name="default-scheduler")
    mine = add_pod(sim, "mine")
    async with scheduler() as emulator:
        await eventually(lambda: node_of(sim, "mine"))
        assert await stays(lambda: node_of(sim, "other") is None, 0.1)
    assert list(emulator.records) == [mine]
    assert [b["Pod"]["metadata"]["name"] for b in extender.bodies("filter")] == ["mine"]


async def test_bind_error_from_the_extender_backs_off_and_retries(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")

    async def refuse(body: dict[str, Any]) -> dict[str, Any]:
        return {"Error": "claim conflict on gpu-a"}

    extender.answers["bind"] = sequence(refuse, extender.bind_in_sim)
    async with scheduler() as emulator:
        await eventually(lambda: node_of(sim, "trainer") == "node-a")
        await eventually(lambda: emulator.records[uid].bound_at is not None)
    record = emulator.records[uid]
    assert record.attempts == 2
    assert record.errors == ("binding rejected: claim conflict on gpu-a",)
    assert record.refusals == ()


async def test_direct_binding_refused_by_the_apiserver_backs_off_and_retries(
    sim: SimApiServer, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "plain", gpus=None)
    sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=500)
    async with scheduler() as emulator:
        await eventually(lambda: len(emulator.records[uid].errors) >= 1)
        sim.faults.clear()
        await eventually(lambda: node_of(sim, "plain") == "node-a")
    assert emulator.records[uid].errors[0].startswith("binding rejected: 500")


# -- choosing among nodes ----------------------------------------------------------------------


async def test_prioritize_is_skipped_when_one_node_is_left(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b", "node-c")
    add_pod(sim, "trainer")
    extender.answers["filter"] = keep_only("node-b")
    async with scheduler():
        await eventually(lambda: node_of(sim, "trainer"))
    assert node_of(sim, "trainer") == "node-b"
    assert [c.verb for c in extender.calls] == ["filter", "bind"]


async def test_highest_prioritize_score_wins(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b", "node-c")
    add_pod(sim, "trainer")
    extender.answers["prioritize"] = scores(**{"node-a": 2, "node-b": 9, "node-c": 5})
    async with scheduler():
        await eventually(lambda: node_of(sim, "trainer"))
    assert node_of(sim, "trainer") == "node-b"
    assert [c.verb for c in extender.calls] == ["filter", "prioritize", "bind"]


async def test_failed_prioritize_is_ignored_and_the_pod_is_still_bound(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b")
    uid = add_pod(sim, "trainer")
    extender.answers["prioritize"] = status(500)
    async with scheduler() as emulator:
        await eventually(lambda: node_of(sim, "trainer"))
    assert emulator.records[uid].attempts == 1
    assert emulator.records[uid].errors == ()


async def _placements(sim: SimApiServer, scheduler: Start, seed: int) -> list[str | None]:
    names = [f"job-{i}" for i in range(6)]
    for name in names:
        add_pod(sim, name, gpus=None)
    async with scheduler(seed=seed):
        await eventually(lambda: all(node_of(sim, n) for n in names))
    placed = [node_of(sim, n) for n in names]
    for name in names:
        sim.store.delete("pods", name, namespace="default", grace_period_seconds=0)
    return placed


async def test_equal_scores_are_broken_by_the_seed_reproducibly(
    sim: SimApiServer, scheduler: Start
) -> None:
    add_nodes(sim, *(f"node-{c}" for c in "abcdef"))
    first = await _placements(sim, scheduler, seed=7)
    again = await _placements(sim, scheduler, seed=7)
    other = await _placements(sim, scheduler, seed=8)
    assert first == again
    assert other != first


async def test_higher_priority_pod_is_scheduled_first(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    sim.store.create("priorityclasses", {"metadata": {"name": "high"}, "value": 1000})
    add_pod(sim, "a-low")
    add_pod(sim, "b-high", spec={"priorityClassName": "high"})
    async with scheduler():
        await eventually(lambda: node_of(sim, "a-low") and node_of(sim, "b-high"))
    order = [b["Pod"]["metadata"]["name"] for b in extender.bodies("filter")]
    assert order == ["b-high", "a-low"]


# -- which nodes reach the extender ------------------------------------------------------------


async def test_extender_receives_only_nodes_the_default_filters_keep(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    gpu_taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    for node in (
        make_node("fits", labels={"pool": "a"}),
        make_node("not-ready", ready="False", labels={"pool": "a"}),
        make_node("unknown", ready="Unknown", labels={"pool": "a"}),
        make_node("cordoned", unschedulable=True, labels={"pool": "a"}),
        make_node("tainted", taints=[{**gpu_taint, "key": "other"}], labels={"pool": "a"}),
        make_node("tolerated", taints=[gpu_taint], labels={"pool": "a"}),
        make_node("other-pool", labels={"pool": "b"}),
    ):
        sim.store.create("nodes", node)
    toleration = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    spec = {"nodeSelector": {"pool": "a"}, "tolerations": [toleration]}
    add_pod(sim, "trainer", spec=spec)
    async with scheduler():
        await eventually(lambda: node_of(sim, "trainer"))
    assert extender.bodies("filter")[0]["NodeNames"] == ["fits", "tolerated"]


async def test_a_node_cordoned_after_one_pod_was_placed_is_not_offered_for_the_next_alike_pod(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b")
    extender.answers["filter"] = sequence(keep_all, refuse_all(), keep_all)
    async with scheduler() as emulator:
        add_pod(sim, "first")
        await eventually(lambda: node_of(sim, "first"))
        await refused_once(emulator, add_pod(sim, "second"))
        # The label change moves the refused pod; the cordon arrives in the same event.
        cordon = {"spec": {"unschedulable": True}, "metadata": {"labels": {"drain": "soon"}}}
        sim.store.patch("nodes", "node-b", cordon)
        await eventually(lambda: node_of(sim, "second"))
    assert [b["NodeNames"] for b in extender.bodies("filter")] == [
        ["node-a", "node-b"],
        ["node-a", "node-b"],
        ["node-a"],
    ]


async def test_no_feasible_node_refuses_with_kube_schedulers_message_without_the_extender(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    sim.store.create("nodes", make_node("cordoned", unschedulable=True))
    sim.store.create("nodes", make_node("down", ready="False"))
    sim.store.create("nodes", make_node("elsewhere", labels={"pool": "b"}))
    uid = add_pod(sim, "trainer", spec={"nodeSelector": {"pool": "a"}})
    async with scheduler() as emulator:
        record = await refused_once(emulator, uid)
    assert extender.calls == []
    assert record.refusals == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, "
        "1 node(s) were unschedulable.",
    )


async def test_extender_refusals_join_the_in_tree_reasons_in_the_fit_error(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b")
    sim.store.create("nodes", make_node("cordoned", unschedulable=True))
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = refuse_all("2/4 CardBusyOnServer")
    async with scheduler() as emulator:
        record = await refused_once(emulator, uid)
    assert record.last_message == (
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 2/4 CardBusyOnServer."
    )


# -- errors go to backoffQ ---------------------------------------------------------------------


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def test_extender_error_backs_off_doubling_up_to_the_cap(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = error()
    async with scheduler(initial_backoff_seconds=0.05, max_backoff_seconds=0.2) as emulator:
        await eventually(lambda: len(extender.times("filter")) >= 6)
    gaps = _gaps(extender.times("filter"))[:5]
    for gap, backoff in zip(gaps, (0.05, 0.1, 0.2, 0.2, 0.2), strict=True):
        assert gap >= backoff * 0.95
    assert max(gaps[3:]) < 0.39, "the backoff must stop doubling at max_backoff_seconds"
    record = emulator.records[uid]
    assert record.refusals == ()
    assert record.errors[0] == "remote GPU inventory not synced yet"


async def unknown_node(body: dict[str, Any]) -> dict[str, Any]:
    return {"NodeNames": ["node-z"], "Error": ""}


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (status(500), "code 500"),
        (status(404), "code 404"),
        (unknown_node, "not in the input node list"),
    ],
)
async def test_non_200_or_unusable_filter_answer_is_an_error_that_backs_off(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start, bad: Answer, expected: str
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(bad, bad, keep_all)
    async with scheduler() as emulator:
        await eventually(lambda: node_of(sim, "trainer"))
    record = emulator.records[uid]
    assert record.attempts == 3 and record.refusals == ()
    assert len(record.errors) == 2 and all(expected in e for e in record.errors)


async def test_extender_slower_than_the_http_timeout_is_an_error(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")

    async def slow(body: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep(0.6)
        return await keep_all(body)

    extender.answers["filter"] = sequence(slow, keep_all)
    async with scheduler(http_timeout_seconds=0.2) as emulator:
        await eventually(lambda: node_of(sim, "trainer"))
    record = emulator.records[uid]
    assert record.attempts == 2
    assert "TimeoutError" in record.errors[0]


# -- unschedulable pods and what moves them back -------------------------------------------------


async def test_refused_pod_waits_until_a_node_is_added(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        assert await stays(lambda: len(extender.bodies("filter")) == 1)
        add_nodes(sim, "node-b")
        await eventually(lambda: node_of(sim, "trainer"))
    assert emulator.records[uid].attempts == 2


async def test_node_heartbeat_does_not_move_refused_pods_but_a_label_change_does(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    heartbeat = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-29T10:00:10Z"}
            ]
        }
    }
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        sim.store.patch("nodes", "node-a", heartbeat, subresource="status")
        assert await stays(lambda: len(extender.bodies("filter")) == 1)
        sim.store.patch("nodes", "node-a", {"metadata": {"labels": {"rack": "r1"}}})
        await eventually(lambda: node_of(sim, "trainer"))


async def test_cordoning_does_not_move_refused_pods_but_uncordoning_does(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        sim.store.patch("nodes", "node-b", {"spec": {"unschedulable": True}})
        assert await stays(lambda: len(extender.bodies("filter")) == 1)
        sim.store.patch("nodes", "node-b", {"spec": {"unschedulable": None}})
        await eventually(lambda: node_of(sim, "trainer"))


def trainer_behind_a_holder(sim: SimApiServer) -> str:
    """``holder`` runs on node-a, the only node; ``trainer`` is pending: its uid."""
    add_nodes(sim, "node-a")
    sim.store.create("pods", make_pod("holder", spec={"nodeName": "node-a"}))
    return add_pod(sim, "trainer")


async def test_deleting_an_assigned_pod_moves_refused_pods(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    uid = trainer_behind_a_holder(sim)
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        sim.store.delete("pods", "holder", namespace="default", grace_period_seconds=0)
        await eventually(lambda: node_of(sim, "trainer"))


async def test_with_trace_a_pods_record_tells_its_history_in_order(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    uid = trainer_behind_a_holder(sim)
    extender.answers["filter"] = sequence(refuse_all(), refuse_all(), keep_all)
    async with scheduler(trace=True) as emulator:
        await refused_once(emulator, uid)
        sim.store.patch("pods", "trainer", {"metadata": {"annotations": {"nudge": "1"}}})
        await eventually(lambda: len(emulator.records[uid].refusals) == 2)
        sim.store.delete("pods", "holder", namespace="default", grace_period_seconds=0)
        await eventually(lambda: emulator.records[uid].bound_at is not None)
    record = emulator.records[uid]
    refusal = record.refusals[0]
    assert [(s.what, s.detail) for s in record.steps] == [
        ("queued", ""),
        ("attempt", ""),
        ("refused", refusal),
        ("updated", ""),  # a nudge: the update sends the pod back
        ("attempt", ""),
        ("refused", refusal),
        ("moved", "assigned pod deleted or finished"),
        ("attempt", ""),
        ("bound", "node-a"),
    ]
    assert [s.at for s in record.steps] == sorted(s.at for s in record.steps)


async def test_without_trace_records_keep_no_history(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    async with scheduler() as emulator:
        await eventually(lambda: node_of(sim, "trainer"))
    assert emulator.records[uid].steps == ()


async def test_a_terminating_assigned_pod_counts_on_its_node_until_it_is_gone(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    sim.store.create("pods", make_pod("holder", spec={"nodeName": "node-a"}))
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        terminating = sim.store.delete("pods", "holder", namespace="default")
        assert terminating["metadata"]["deletionTimestamp"]
        assert await stays(lambda: len(extender.bodies("filter")) == 1)
        sim.store.delete("pods", "holder", namespace="default", grace_period_seconds=0)
        await eventually(lambda: node_of(sim, "trainer"))


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_an_assigned_pod_finishing_moves_refused_pods(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start, phase: str
) -> None:
    add_nodes(sim, "node-a")
    sim.store.create("pods", make_pod("holder", spec={"nodeName": "node-a"}))
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        sim.store.patch("pods", "holder", {"status": {"phase": "Running"}}, subresource="status")
        assert await stays(lambda: len(extender.bodies("filter")) == 1)
        sim.store.patch("pods", "holder", {"status": {"phase": phase}}, subresource="status")
        await eventually(lambda: node_of(sim, "trainer"))


async def test_deleting_another_pending_pod_does_not_move_refused_pods(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    add_pod(sim, "bystander", scheduler_name="default-scheduler")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = refuse_all()
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        sim.store.delete("pods", "bystander", namespace="default")
        assert await stays(lambda: len(extender.bodies("filter")) == 1)


async def test_annotation_update_of_the_pending_pod_moves_it_but_a_status_write_does_not(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    async with scheduler() as emulator:
        await refused_once(emulator, uid)
        sim.store.patch(
            "pods", "trainer", {"status": {"conditions": [condition]}}, subresource="status"
        )
        assert await stays(lambda: len(extender.bodies("filter")) == 1)
        patch = {"metadata": {"annotations": {"rgpu.io/retry-at": "2026-11-29T10:00:01Z"}}}
        sim.store.patch("pods", "trainer", patch, namespace="default")
        await eventually(lambda: node_of(sim, "trainer"))
    assert emulator.records[uid].attempts == 2


async def test_refused_pod_is_flushed_back_after_the_configured_period(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    async with scheduler(unschedulable_flush_seconds=0.25) as emulator:
        await eventually(lambda: node_of(sim, "trainer"))
    first, second = extender.times("filter")
    assert second - first >= 0.25
    assert emulator.records[uid].attempts == 2


async def _retry_after_a_node_is_added(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start, **config: Any
) -> float:
    """Seconds between a lone pod's refusal and its retry, a node added in between."""
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = sequence(refuse_all(), keep_all)
    async with scheduler(**config) as emulator:
        await refused_once(emulator, uid)
        add_nodes(sim, "node-b")
        await eventually(lambda: node_of(sim, "trainer"))
    first, second = extender.times("filter")
    return second - first


async def test_a_moved_pod_still_serves_the_rest_of_its_backoff(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    gap = await _retry_after_a_node_is_added(
        sim, extender, scheduler, initial_backoff_seconds=0.3, max_backoff_seconds=1.0
    )
    assert 0.3 <= gap < 5.0


async def test_an_idle_scheduler_retries_a_moved_pod_before_its_backoff_ends(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    gap = await _retry_after_a_node_is_added(
        sim,
        extender,
        scheduler,
        initial_backoff_seconds=5.0,
        max_backoff_seconds=5.0,
        pop_from_backoff=True,
    )
    assert gap < 2.0, "nothing else was active: the pod need not serve its 5 s"


async def test_a_node_added_during_the_attempt_turns_the_refusal_into_a_backoff(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    release = anyio.Event()
    arrived = anyio.Event()

    async def held_refusal(body: dict[str, Any]) -> Any:
        arrived.set()
        await release.wait()
        return await refuse_all()(body)

    extender.answers["filter"] = sequence(held_refusal, keep_all)
    async with scheduler(pop_from_backoff=False) as emulator:
        await arrived.wait()
        assert emulator.queue.state(uid) == "in-flight"
        add_nodes(sim, "node-b")
        await anyio.sleep(0.1)  # the node's ADDED event reaches the emulator meanwhile
        release.set()
        await eventually(lambda: emulator.records[uid].refusals)
        assert emulator.queue.state(uid) in ("backoff", "active", "in-flight", "assumed")
        await eventually(lambda: node_of(sim, "trainer"))
    assert emulator.records[uid].attempts == 2


async def test_pod_deleted_while_unschedulable_is_dropped(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = refuse_all()
    async with scheduler(unschedulable_flush_seconds=0.1) as emulator:
        await refused_once(emulator, uid)
        sim.store.delete("pods", "trainer", namespace="default")
        await eventually(lambda: emulator.queue.state(uid) is None)
        add_nodes(sim, "node-b")
        assert await stays(lambda: len(extender.bodies("filter")) == 1)


async def test_pod_deleted_while_backing_off_is_dropped(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    uid = add_pod(sim, "trainer")
    extender.answers["filter"] = error()
    async with scheduler(initial_backoff_seconds=0.2) as emulator:
        await eventually(lambda: emulator.queue.state(uid) == "backoff")
        sim.store.delete("pods", "trainer", namespace="default")
        await eventually(lambda: emulator.queue.state(uid) is None)
        assert await stays(lambda: len(extender.bodies("filter")) == 1)


def release(sim: SimApiServer, name: str, *remaining: str) -> None:
    """Remove gates as rgpu's admitter does: a merge patch at the version just read."""
    rv = sim.store.get("pods", name)["metadata"]["resourceVersion"]
    gates = [{"name": g} for g in remaining]
    patch = {"metadata": {"resourceVersion": rv}, "spec": {"schedulingGates": gates}}
    sim.store.patch("pods", name, patch)


async def test_a_gated_pod_is_never_tried_until_its_last_gate_goes_and_that_update_queues_it(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    gates = [{"name": "rgpu.io/admission"}, {"name": "example.com/quota"}]
    async with scheduler(trace=True) as emulator:
        uid = add_pod(sim, "trainer", spec={"schedulingGates": gates})
        await eventually(lambda: uid in emulator.gated)
        release(sim, "trainer", "example.com/quota")
        sim.store.patch("pods", "trainer", {"metadata": {"annotations": {"nudge": "1"}}})
        assert await stays(lambda: node_of(sim, "trainer") is None)
        assert extender.calls == [] and emulator.records[uid].attempts == 0
        release(sim, "trainer")
        released = int(sim.store.get("pods", "trainer")["metadata"]["resourceVersion"])
        await eventually(lambda: node_of(sim, "trainer") == "node-a")
        await eventually(lambda: emulator.records[uid].bound_at is not None)
    record = emulator.records[uid]
    # The first /filter carried the version without gates: what rgpu was asked to place.
    assert extender.calls[0].verb == "filter" and record.filtered_rv == released
    assert [(s.what, s.detail) for s in record.steps] == [
        ("gated", "rgpu.io/admission,example.com/quota"),
        ("queued", ""),
        ("attempt", ""),
        ("bound", "node-a"),
    ]
    assert record.attempts == 1 and uid not in emulator.gated
    assert record.queued_at is not None and record.gated_seconds >= QUIET
    assert record.wait_seconds is not None and record.wait_seconds >= record.gated_seconds


async def test_a_pod_created_without_gates_is_queued_at_once_and_counts_no_gated_time(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    async with scheduler() as emulator:
        uid = add_pod(sim, "trainer")
        await eventually(lambda: uid in emulator.records and emulator.records[uid].bound_at)
    record = emulator.records[uid]
    assert record.queued_at == record.first_seen and record.gated_seconds == 0
    assert emulator.gated == frozenset()


async def test_a_gated_pod_deleted_while_waiting_is_forgotten(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    async with scheduler() as emulator:
        uid = add_pod(sim, "trainer", spec={"schedulingGates": [{"name": "rgpu.io/admission"}]})
        await eventually(lambda: uid in emulator.gated)
        sim.store.delete("pods", "trainer")
        await eventually(lambda: uid not in emulator.gated)
    assert emulator.records[uid].attempts == 0 and extender.calls == []


# -- records ----------------------------------------------------------------------------------


async def test_record_counts_attempts_and_measures_creation_to_binding(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    extender.answers["filter"] = sequence(error(), keep_all)
    async with scheduler(initial_backoff_seconds=0.2) as emulator:
        uid = add_pod(sim, "trainer")
        await eventually(lambda: uid in emulator.records and emulator.records[uid].bound_at)
    record = emulator.records[uid]
    assert (record.key, record.node, record.attempts) == ("default/trainer", "node-a", 2)
    assert record.wait_seconds is not None and 0.2 <= record.wait_seconds < 5.0


async def test_latencies_keep_every_extender_call_and_cycle_by_verb(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a", "node-b")
    async with scheduler() as emulator:
        uid = add_pod(sim, "trainer")
        await eventually(lambda: uid in emulator.records and emulator.records[uid].bound_at)
    latencies = emulator.latencies()
    assert {name: len(latencies[name]) for name in latencies} == {
        "filter": 1,
        "prioritize": 1,
        "bind": 1,
        "cycle": 1,
    }
    assert latencies["cycle"][0] >= latencies["filter"][0] + latencies["prioritize"][0] > 0


# -- faults --------------------------------------------------------------------------------------


async def test_cut_watches_and_expired_versions_neither_lose_nor_repeat_pods(
    sim: SimApiServer, extender: FakeExtender, scheduler: Start
) -> None:
    add_nodes(sim, "node-a")
    async with scheduler() as emulator:
        add_pod(sim, "before")
        await eventually(lambda: node_of(sim, "before"))
        sim.faults.cut_watches()
        add_pod(sim, "during-cut")
        await eventually(lambda: node_of(sim, "during-cut"))
        sim.faults.expire_before()
        sim.faults.cut_watches()
        add_pod(sim, "after-expiry")
        add_nodes(sim, "node-b")
        await eventually(lambda: node_of(sim, "after-expiry"))
    names = [b["Pod"]["metadata"]["name"] for b in extender.bodies("filter")]
    assert sorted(names) == ["after-expiry", "before", "during-cut"]
    assert all(r.attempts == 1 for r in emulator.records.values())


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"extender_url": "127.0.0.1:8083"}, "extender_url"),
        ({"scheduler_name": ""}, "scheduler_name"),
        ({"http_timeout_seconds": 0}, "http_timeout_seconds"),
        ({"initial_backoff_seconds": -1}, "initial_backoff_seconds"),
        ({"max_backoff_seconds": 0.5}, "max_backoff_seconds"),
        ({"unschedulable_flush_seconds": 0}, "unschedulable_flush_seconds"),
        ({"prioritize_weight": 0}, "prioritize_weight"),
        ({"percentage_of_nodes_to_score": 101}, "percentage_of_nodes_to_score"),
    ],
)
def test_invalid_scheduler_config_names_the_field(
    overrides: dict[str, Any], field_name: str
) -> None:
    values: dict[str, Any] = {"extender_url": "http://127.0.0.1:8083", **overrides}
    with pytest.raises(SimOptionError) as caught:
        SchedulerConfig(**values)
    assert caught.value.field == field_name
