"""``rgpu explain``: a preempting pod's nomination and victims; a pod's phase, and what a bound or
finished pod holds from its annotations; one line for a request no server can ever satisfy."""

from __future__ import annotations

import json

import httpx
import pytest
from rich.console import Console

import rgpu_testkit as testkit
from rgpu_cli.explain import (
    CLAIM_LEASES,
    Explanation,
    Nominated,
    explain,
    find_nomination,
    nomination_in,
    render_explanation,
)
from rgpu_contracts import (
    CardId,
    Fleet,
    NoFit,
    PodRef,
    PodUID,
    Reason,
    ReasonCount,
    ServerName,
    ServerVerdict,
)
from rgpu_kubesim import run_apiserver
from rgpu_placement import ANNOTATION_NOMINATION, Nomination
from rgpu_runtime.kube import kube_client
from rgpu_runtime.settings import Settings
from rgpu_testkit import flat

URGENT = PodRef(uid=PodUID("uid-urgent"), namespace="ml", name="urgent")


def nomination(pod: PodRef = URGENT, at: float = 1000.0) -> Nomination:
    return Nomination(
        pod=pod,
        priority=1000,
        cards=(CardId("gpu-a/GPU-0"),),
        victims=(
            PodRef(uid=PodUID("uid-b1"), namespace="ml", name="batch-1"),
            PodRef(uid=PodUID("uid-b2"), namespace="ml", name="batch-2"),
        ),
        nominated_at=at,
        expires_at=at + 60,
    )


def lease(server: str, text: str | None) -> dict[str, object]:
    annotations = {"rgpu.io/server": server, "rgpu.io/claims": "[]"}
    if text is not None:
        annotations[ANNOTATION_NOMINATION] = text
    key, value = CLAIM_LEASES.split("=")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"rgpu-{server}",
            "namespace": "rgpu-system",
            "labels": {key: value},
            "annotations": annotations,
        },
        "spec": {},
    }


def test_the_pods_nomination_is_found_among_the_claim_leases():
    other = PodRef(uid=PodUID("uid-other"), namespace="ml", name="other")
    leases = [
        lease("gpu-a", json.dumps(nomination(other).to_dict())),
        lease("gpu-b", "{not json"),
        lease("gpu-c", json.dumps(nomination().to_dict())),
        lease("gpu-d", None),
    ]
    found = nomination_in(leases, URGENT.uid)
    assert found == Nominated(server="gpu-c", nomination=nomination())
    assert nomination_in(leases, "uid-nobody") is None


def test_the_latest_nomination_wins_when_an_old_one_lingers():
    leases = [
        lease("gpu-a", json.dumps(nomination(at=500.0).to_dict())),
        lease("gpu-b", json.dumps(nomination(at=900.0).to_dict())),
    ]
    assert nomination_in(leases, URGENT.uid).server == "gpu-b"


@pytest.mark.anyio
async def test_the_nomination_is_read_from_the_apiserver():
    async with run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
        sim.store.create("leases", lease("gpu-a", json.dumps(nomination().to_dict())))
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="extender")
        async with kube_client(settings) as kube:
            found = await find_nomination(kube, "rgpu-system", URGENT.uid)
    assert found is not None
    assert found.server == "gpu-a"


@pytest.mark.parametrize(("now", "word"), [(1030.0, "expires"), (1061.0, "expired")])
def test_explain_renders_the_nominated_server_and_its_victims(now, word):
    explanation = Explanation(
        pod=URGENT,
        node=None,
        allocation=None,
        nofit=None,
        problem="",
        events=(),
        nominated=Nominated(server="gpu-a", nomination=nomination()),
    )
    console = Console(width=300, record=True)
    console.print(render_explanation(explanation, now=now))
    text = console.export_text()
    assert "server gpu-a nominated for this pod (priority 1000)" in text
    assert f"{word} 1970-01-01T00:17:40Z" in text
    assert "victims: ml/batch-1, ml/batch-2" in text


# --- the pod's phase, what it holds, and requests that can never fit --------------------------
# The pod, its events and the Leases come from kubesim over HTTP; the allocator's and
# discovery's answers from a transport that records what was asked.

ALLOCATED = (
    "gpu-01/GPU-33ff82b3-f349-430f-b725-cea217e3b54e,RemoteGPU,81920,100:"
    "gpu-01/GPU-fb83acaa-4664-4486-b72a-6b3073194ca1,RemoteGPU,81920,100:;"
)


class Peers:
    """The allocator and discovery as a transport: canned answers, every request kept."""

    def __init__(
        self,
        *,
        allocation: httpx.Response,
        fleet: Fleet,
        granularity: str = "server",
        queue: httpx.Response | None = None,
    ):
        self.asked: list[str] = []
        self._allocation = allocation
        self._fleet = fleet
        self._granularity = granularity
        self._queue = queue or httpx.Response(200, json={"pods": [], "namespaces": []})

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(f"{request.method} {request.url.path}")
        if request.url.path == "/v1/allocations":
            return self._allocation
        if request.url.path == "/v1/queue":
            return self._queue
        if request.url.path == "/v1/status":
            return httpx.Response(200, json={"granularity": self._granularity})
        return httpx.Response(200, json=self._fleet.to_dict())

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


def conflict(*servers: str, cards: int = 4) -> httpx.Response:
    """The allocator's 409: every server held by someone else."""
    verdicts = [
        ServerVerdict(
            server=ServerName(s),
            reasons=(ReasonCount(reason=Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, count=cards),),
            detail=f"held by default/holder-{s}",
        )
        for s in servers
    ]
    counts = (
        ReasonCount(reason=Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, count=cards * len(servers)),
    )
    nofit = NoFit(reasons=counts, total=cards * len(servers), servers=tuple(verdicts))
    return httpx.Response(409, json=nofit.to_dict())


def four_card_fleet(servers: int) -> Fleet:
    return testkit.fleet(
        servers=[testkit.server(name=f"gpu-{i:02d}", cards=4) for i in range(1, servers + 1)]
    )


async def explained(pod: dict[str, object], peers: Peers) -> Explanation:
    async with run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
        created = sim.store.create("pods", pod, namespace="default")
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_ALLOCATOR_URL": "http://allocator"}
        settings = Settings.from_env(
            env | {"RGPU_DISCOVERY_URL": "http://discovery"}, service="extender"
        )
        return await explain(
            settings, "default", created["metadata"]["name"], transport=peers.transport
        )


def rendered(explanation: Explanation) -> str:
    console = Console(width=100, record=True)
    console.print(render_explanation(explanation, now=0.0))
    return console.export_text()


def asking(
    count: str, *, name: str = "p", resource: str = "nvidia.com/remote-gpu"
) -> dict[str, object]:
    return testkit.pod_manifest(
        name=name, containers=[testkit.container_manifest(limits={resource: count})]
    )


@pytest.mark.anyio
async def test_a_finished_pod_is_shown_with_its_phase_and_the_server_it_held_not_a_dry_run():
    pod = asking("1", name="done")
    pod["spec"]["nodeName"] = "node-03"
    pod["metadata"]["annotations"] = {
        "hami.io/remote-gpu-devices-allocated": ALLOCATED,
        "hami.io/lupine-endpoint": "10.0.0.1:14833",
    }
    pod["status"] = {"phase": "Succeeded"}
    peers = Peers(allocation=httpx.Response(500), fleet=four_card_fleet(2))
    explanation = await explained(pod, peers)
    assert peers.asked == []  # a dry run would offer a finished pod a server it never held
    text = rendered(explanation)
    assert "default/done" in text and ": Succeeded on node-03" in text
    assert (
        "finished; it held server gpu-01 at 10.0.0.1:14833, 2 cards (GPU-33ff82b3, GPU-fb83acaa)"
        in text
    )
    assert "fits now" not in text and "holds" not in text


@pytest.mark.anyio
async def test_a_request_larger_than_any_server_is_one_never_fits_line_not_a_conflict_table():
    peers = Peers(allocation=conflict("gpu-01", "gpu-02"), fleet=four_card_fleet(2))
    explanation = await explained(asking("16"), peers)
    assert explanation.never is not None
    text = rendered(explanation)
    assert "never fits" in flat(text)
    assert "NodeInsufficientDevice" in flat(text)
    assert "every one of the 2 servers" in flat(text)
    # The servers' holders are beside the point: nothing is in their way but their size.
    assert "ExclusiveDeviceAllocateConflict" not in text
    assert "holder-gpu-01" not in text
    assert len(text.strip().splitlines()) <= 5


@pytest.mark.anyio
async def test_a_request_that_only_waits_for_holders_gets_the_reasons_table():
    peers = Peers(allocation=conflict("gpu-01", "gpu-02"), fleet=four_card_fleet(2))
    explanation = await explained(asking("2"), peers)
    assert explanation.never is None
    text = rendered(explanation)
    assert "no server fits now: 8/8 ExclusiveDeviceAllocateConflict" in flat(text)
    assert "held by default/holder-gpu-02" in flat(text)


@pytest.mark.anyio
async def test_many_servers_with_the_same_reasons_share_one_row():
    servers = [f"gpu-{i:02d}" for i in range(1, 51)]
    peers = Peers(allocation=conflict(*servers), fleet=four_card_fleet(50))
    text = rendered(await explained(asking("2"), peers))
    assert "gpu-01, gpu-02, gpu-03 … (50 servers)" in flat(text)
    assert "(and 49 more)" in flat(text)
    assert len(text.strip().splitlines()) < 15


@pytest.mark.anyio
async def test_a_lookalike_resource_is_named_with_the_one_meant():
    peers = Peers(allocation=httpx.Response(500), fleet=four_card_fleet(1))
    pod = asking("1", resource="nvidia.com/remote-gpus")
    text = flat(rendered(await explained(pod, peers)))
    assert "asks for nvidia.com/remote-gpus" in text
    assert "did you mean nvidia.com/remote-gpu?" in text
    assert "the pod asks for no nvidia.com/remote-gpu" in text


# --- a pod behind rgpu's scheduling gate: its place in the admission queue --------------------


def gated(*gates: str) -> dict[str, object]:
    pod = asking("2", name="trainer")
    pod["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return pod


def queue_with(uid_of: str, reason: str, message: str) -> httpx.Response:
    """The allocator's queue: one pod ahead, then the explained pod (its uid filled in later)."""
    ahead = {"uid": "uid-ahead", "namespace": "default", "name": "ahead"}
    mine = {"uid": uid_of, "namespace": "default", "name": "trainer"}

    def entry(pod: dict[str, str], position: int, why: str, text: str) -> dict[str, object]:
        return {
            "pod": pod,
            "position": position,
            "priority": 0,
            "cards": 2,
            "reason": why,
            "message": text,
            "since": 0.0,
        }

    body = {
        "pods": [entry(ahead, 0, "NoFit", "no server fits"), entry(mine, 1, reason, message)],
        "namespaces": [{"namespace": "default", "held": 8, "quota": 8, "weight": 1}],
        "configProblem": None,
    }
    return httpx.Response(200, json=body)


class QueuePeers(Peers):
    """Peers whose queue lists the explained pod (by the uid kubesim gave it: ``uid``)."""

    def __init__(self, reason: str, message: str, *, allocation: httpx.Response, fleet: Fleet):
        super().__init__(allocation=allocation, fleet=fleet)
        self._reason, self._message = reason, message
        self.uid = ""

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/queue":
            self.asked.append(f"{request.method} {request.url.path}")
            return queue_with(self.uid, self._reason, self._message)
        return super().handle(request)


async def explained_queued(pod: dict[str, object], peers: QueuePeers) -> Explanation:
    async with run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
        created = sim.store.create("pods", pod, namespace="default")
        peers.uid = created["metadata"]["uid"]
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_ALLOCATOR_URL": "http://allocator"}
        settings = Settings.from_env(
            env | {"RGPU_DISCOVERY_URL": "http://discovery"}, service="extender"
        )
        return await explain(settings, "default", "trainer", transport=peers.transport)


@pytest.mark.anyio
async def test_a_gated_pod_over_its_quota_shows_its_place_and_reason_without_a_dry_run():
    message = "namespace default holds 8 card(s) of its 8-card quota and asks for 2 more"
    peers = QueuePeers(
        "QuotaExceeded", message, allocation=httpx.Response(200), fleet=four_card_fleet(4)
    )
    explanation = await explained_queued(gated("rgpu.io/admission"), peers)
    # A dry run would say it fits: the quota, not the servers, holds it back.
    assert peers.asked == ["GET /v1/queue"]
    text = flat(rendered(explanation))
    assert f"admission queue: 2 of 2 (priority 0, 2 card(s)), QuotaExceeded: {message}" in text
    assert "namespace default: 8 card(s) held, quota 8, weight 1" in text
    assert "fits now" not in text


@pytest.mark.anyio
async def test_a_gated_pod_that_waits_for_holders_gets_its_place_and_the_reasons_table():
    peers = QueuePeers(
        "NoFit", "no server fits", allocation=conflict("gpu-01"), fleet=four_card_fleet(1)
    )
    explanation = await explained_queued(gated("rgpu.io/admission"), peers)
    assert "POST /v1/allocations" in peers.asked
    text = flat(rendered(explanation))
    assert "admission queue: 2 of 2" in text and "NoFit" in text
    assert "held by default/holder-gpu-01" in text


@pytest.mark.anyio
async def test_a_pod_behind_another_systems_gate_is_told_rgpu_waits_for_it():
    peers = QueuePeers("NoFit", "unused", allocation=conflict("gpu-01"), fleet=four_card_fleet(1))
    pod = gated("kueue.x-k8s.io/admission", "rgpu.io/admission")
    explanation = await explained_queued(pod, peers)
    assert "GET /v1/queue" not in peers.asked
    text = flat(rendered(explanation))
    assert (
        "gated by kueue.x-k8s.io/admission (not rgpu's): rgpu admits it once those are lifted"
        in text
    )


@pytest.mark.anyio
async def test_an_unreadable_queue_is_said_and_the_dry_run_still_explains():
    peers = Peers(
        allocation=conflict("gpu-01"), fleet=four_card_fleet(1), queue=httpx.Response(503)
    )
    async with run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
        sim.store.create("pods", gated("rgpu.io/admission"), namespace="default")
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_ALLOCATOR_URL": "http://allocator"}
        settings = Settings.from_env(
            env | {"RGPU_DISCOVERY_URL": "http://discovery"}, service="extender"
        )
        explanation = await explain(settings, "default", "trainer", transport=peers.transport)
    text = flat(rendered(explanation))
    assert "the admission queue is unreadable" in text and "503" in text
    assert "held by default/holder-gpu-01" in text


def test_explain_prints_the_trace_the_pods_story_starts_in() -> None:
    pod = PodRef(uid=PodUID("u-1"), namespace="ml", name="trainer-0")
    explanation = Explanation(
        pod=pod, node=None, allocation=None, nofit=None, problem="", events=(), trace_id="ab" * 16
    )
    console = Console(width=80, record=True)
    console.print(render_explanation(explanation))
    assert f"trace {'ab' * 16} (rgpu trace ml/trainer-0)" in console.export_text()
