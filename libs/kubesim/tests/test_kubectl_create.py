"""Every ``kubectl create`` generator for a kind the simulator serves, and ``kubectl drain``:
the real kubectl binary sends these as protobuf (``application/vnd.kubernetes.protobuf``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from rgpu_kubesim import SimApiServer

from .conftest import Kubectl

pytestmark = [pytest.mark.anyio, pytest.mark.process]


async def test_create_namespace_makes_an_active_namespace(
    kubectl: Kubectl, sim: SimApiServer
) -> None:
    assert "namespace/ml created" in await kubectl("create", "namespace", "ml")
    stored = sim.store.get("namespaces", "ml")
    assert stored["status"]["phase"] == "Active"
    assert stored["metadata"]["labels"] == {"kubernetes.io/metadata.name": "ml"}


async def test_create_configmap_from_literals_and_a_binary_file_then_list_it(
    kubectl: Kubectl, sim: SimApiServer, tmp_path: Path
) -> None:
    blob = tmp_path / "weights.bin"
    blob.write_bytes(b"\x00\x01\xff")
    args = ("--from-literal=queues=research", "--from-literal=empty=", f"--from-file={blob}")
    assert "configmap/rgpu-queues created" in await kubectl(
        "create", "configmap", "rgpu-queues", *args
    )
    stored = sim.store.get("configmaps", "rgpu-queues")
    assert stored["data"] == {"queues": "research", "empty": ""}
    assert base64.b64decode(stored["binaryData"]["weights.bin"]) == b"\x00\x01\xff"
    table = (await kubectl("get", "configmaps")).splitlines()
    assert table[0].split() == ["NAME", "DATA", "AGE"]
    assert table[1].split()[:2] == ["rgpu-queues", "3"]


async def test_create_priorityclass_keeps_a_zero_value_and_the_policy(
    kubectl: Kubectl, sim: SimApiServer
) -> None:
    await kubectl(
        "create",
        "priorityclass",
        "inference",
        "--value=1000",
        "--description=serving first",
        "--preemption-policy=Never",
    )
    await kubectl("create", "priorityclass", "batch", "--value=0")
    inference = sim.store.get("priorityclasses", "inference")
    assert (inference["value"], inference["description"]) == (1000, "serving first")
    assert inference["preemptionPolicy"] == "Never"
    batch = sim.store.get("priorityclasses", "batch")
    assert (batch["value"], batch["preemptionPolicy"]) == (0, "PreemptLowerPriority")


async def test_create_poddisruptionbudget_with_a_percentage_or_a_zero_bound(
    kubectl: Kubectl, sim: SimApiServer
) -> None:
    await kubectl("create", "pdb", "trainers", "--selector=app=train", "--min-available=50%")
    await kubectl("create", "pdb", "serving", "--selector=app=serve", "--max-unavailable=0")
    trainers = sim.store.get("poddisruptionbudgets", "trainers")["spec"]
    assert trainers == {"minAvailable": "50%", "selector": {"matchLabels": {"app": "train"}}}
    serving = sim.store.get("poddisruptionbudgets", "serving")["spec"]
    assert serving == {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "serve"}}}


async def test_create_serviceaccount_and_a_token_for_it_with_audiences_and_duration(
    kubectl: Kubectl, sim: SimApiServer
) -> None:
    assert "serviceaccount/robot created" in await kubectl("create", "serviceaccount", "robot")
    token = await kubectl("create", "token", "robot", "--audience=rgpu-allocator", "--duration=10m")
    payload = token.strip().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["aud"] == ["rgpu-allocator"]
    assert claims["exp"] - claims["iat"] == 600
    assert claims["sub"] == "system:serviceaccount:default:robot"


async def test_drain_evicts_through_the_eviction_api_and_uncordon_undoes_the_cordon(
    kubectl: Kubectl, sim: SimApiServer
) -> None:
    sim.store.create("nodes", {"metadata": {"name": "gpu-a"}})
    pod = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "m", "image": "x:1"}]}}
    sim.store.create("pods", pod)
    sim.store.bind("web", "gpu-a")
    out = await kubectl("drain", "gpu-a", "--force", "--grace-period=0", "--timeout=20s")
    assert "pod/web evicted" in out and "node/gpu-a drained" in out
    assert sim.store.list("pods") == []
    assert sim.store.get("nodes", "gpu-a")["spec"]["unschedulable"] is True
    await kubectl("uncordon", "gpu-a")
    assert not sim.store.get("nodes", "gpu-a")["spec"].get("unschedulable")


async def test_generators_for_kinds_the_simulator_does_not_serve_fail_with_not_found(
    kubectl: Kubectl,
) -> None:
    with pytest.raises(AssertionError, match="the server could not find the requested resource"):
        await kubectl("create", "deployment", "web", "--image=nginx:1")
