"""Admission by scheduling gate, at the allocator's boundary: real apps on kubesim over HTTP,
discovery faked at the transport. Gated pods are booked in queue order and their gate lifted;
pods that cannot be placed wait with a reason (an Event, ``GET /v1/queue``) and hold nothing;
a new leader finishes what a dead one started; nothing is nudged."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

import rgpu_testkit as testkit
from rgpu_allocator.admitting import PERIOD
from rgpu_contracts import PodRef, PodUID
from rgpu_kubesim import ApiError

pytestmark = pytest.mark.anyio

GATE = {"name": "rgpu.io/admission"}
KUEUE = {"name": "kueue.x-k8s.io/admission"}
COUNT = "nvidia.com/remote-gpu"
BRISK = {"RGPU_ADMISSION_TTL_SECONDS": "60"}


def gated_pod(
    cluster: Any,
    name: str,
    *,
    cards: int = 1,
    memory: int = 0,
    priority: int | None = None,
    gates: Sequence[Mapping[str, str]] = (GATE,),
    spec: Mapping[str, object] | None = None,
    namespace: str = "ml",
    labels: Mapping[str, str] | None = None,
) -> PodRef:
    """A GPU pod as the webhook leaves it in gate mode: rgpu's scheduler, gated."""
    limits = {COUNT: str(cards)}
    if memory:
        limits["nvidia.com/remote-gpu-memory"] = str(memory)
    body: dict[str, object] = {"schedulingGates": [dict(g) for g in gates], **(spec or {})}
    if priority is not None:
        body["priorityClassName"] = priority_class(cluster, priority)
    manifest = testkit.pod_manifest(
        name=name,
        namespace=namespace,
        scheduler="rgpu-scheduler",
        labels=labels or None,
        containers=[testkit.container_manifest(name="main", limits=limits)],
        spec=body,
    )
    made = cluster.sim.store.create("pods", manifest)
    return PodRef(uid=PodUID(made["metadata"]["uid"]), namespace=namespace, name=name)


def priority_class(cluster: Any, value: int) -> str:
    """The name of a PriorityClass of ``value`` (made on first use)."""
    name = f"value-{value}"
    try:
        cluster.sim.store.get("priorityclasses", name)
    except ApiError:
        body = {"metadata": {"name": name}, "value": value}
        cluster.sim.store.create("priorityclasses", body)
    return name


def lease_creates(sim: Any) -> int:
    counts = sim.meter.snapshot().items()
    return sum(c.requests for k, c in counts if k.verb == "create" and k.resource == "leases")


def gates(cluster: Any, pod: PodRef) -> list[str]:
    got = cluster.sim.store.get("pods", pod.name, namespace=pod.namespace)
    return [g["name"] for g in got["spec"].get("schedulingGates") or ()]


def holders(cluster: Any) -> dict[str, list[str]]:
    return {server: names for server, names in cluster.holders().items() if names}


def events(cluster: Any, pod: PodRef, reason: str = "RemoteGPUWaiting") -> list[dict[str, Any]]:
    found = cluster.sim.store.list("events", namespace=pod.namespace)
    return [
        e
        for e in found
        if e.get("reason") == reason and (e.get("involvedObject") or {}).get("uid") == pod.uid
    ]


async def metric(client: Any, name: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


async def test_a_gated_pod_is_booked_and_its_gate_lifted(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery, **BRISK) as client:
        pod = gated_pod(cluster, "trainer")
        await kit.wait_for(lambda: not gates(cluster, pod), what="the gate lifted")
        [claim] = cluster.claims("gpu-a")
        assert claim["pod"]["name"] == "trainer"
        assert claim["state"] == "booked"
        assert claim["admissionTtlSeconds"] == 60
        # The gate's update carries the booking, which kube-scheduler hands the extender.
        note = orjson.loads(cluster.annotations(pod)["rgpu.io/booking"])
        assert note["server"] == "gpu-a"
        assert note["expiresAt"] == pytest.approx(claim["bookedAt"] + 60)

        async def counted() -> bool:
            return await metric(client, "rgpu_admissions_total", outcome="admitted") == 1

        # The gate is lifted in the store before the patch's answer reaches the counter.
        await kit.wait_for(counted, what="the admission counted")
        assert await metric(client, "rgpu_admission_wait_seconds_count") == 1


async def test_admission_runs_no_further_ahead_of_the_scheduler_than_its_window(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(*(build.server(f"gpu-{i}") for i in range(8))))
    async with kit.running_allocator(sim.url, discovery, RGPU_ADMISSION_AHEAD="3") as client:
        pods = [gated_pod(cluster, f"burst-{i}") for i in range(8)]

        def admitted() -> list[PodRef]:
            return [p for p in pods if not gates(cluster, p)]

        await kit.wait_for(lambda: len(admitted()) == 3, what="a window's worth admitted")
        await anyio.sleep(0.5)
        assert len(admitted()) == 3  # the scheduler has bound none of them
        first = admitted()[0]
        commit = await client.post(f"/v1/allocations/{first.uid}/commit", json={"node": "c-1"})
        assert commit.status_code == 200, commit.text
        cluster.bind(first, "c-1")
        await kit.wait_for(lambda: len(admitted()) == 4, what="one more once one is bound")
        await anyio.sleep(0.5)
        assert len(admitted()) == 4


async def test_an_admission_the_apiserver_fails_is_retried_with_backoff_not_at_once(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery):
        sim.faults.set_error(verb="create", resource="leases", rate=1.0, code=503)
        pod = gated_pod(cluster, "trainer")
        await anyio.sleep(3.0)
        # Backoff 0.5, 1, 2 s (jittered): a handful of tries in 3 s, not one per pass.
        tried = lease_creates(sim)
        assert 1 <= tried <= 5, tried
        assert gates(cluster, pod) == ["rgpu.io/admission"]
        sim.faults.set_error(verb="create", resource="leases", rate=0.0)
        await kit.wait_for(lambda: not gates(cluster, pod), what="admitted once it answers")
        assert holders(cluster) == {"gpu-a": ["trainer"]}


async def test_a_failed_admission_is_tried_again_when_its_backoff_ends_not_a_period_later(
    build, kit, sim, cluster
):
    # Nothing else wakes the admitter here: before, the retry waited for the next 2 s period
    # whatever its backoff (0.25-0.5 s for a first failure).
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery):
        sim.faults.set_error(verb="create", resource="leases", rate=1.0, code=503)
        before = lease_creates(sim)
        pod = gated_pod(cluster, "trainer")
        await kit.wait_for(lambda: lease_creates(sim) == before + 1, what="an admission failed")
        sim.faults.set_error(verb="create", resource="leases", rate=0.0)
        failed = time.monotonic()
        await kit.wait_for(lambda: not gates(cluster, pod), what="admitted once it answers")
        assert time.monotonic() - failed < PERIOD - 0.25
        assert lease_creates(sim) == before + 2


async def test_another_systems_gate_keeps_the_pod_out_until_it_is_lifted(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery):
        pod = gated_pod(cluster, "queued", gates=(KUEUE, GATE))
        await anyio.sleep(0.5)
        assert holders(cluster) == {}
        assert gates(cluster, pod) == ["kueue.x-k8s.io/admission", "rgpu.io/admission"]
        cluster.sim.store.patch(
            "pods", pod.name, {"spec": {"schedulingGates": [GATE]}}, namespace="ml"
        )
        await kit.wait_for(lambda: not gates(cluster, pod), what="rgpu's gate lifted")
        assert holders(cluster) == {"gpu-a": ["queued"]}


async def test_a_short_pool_goes_to_priority_then_to_the_first_created(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    first = gated_pod(cluster, "first", priority=10)
    second = gated_pod(cluster, "second", priority=10)
    urgent = gated_pod(cluster, "urgent", priority=1000)
    async with kit.running_allocator(sim.url, discovery, RGPU_PREEMPTION="off") as client:
        await kit.wait_for(
            lambda: sum(len(n) for n in holders(cluster).values()) == 2, what="two admitted"
        )
        held = sorted(n for names in holders(cluster).values() for n in names)
        assert held == ["first", "urgent"]
        assert gates(cluster, second) == ["rgpu.io/admission"]
        await kit.wait_for(lambda: events(cluster, second), what="the waiting Event")
        [event] = events(cluster, second)
        assert "NoFit" in event["message"]
        assert event["type"] == "Normal"

        async def only_second_waits() -> bool:
            queue = (await client.get("/v1/queue")).json()["pods"]
            return [(p["pod"]["name"], p["reason"]) for p in queue] == [("second", "NoFit")]

        await kit.wait_for(only_second_waits, what="the queue holds the second pod only")
        assert not gates(cluster, first) and not gates(cluster, urgent)


async def test_a_pod_that_fits_only_what_a_higher_priority_pod_waits_for_waits_behind_it(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=4)))
    settings = {"RGPU_GRANULARITY": "card", "RGPU_PREEMPTION": "off"}
    async with kit.running_allocator(sim.url, discovery, **settings) as client:
        holder = gated_pod(cluster, "holder", cards=2)
        await kit.wait_for(lambda: not gates(cluster, holder), what="the holder admitted")
        urgent = gated_pod(cluster, "urgent", cards=4, priority=1000)
        small = gated_pod(cluster, "small", cards=1, priority=10)

        async def queued() -> list[tuple[str, str]]:
            queue = (await client.get("/v1/queue")).json()["pods"]
            return sorted((p["pod"]["name"], p["reason"]) for p in queue)

        async def both_wait() -> bool:
            return await queued() == [("small", "BehindPriority"), ("urgent", "NoFit")]

        # The two free cards would take the small pod, but the urgent one waits for the server.
        await kit.wait_for(both_wait, what="the small pod behind the urgent one")
        await kit.wait_for(lambda: events(cluster, small), what="the waiting Event")
        [event] = events(cluster, small)
        assert "BehindPriority" in event["message"]
        assert "server gpu-a would fit but is kept for a waiting pod" in event["message"]
        assert "claims unreadable" not in event["message"]
        assert holders(cluster) == {"gpu-a": ["holder"]}
        assert gates(cluster, urgent) == gates(cluster, small) == ["rgpu.io/admission"]


async def test_a_pod_no_server_can_ever_take_waits_holding_nothing_and_is_told_why(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=4)))
    async with kit.running_allocator(sim.url, discovery) as client:
        big = gated_pod(cluster, "big", cards=16)
        small = gated_pod(cluster, "small")
        await kit.wait_for(lambda: not gates(cluster, small), what="the small pod admitted")
        await kit.wait_for(lambda: events(cluster, big), what="the never-fits Event")
        [event] = events(cluster, big)
        assert event["type"] == "Warning"
        assert "NeverFits" in event["message"]
        assert "largest server, gpu-a, has 4 card(s)" in event["message"]
        assert holders(cluster) == {"gpu-a": ["small"]}

        async def only_the_big_pod_waits() -> bool:
            entries = (await client.get("/v1/queue")).json()["pods"]
            found = [(e["pod"]["name"], e["reason"], e["cards"]) for e in entries]
            return found == [("big", "NeverFits", 16)]

        # The small pod leaves the queue once the pod watch delivers it without its gate.
        await kit.wait_for(only_the_big_pod_waits, what="only the big pod waits")


async def test_a_lone_pod_waits_for_capacity_behind_a_gang_of_its_ask_that_never_fits(
    build, kit, sim, cluster
):
    # A pass decides each shape of ask once; a gang too large for the fleet never fits, and a
    # lone pod of the same ask behind it must not be told so: it fits once a server frees.
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    async with kit.running_allocator(sim.url, discovery) as client:
        holders_ = [gated_pod(cluster, f"holder-{i}") for i in range(2)]
        await kit.wait_for(lambda: not any(gates(cluster, h) for h in holders_), what="held")
        for holder in holders_:
            cluster.bind(holder)
        gang = {"rgpu.io/gang": "trainer", "rgpu.io/gang-size": "3"}
        for i in range(3):
            gated_pod(cluster, f"worker-{i}", labels=gang)
        gated_pod(cluster, "lone")

        async def reasons() -> dict[str, str]:
            entries = (await client.get("/v1/queue")).json()["pods"]
            return {e["pod"]["name"]: e["reason"] for e in entries}

        async def all_four_decided() -> bool:
            return len(await reasons()) == 4

        await kit.wait_for(all_four_decided, what="four pods in line")
        assert await reasons() == {
            "worker-0": "NeverFits",
            "worker-1": "NeverFits",
            "worker-2": "NeverFits",
            "lone": "NoFit",
        }


async def test_a_waiting_pod_is_admitted_when_its_holder_goes(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery):
        holder = gated_pod(cluster, "holder")
        await kit.wait_for(lambda: not gates(cluster, holder), what="the holder admitted")
        cluster.bind(holder)
        waiter = gated_pod(cluster, "waiter")
        await anyio.sleep(0.3)
        assert gates(cluster, waiter) == ["rgpu.io/admission"]
        cluster.delete(holder)
        await kit.wait_for(lambda: not gates(cluster, waiter), what="the waiter admitted")
        assert holders(cluster) == {"gpu-a": ["waiter"]}


async def test_a_burst_is_admitted_one_pod_per_server(build, kit, sim, cluster):
    servers = [build.server(f"gpu-{i:02}") for i in range(24)]
    discovery = kit.FakeDiscovery(build.fleet(*servers))
    async with kit.running_allocator(sim.url, discovery, RGPU_ADMISSION_CONCURRENCY="8"):
        pods = [gated_pod(cluster, f"burst-{i:02}") for i in range(24)]
        await kit.wait_for(
            lambda: all(not gates(cluster, p) for p in pods), what="every pod admitted", timeout=20
        )
        assert sorted(len(n) for n in holders(cluster).values()) == [1] * 24


async def test_gated_pods_are_never_nudged(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery):
        holder = gated_pod(cluster, "holder")
        await kit.wait_for(lambda: not gates(cluster, holder), what="the holder admitted")
        waiters = [gated_pod(cluster, f"waiter-{i}") for i in range(3)]
        # Capacity appears elsewhere (a new server arrives and is taken), then the holder goes.
        cluster.bind(holder)
        cluster.delete(holder)
        await kit.wait_for(lambda: not gates(cluster, waiters[0]), what="the first admitted")
        await anyio.sleep(0.5)
        for pod in waiters:
            assert "rgpu.io/retry-at" not in cluster.annotations(pod)


async def test_a_pod_changed_between_booking_and_lift_is_still_admitted(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pod = gated_pod(cluster, "relabelled")
    async with kit.running_allocator(sim.url, discovery, wait=False) as client:
        # A label change moves the pod's resourceVersion past what the watch delivered first.
        cluster.sim.store.patch(
            "pods", pod.name, {"metadata": {"labels": {"x": "y"}}}, namespace="ml"
        )
        await kit.wait_fleet(client)
        await kit.wait_for(lambda: not gates(cluster, pod), what="the gate lifted")
        got = cluster.sim.store.get("pods", pod.name, namespace="ml")
        assert got["metadata"]["labels"] == {"x": "y"}


async def test_an_admitted_booking_not_bound_in_time_lapses_and_is_counted(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    env = {"RGPU_ADMISSION_TTL_SECONDS": "1", "RGPU_BOOKING_TTL_SECONDS": "1"}
    async with kit.running_allocator(sim.url, discovery, **env) as client:
        pod = gated_pod(cluster, "slow")
        await kit.wait_for(lambda: not gates(cluster, pod), what="the gate lifted")
        await kit.wait_for(lambda: not cluster.claims("gpu-a"), what="the booking lapsed")
        await kit.wait_for(lambda: events(cluster, pod, "RemoteGPUAdmissionLapsed"), what="Event")
        assert await metric(client, "rgpu_admissions_total", outcome="lapsed") == 1


async def test_a_pod_outside_every_allowed_domain_waits_for_a_client_node(build, kit, sim, cluster):
    zone = "topology.kubernetes.io/zone"
    discovery = kit.FakeDiscovery(
        build.fleet(build.server("gpu-a", labels={zone: "a"})),
        build.topology({"client-1": {zone: "a"}}),
    )
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": zone, "operator": "In", "values": ["b"]}]}
                ]
            }
        }
    }
    async with kit.running_allocator(sim.url, discovery):
        pod = gated_pod(cluster, "zone-b", spec={"affinity": affinity})
        await kit.wait_for(lambda: events(cluster, pod), what="the Event")
        assert "NoClientNode" in events(cluster, pod)[0]["message"]
        assert holders(cluster) == {}


async def test_claims_written_by_admission_read_back_as_admitted(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        pod = gated_pod(cluster, "reader")
        await kit.wait_for(lambda: not gates(cluster, pod), what="the gate lifted")
        answer = (await client.get(f"/v1/allocations/{pod.uid}")).json()
        lease = cluster.lease("gpu-a")
        assert lease is not None
        stored = orjson.loads(lease["metadata"]["annotations"]["rgpu.io/claims"])
        assert stored[0]["admissionTtlSeconds"] == 60
        assert answer["expiresAt"] - answer["bookedAt"] == pytest.approx(60)


def _terminating(cluster: Any, pod: PodRef) -> bool:
    try:
        got = cluster.sim.store.get("pods", pod.name, namespace=pod.namespace)
    except ApiError:
        return True
    return bool(got["metadata"].get("deletionTimestamp"))


async def test_a_pod_being_preempted_for_books_the_server_freed_for_it(build, kit, sim, cluster):
    # While the urgent pod's preemption is rehearsed (its dry-run evictions are slow, and it
    # nominates only after them), another server frees. Taking that one would then evict the
    # victim for nothing: a pod a preemption is under way for waits for it.
    discovery = kit.FakeDiscovery(
        build.fleet(build.server("gpu-a", cards=1), build.server("gpu-b", cards=1))
    )
    grace = {"terminationGracePeriodSeconds": 1}
    async with kit.running_allocator(sim.url, discovery, **BRISK):
        victim = gated_pod(cluster, "victim", priority=10, spec=grace)
        keeper = gated_pod(cluster, "keeper", priority=1000)
        await kit.wait_for(
            lambda: not gates(cluster, victim) and not gates(cluster, keeper), what="both admitted"
        )
        cluster.bind(victim)
        cluster.bind(keeper)
        [victims_server] = [s for s, names in holders(cluster).items() if names == ["victim"]]
        sim.faults.set_latency(verb="create", resource="pods/eviction", seconds=1.0)
        urgent = gated_pod(cluster, "urgent", priority=1000)
        await kit.wait_for(lambda: events(cluster, urgent), what="the urgent pod told it waits")
        cluster.delete(keeper)
        await kit.wait_for(lambda: _terminating(cluster, victim), what="the victim evicted")
        cluster.delete(victim)
        await kit.wait_for(lambda: not gates(cluster, urgent), what="the urgent pod admitted")
        assert holders(cluster) == {victims_server: ["urgent"]}


async def test_the_admitter_evicts_the_victims_an_eviction_shed_half_way_left(
    build, kit, sim, cluster
):
    # The apiserver sheds the second of two real evictions. The server stays promised to the
    # urgent pod, which waits for it (not for the other server, whose pods may finish first),
    # and the admitter's next pass evicts the victim left.
    fleet = build.fleet(build.server("gpu-a", cards=2), build.server("gpu-b", cards=2))
    discovery = kit.FakeDiscovery(fleet)
    grace = {"terminationGracePeriodSeconds": 1}
    env = {**BRISK, "RGPU_GRANULARITY": "card"}
    async with kit.running_allocator(sim.url, discovery, **env) as client:
        low = [gated_pod(cluster, f"low-{i}", priority=10, spec=grace) for i in (1, 2)]
        await kit.wait_for(lambda: not any(gates(cluster, p) for p in low), what="lows admitted")
        [lows_server] = holders(cluster)
        mid = [gated_pod(cluster, f"mid-{i}", priority=100, spec=grace) for i in (1, 2)]
        await kit.wait_for(lambda: not any(gates(cluster, p) for p in mid), what="mids admitted")
        for pod in (*low, *mid):
            cluster.bind(pod)
        evictions = {"verb": "create", "resource": "pods/eviction"}
        sim.faults.set_error(**evictions, rate=1.0, code=429, retry_after=1, skip=3)
        urgent = gated_pod(cluster, "urgent", cards=2, priority=1000)

        async def partial() -> bool:
            return await metric(client, "rgpu_allocator_preemptions_total", outcome="partial") == 1

        await kit.wait_for(partial, what="one victim evicted, the second shed")
        assert [_terminating(cluster, p) for p in low] == [True, False]
        sim.faults.set_error(**evictions, rate=0.0)
        for pod in mid:
            cluster.delete(pod)
        await kit.wait_for(lambda: _terminating(cluster, low[1]), what="the victim left evicted")
        for pod in low:
            cluster.delete(pod)
        await kit.wait_for(lambda: not gates(cluster, urgent), what="the urgent pod admitted")
        assert holders(cluster) == {lows_server: ["urgent"]}
        assert await metric(client, "rgpu_allocator_preemptions_total", outcome="resumed") == 1


async def test_a_gated_nominee_whose_server_goes_not_ready_is_admitted_to_another(
    build, kit, sim, cluster
):
    # Its server's Node went NotReady just after the eviction: held to it, the urgent pod
    # waited out the outage (a soak: 5 s, past its deadline) or its nomination (12 s).
    servers = {name: build.server(name, cards=1) for name in ("gpu-a", "gpu-b")}
    discovery = kit.FakeDiscovery(build.fleet(*servers.values()))
    grace = {"terminationGracePeriodSeconds": 30}
    async with kit.running_allocator(sim.url, discovery, **BRISK):
        low = [gated_pod(cluster, f"low-{i}", priority=10, spec=grace) for i in (1, 2)]
        await kit.wait_for(lambda: not any(gates(cluster, p) for p in low), what="lows admitted")
        for pod in low:
            cluster.bind(pod)
        on = {names[0]: server for server, names in holders(cluster).items()}
        urgent = gated_pod(cluster, "urgent", priority=1000)
        await kit.wait_for(
            lambda: any(_terminating(cluster, p) for p in low), what="the first victim evicted"
        )
        first, second = sorted(low, key=lambda p: not _terminating(cluster, p))
        broken = dataclasses.replace(servers[on[first.name]], ready=False)
        discovery.publish(broken, servers[on[second.name]])
        await kit.wait_for(lambda: _terminating(cluster, second), what="the second server freed")
        cluster.delete(second)
        await kit.wait_for(lambda: not gates(cluster, urgent), what="the urgent pod admitted")
        assert holders(cluster)[on[second.name]] == ["urgent"]


async def test_an_admitted_booking_committed_but_not_yet_bound_keeps_the_admission_ttl(
    build, kit, sim, cluster
):
    # The Binding after the commit failed or took longer than the budget: the pod goes back
    # through kube-scheduler's queue, as after the gate was lifted. Its booking must outlive
    # the short booking TTL there, or the retry books again through the filter path, past
    # its namespace's quota, its gang and fair share.
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    env = {"RGPU_ADMISSION_TTL_SECONDS": "60", "RGPU_BOOKING_TTL_SECONDS": "1"}
    async with kit.running_allocator(sim.url, discovery, **env) as client:
        pod = gated_pod(cluster, "retried")
        await kit.wait_for(lambda: not gates(cluster, pod), what="the gate lifted")
        commit = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "client-1"})
        assert commit.status_code == 200, commit.text
        await anyio.sleep(2.5)  # past the booking TTL and a sweep (a third of it)
        [claim] = cluster.claims("gpu-a")
        assert claim["pod"]["name"] == "retried"
        assert claim["state"] == "committed"


async def test_a_booking_released_behind_the_ledgers_back_lifts_no_gate_until_booked_again(
    build, kit, sim, cluster
):
    # The ledger follows a Lease watch. A booking released where the watch cannot see it must
    # not let the gate be lifted with nothing booked behind it (the pod would book again
    # through kube-scheduler's filter, past its quota and apart from its gang).
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery, **BRISK):
        sim.faults.set_error(verb="patch", resource="pods", rate=1.0, code=500)
        pod = gated_pod(cluster, "trainer")
        await kit.wait_for(lambda: holders(cluster) == {"gpu-a": ["trainer"]}, what="booked")
        for verb in ("watch", "list"):
            sim.faults.set_error(verb=verb, resource="leases", rate=1.0, code=500)
        sim.faults.cut_watches()
        cluster.sim.store.delete("leases", "rgpu-gpu-a", namespace="rgpu-system")
        # A retry that read the Lease back just before the delete may be lifting the gate now:
        # no check can stop a delete between a read and the write after it. Let such a lift
        # meet the failing patches; only retries after the delete are judged.
        await anyio.sleep(0.5)
        sim.faults.set_error(verb="patch", resource="pods", rate=0.0)
        await kit.wait_for(lambda: not gates(cluster, pod), what="the gate lifted", timeout=30)
        assert holders(cluster) == {"gpu-a": ["trainer"]}


async def test_a_victim_whose_gate_is_being_lifted_keeps_its_booking(build, kit, sim, cluster):
    # Its gate may be lifted at any moment: taking its booking back then would leave it through
    # the gate with nothing booked, and kube-scheduler's binds would fail until it booked again
    # through the filter, past its quota. It is preempted only once through, like any other.
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    async with kit.running_allocator(sim.url, discovery, **BRISK):
        sim.faults.set_latency(verb="patch", resource="pods", seconds=2.0)
        low = gated_pod(cluster, "low", priority=10)
        await kit.wait_for(lambda: holders(cluster) == {"gpu-a": ["low"]}, what="low booked")
        gated_pod(cluster, "urgent", priority=1000)

        def through() -> bool:
            # Once through the gate it is an ordinary victim, and may be evicted at once.
            found = cluster.sim.store.list("pods", namespace=low.namespace)
            return not any(p["metadata"]["name"] == "low" and gates(cluster, low) for p in found)

        await kit.wait_for(through, what="low's gate lifted", timeout=20)
        preempted = events(cluster, low, reason="Preempted")
        assert [e for e in preempted if "taken back" in e["message"]] == []


async def test_the_member_a_gang_left_behind_the_gate_keeps_its_booking(build, kit, sim, cluster):
    # A gang is booked whole before any gate is lifted. When one lift fails, the member left
    # behind is the rest of an admitted gang: taking its booking back would leave its sibling
    # running alone, and itself waiting for good once the sibling ends ("1 of 2 members exist").
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    async with kit.running_allocator(sim.url, discovery, **BRISK) as client:
        sim.faults.set_error(verb="patch", resource="pods", rate=1.0, code=500)
        gang = {"rgpu.io/gang": "pair", "rgpu.io/gang-size": "2"}
        first = gated_pod(cluster, "pair-0", priority=10, labels={**gang, "app": "pair-0"})
        rest = gated_pod(cluster, "pair-1", priority=10, labels=gang)

        def booked() -> list[str]:
            return sorted(name for names in holders(cluster).values() for name in names)

        await kit.wait_for(lambda: booked() == ["pair-0", "pair-1"], what="the gang booked")
        # pair-0's lift went through and it runs under a budget that spares nobody; pair-1's
        # lifts keep failing. The only server left to free for an urgent pod is pair-1's.
        cluster.sim.store.patch(
            "pods", "pair-0", {"spec": {"schedulingGates": None}}, namespace="ml"
        )
        cluster.bind(first)
        ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        cluster.sim.store.patch("pods", "pair-0", ready, namespace="ml", subresource="status")
        budget = {
            "metadata": {"name": "pair-0", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pair-0"}}},
        }
        cluster.sim.store.create("poddisruptionbudgets", budget, namespace="ml")
        gated_pod(cluster, "urgent", priority=1000)

        async def tried() -> bool:
            return await metric(client, "rgpu_allocator_preemptions_total") > 0

        await kit.wait_for(tried, what="a preemption tried")
        preempted = events(cluster, rest, reason="Preempted")
        assert [e for e in preempted if "taken back" in e["message"]] == []
        assert booked() == ["pair-0", "pair-1"]


async def test_a_victim_still_behind_the_gate_loses_its_booking_not_the_pod(
    build, kit, sim, cluster
):
    # A booked pod whose gate could not be lifted yet has never run: preempting it takes its
    # booking back and leaves it waiting in the queue (evicting it would delete it, and a gang
    # would wait forever for a member nobody recreates).
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    async with kit.running_allocator(sim.url, discovery, **BRISK):
        sim.faults.set_error(verb="patch", resource="pods", rate=1.0, code=500)
        low = gated_pod(cluster, "low", priority=10)
        await kit.wait_for(lambda: holders(cluster) == {"gpu-a": ["low"]}, what="low booked")
        urgent = gated_pod(cluster, "urgent", priority=1000)
        await kit.wait_for(
            lambda: holders(cluster) == {"gpu-a": ["urgent"]}, what="the booking taken back"
        )
        assert gates(cluster, low) == ["rgpu.io/admission"]
        assert events(cluster, low, reason="Preempted")
        sim.faults.clear()
        await kit.wait_for(lambda: not gates(cluster, urgent), what="the urgent pod admitted")
        assert gates(cluster, low) == ["rgpu.io/admission"]
