"""``rgpu explain`` shows a nomination and its victims for a preempting pod (DESIGN §11)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from rgpu_cli.explain import (
    CLAIM_LEASES,
    Explanation,
    Nominated,
    find_nomination,
    nomination_in,
    render_explanation,
)
from rgpu_contracts import CardId, PodRef, PodUID
from rgpu_kubesim import run_apiserver
from rgpu_placement import ANNOTATION_NOMINATION, Nomination
from rgpu_runtime import Settings, kube_client

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
