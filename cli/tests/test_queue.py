"""``rgpu queue`` against a real allocator on loopback (kubesim behind it, discovery faked at
the transport): two teams share a two-server pool, one of them capped by its quota."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

import rgpu_testkit as testkit
from rgpu_allocator import create_app
from rgpu_allocator.settings import AllocatorSettings
from rgpu_cli.main import app as cli
from rgpu_kubesim import run_apiserver
from rgpu_runtime.serving import Listener, running

pytestmark = pytest.mark.anyio

COUNT = "nvidia.com/remote-gpu"


def gated(store: Any, name: str, namespace: str) -> None:
    manifest = testkit.pod_manifest(
        name=name,
        namespace=namespace,
        scheduler="rgpu-scheduler",
        containers=[testkit.container_manifest(name="main", limits={COUNT: "1"})],
        spec={"schedulingGates": [{"name": "rgpu.io/admission"}]},
    )
    store.create("pods", manifest)


def lifted(store: Any, name: str, namespace: str) -> bool:
    got = store.get("pods", name, namespace=namespace)
    return not got["spec"].get("schedulingGates")


@pytest.fixture
async def allocator_url() -> AsyncIterator[tuple[str, Any]]:
    async with run_apiserver() as sim:
        for namespace in ("team-a", "team-b", "rgpu-system"):
            sim.store.create("namespaces", {"metadata": {"name": namespace}})
        config = {"queues.yaml": "namespaces: {team-a: {cards: 1, weight: 2}}"}
        body = {"metadata": {"name": "rgpu-queues"}, "data": config}
        sim.store.create("configmaps", body, namespace="rgpu-system")
        servers = [testkit.server(name=f"gpu-{i}", cards=1) for i in range(2)]
        discovery = testkit.FakeDiscovery(testkit.fleet(servers=servers, revision=1))
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_AUTH": "none", "RGPU_LOG_LEVEL": "WARNING"}
        settings = AllocatorSettings.from_env(env)
        allocator = create_app(settings, discovery_transport=discovery.transport)
        listener = Listener(listen="127.0.0.1:0")
        async with running(allocator, listener) as (url,):
            yield url, sim.store


async def invoke(*args: str) -> Any:
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, list(args)))


async def test_queue_shows_waiting_pods_in_order_with_reasons_and_each_namespaces_share(
    allocator_url: tuple[str, Any],
) -> None:
    url, store = allocator_url
    for name, namespace in (
        ("a-0", "team-a"),
        ("b-0", "team-b"),
        ("a-1", "team-a"),
        ("b-1", "team-b"),
    ):
        gated(store, name, namespace)
    await testkit.eventually(
        lambda: lifted(store, "a-0", "team-a") and lifted(store, "b-0", "team-b"),
        what="one pod of each team admitted",
    )

    async def settled() -> bool:
        raw = json.loads((await invoke("queue", "-o", "json", "--allocator-url", url)).output)
        return [p["pod"]["name"] for p in raw["pods"]] == ["a-1", "b-1"]

    await testkit.eventually(settled, what="the two waiting pods in the queue")
    table = await invoke("queue", "--allocator-url", url)
    assert table.exit_code == 0, table.output
    assert "team-a/a-1" in table.output and "QuotaExceeded" in table.output
    assert "team-b/b-1" in table.output and "NoFit" in table.output
    raw = json.loads((await invoke("queue", "-o", "json", "--allocator-url", url)).output)
    shares = {n["namespace"]: (n["held"], n["quota"], n["weight"]) for n in raw["namespaces"]}
    assert shares["team-a"] == (1, 1, 2)
    assert shares["team-b"] == (1, None, 1)
    only_b = json.loads(
        (await invoke("queue", "-o", "json", "-n", "team-b", "--allocator-url", url)).output
    )
    assert [p["pod"]["name"] for p in only_b["pods"]] == ["b-1"]


async def test_queue_without_an_allocator_names_the_url_and_the_variable() -> None:
    result = await invoke("queue", "--allocator-url", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert "http://127.0.0.1:9/v1/queue" in result.output
    assert "RGPU_ALLOCATOR_URL" in result.output
