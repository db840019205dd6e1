"""``/filter`` with a pool run by operators: a Node that runs one lupine per GPU is still a
server Node (its instances are named ``<node>@<port>``), and a pod's CUDA major reaches the
allocator."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from rgpu_contracts import NodeName

pytestmark = pytest.mark.anyio

SERVER_REASON = "node serves the remote GPU pool"


async def test_a_node_running_lupine_instances_is_never_a_candidate(
    extender, allocator, discovery, make, build
) -> None:
    instances = [
        dataclasses.replace(make.server(f"gpu-i@{port}"), node=NodeName("gpu-i"))
        for port in (14834, 14835)
    ]
    discovery.publish(*instances)
    args = build.filter_args(build.pod(), ["gpu-i", "cpu-node-1"])
    with anyio.fail_after(5):
        while "gpu-i" not in (
            (reply := await filtered(extender, args))["FailedAndUnresolvableNodes"] or {}
        ):
            await anyio.sleep(0.01)
    assert reply["NodeNames"] == ["cpu-node-1"]
    assert SERVER_REASON in reply["FailedAndUnresolvableNodes"]["gpu-i"]
    assert allocator.requests[-1].candidate_nodes == ("cpu-node-1",)


async def filtered(extender, args) -> dict:
    response = await extender.client.post("/filter", json=args)
    assert response.status_code == 200
    return dict(response.json())


async def test_the_cuda_major_label_goes_to_the_allocator(extender, allocator, build) -> None:
    pod = build.pod()
    pod["metadata"]["labels"] = {"rgpu.io/cuda-major": "12"}
    reply = await extender.client.post("/filter", json=build.filter_args(pod, ["cpu-node-1"]))
    assert reply.status_code == 200
    (request,) = allocator.requests
    assert request.cuda_major == 12


async def test_an_unreadable_cuda_major_label_makes_the_pod_unschedulable_everywhere(
    extender, allocator, build
) -> None:
    pod = build.pod()
    pod["metadata"]["labels"] = {"rgpu.io/cuda-major": "twelve"}
    args = build.filter_args(pod, ["cpu-node-1", "gpu-node-1"])
    reply = (await extender.client.post("/filter", json=args)).json()
    unresolvable = reply["FailedAndUnresolvableNodes"]
    assert set(unresolvable) == {"cpu-node-1", "gpu-node-1"}
    assert "rgpu.io/cuda-major" in unresolvable["cpu-node-1"]
    assert allocator.requests == []


def test_the_webhook_denies_an_unreadable_cuda_major_label_naming_it(build) -> None:
    from rgpu_extender.admission import AdmissionPolicy, decide

    pod = build.pod()
    pod["metadata"]["labels"] = {"rgpu.io/cuda-major": "12.4"}
    decision = decide(build.review(pod), AdmissionPolicy.from_settings(build.settings()))
    response = decision.review["response"]
    assert response["allowed"] is False
    assert "rgpu.io/cuda-major='12.4'" in response["status"]["message"]
    ok = build.pod()
    ok["metadata"]["labels"] = {"rgpu.io/cuda-major": "12"}
    assert decide(build.review(ok), AdmissionPolicy.from_settings(build.settings())).allowed
