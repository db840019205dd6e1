"""Repair restores what rgpu itself wrote: a pod booked, committed and bound through the
allocator, whose Lease is then deleted, gets its claim back in either granularity, whatever
its containers; and ``vet``'s rules, one by one, on annotations rgpu would not have written."""

from __future__ import annotations

import pytest

import rgpu_testkit as testkit
from rgpu_allocator.claims import lease_name
from rgpu_allocator.pods import pod_info
from rgpu_allocator.vetting import Untrusted, vet
from rgpu_contracts import ANNOTATION_ALLOCATED, Claim, PodRef, PodUID
from rgpu_placement import FleetView
from rgpu_runtime.settings import ResourceSettings

pytestmark = pytest.mark.anyio

COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"


def job_manifest(annotations: dict[str, str] | None = None, *, node: str | None = None):
    """A pod with an init container (no GPU) and two app containers asking 1 and 2 cards."""
    return testkit.pod_manifest(
        name="job",
        namespace="ml",
        uid="job-uid",
        scheduler="rgpu-scheduler",
        node=node,
        annotations=annotations,
        init_containers=[testkit.container_manifest(name="setup")],
        containers=[
            testkit.container_manifest(name="a", limits={COUNT: "1", MEMORY: "30000"}),
            testkit.container_manifest(name="b", limits={COUNT: "2"}),
        ],
    )


def job_ask(build, kit, pod: PodRef) -> dict[str, object]:
    return kit.ask(
        pod,
        build.container("setup", count=0, kind="init"),
        build.container("a", count=1, memory=30000),
        build.container("b", count=2),
    )


@pytest.mark.parametrize("granularity", ["server", "card"])
async def test_claim_rgpu_committed_is_restored_after_its_lease_is_deleted(
    build, kit, sim, cluster, granularity
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=4)))
    made = sim.store.create("pods", job_manifest())
    pod = PodRef(uid=PodUID(made["metadata"]["uid"]), namespace="ml", name="job")
    env = {"RGPU_GRANULARITY": granularity}
    async with kit.running_allocator(sim.url, discovery, **env) as client:
        assert (await client.post("/v1/allocations", json=job_ask(build, kit, pod))).is_success
        committed = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "c-1"})
        annotations = committed.json()["annotations"]
        sim.store.bind("job", "c-1", namespace="ml", uid=pod.uid, annotations=annotations)
        cluster.phase(pod, "Running")
        await kit.wait_for(lambda: [c["state"] for c in cluster.claims("gpu-a")] == ["bound"])
        before = cluster.claims("gpu-a")
        sim.store.delete("leases", lease_name("gpu-a"), namespace="rgpu-system")
        await kit.wait_for(lambda: cluster.holders().get("gpu-a") == ["job"])

        async def counted() -> bool:
            # The Lease holds the claim before the write's answer reaches the counter.
            text = (await client.get("/metrics")).text
            return 'rgpu_allocator_repairs_total{outcome="repaired"} 1.0' in text

        await kit.wait_for(counted, what="the repair counted")
        metrics = (await client.get("/metrics")).text
    after = cluster.claims("gpu-a")
    assert [sorted(c["cards"]) for c in after] == [sorted(c["cards"]) for c in before]
    assert after[0]["containers"] == before[0]["containers"]
    assert 'rgpu_allocator_repairs_total{outcome="repaired"} 1.0' in metrics
    assert 'rgpu_allocator_repairs_total{outcome="refused_untrusted"} 0.0' in metrics


# --- vet, rule by rule -------------------------------------------------------------------


def card(build, index: int, server: str = "gpu-a") -> str:
    return f"{server}/{build.uuid(server, index)},RemoteGPU,40000,100:"


def judged(build, allocated: str, granularity: str = "card", *, memory=(40000,) * 4):
    view = FleetView.build(
        build.fleet(build.server("gpu-a", cards=4, memory=list(memory))), None, ()
    )
    raw = job_manifest({ANNOTATION_ALLOCATED: allocated}, node="c-1")
    pod = pod_info(raw)
    assert pod is not None
    return vet(
        raw,
        pod,
        view=view,
        resources=ResourceSettings(),
        granularity=granularity,  # type: ignore[arg-type]
        now=1.0,
    )


def test_vet_accepts_the_card_split_rgpu_assigns(build):
    # the init container asks for nothing; a gets the first card, b the next 2
    got = judged(build, f";{card(build, 0)};{card(build, 1)}{card(build, 2)};")
    assert isinstance(got, Claim)
    assert [a.name for a in got.containers] == ["setup", "a", "b"]


def test_vet_refuses_cards_given_to_a_container_that_asks_for_none(build):
    got = judged(build, f"{card(build, 0)};{card(build, 1)};{card(build, 2)};")
    assert isinstance(got, Untrusted)
    assert got.why == "its cards per container differ from what rgpu assigns"


@pytest.mark.parametrize(
    ("allocated", "why"),
    [
        (";x;", "cannot be read"),
        (";;", "container parts"),
        (";;;", "names no card"),
    ],
)
def test_vet_refuses_annotations_that_do_not_match_the_pods_containers(build, allocated, why):
    got = judged(build, allocated)
    assert isinstance(got, Untrusted)
    assert why in got.why


def test_vet_refuses_a_card_split_other_than_rgpus(build):
    got = judged(build, f";{card(build, 2)};{card(build, 0)}{card(build, 1)};")
    assert isinstance(got, Untrusted)
    assert got.why == "its cards per container differ from what rgpu assigns"


def test_vet_refuses_cards_smaller_than_the_pod_asks_in_card_granularity(build):
    allocated = f";{card(build, 0)};{card(build, 1)}{card(build, 2)};"
    got = judged(build, allocated, memory=(20000, 40000, 40000, 40000))
    assert isinstance(got, Untrusted)
    assert "has 20000 MiB, less than the 30000 MiB" in got.why


def test_vet_refuses_a_card_the_server_does_not_have(build):
    ghost = "gpu-a/GPU-ghost,RemoteGPU,40000,100:"
    got = judged(build, f";{ghost};{card(build, 1)}{card(build, 2)};")
    assert isinstance(got, Untrusted)
    assert got.why == "server gpu-a has no card gpu-a/GPU-ghost"
