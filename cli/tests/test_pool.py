"""``rgpu cordon``, ``uncordon``, ``drain`` and ``usage`` against kubesim over HTTP (the real
kubernetes-asyncio client), and ``usage`` against a Prometheus query API served on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import anyio.to_thread
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from typer.testing import CliRunner

import rgpu_testkit as testkit
from rgpu_cli.cordon import CordonError, cordon
from rgpu_cli.drain import holders_in
from rgpu_cli.main import app
from rgpu_cli.usage import SpanError, from_claims, from_prometheus, parse_since
from rgpu_contracts import ClaimSet, PodRef, PodUID
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.serving import Listener, running
from rgpu_runtime.settings import Settings

pytestmark = pytest.mark.anyio

GPUS = tuple(f"GPU-{i}" for i in range(4))
INSTANCES = json.dumps(
    [{"port": 14834, "gpus": ["GPU-0", "GPU-1"]}, {"port": 14835, "gpus": ["GPU-2", "GPU-3"]}]
)


@pytest.fixture
async def sim() -> AsyncIterator[SimApiServer]:
    async with run_apiserver() as server:
        for namespace in ("ml", "rgpu-system"):
            server.store.create("namespaces", {"metadata": {"name": namespace}})
        register = testkit.register_annotation(
            testkit.register_card(uuid=uuid, index=i) for i, uuid in enumerate(GPUS)
        )
        server.store.create(
            "nodes",
            testkit.node_manifest(
                name="gpu-a",
                labels={"hami.io/lupine-server": "14833"},
                annotations={"hami.io/node-nvidia-register": register},
            ),
        )
        server.store.create(
            "nodes",
            testkit.node_manifest(
                name="gpu-b",
                labels={"hami.io/lupine-server": ""},
                annotations={
                    "hami.io/node-nvidia-register": register,
                    "rgpu.io/lupine-instances": INSTANCES,
                },
            ),
        )
        server.store.create("nodes", testkit.node_manifest(name="client-1"))
        yield server


def settings(sim: SimApiServer) -> Settings:
    return Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="extender")


def node(sim: SimApiServer, name: str) -> dict[str, Any]:
    return sim.store.get("nodes", name)


def device_cordon(sim: SimApiServer, name: str) -> str | None:
    return (node(sim, name)["metadata"].get("annotations") or {}).get("hami.io/device-cordon")


async def test_cordon_and_uncordon_a_whole_server(sim) -> None:
    done = await cordon(settings(sim), "gpu-a")
    assert (done.unschedulable, done.changed) == (True, True)
    assert node(sim, "gpu-a")["spec"]["unschedulable"] is True
    again = await cordon(settings(sim), "gpu-a")
    assert again.changed is False
    await cordon(settings(sim), "gpu-a", on=False)
    assert not node(sim, "gpu-a")["spec"].get("unschedulable")


async def test_cordoning_cards_writes_hamis_device_cordon_and_uncordoning_removes_it(sim) -> None:
    await cordon(settings(sim), "gpu-a", cards=["GPU-2"])
    await cordon(settings(sim), "gpu-a", cards=["GPU-0", "GPU-2"])
    assert device_cordon(sim, "gpu-a") == "GPU-0,GPU-2"
    assert not node(sim, "gpu-a")["spec"].get("unschedulable")
    await cordon(settings(sim), "gpu-a", cards=["GPU-0", "GPU-2"], on=False)
    assert device_cordon(sim, "gpu-a") is None


async def test_cordoning_an_instance_cordons_its_cards_only(sim) -> None:
    done = await cordon(settings(sim), "gpu-b@14835")
    assert done.cards == ("GPU-2", "GPU-3") and not done.unschedulable
    await cordon(settings(sim), "gpu-b@14834")
    await cordon(settings(sim), "gpu-b@14835", on=False)
    assert device_cordon(sim, "gpu-b") == "GPU-0,GPU-1"


@pytest.mark.parametrize(
    ("server", "cards", "said"),
    [
        ("nowhere", (), "no node nowhere"),
        ("client-1", (), "not a lupine server"),
        ("gpu-a", ("GPU-9",), "GPU-9 not served by gpu-a"),
        ("gpu-b@1", (), "runs no lupine on port 1"),
        ("gpu-b@14834", ("GPU-2",), "GPU-2 not served by gpu-b@14834"),
    ],
)
async def test_cordon_refuses_what_it_cannot_do_and_says_why(sim, server, cards, said) -> None:
    with pytest.raises(CordonError, match=said):
        await cordon(settings(sim), server, cards=cards)


def make_pod(sim: SimApiServer, name: str, **spec: object) -> PodRef:
    manifest = testkit.pod_manifest(
        name=name,
        namespace="ml",
        node="client-1",
        labels={"app": name},
        spec={"terminationGracePeriodSeconds": 0, **spec},
    )
    made = sim.store.create("pods", manifest)
    # Running and Ready, as a budget counts a pod healthy (Pending pods bypass budgets).
    ready = [{"type": "Ready", "status": "True"}]
    status = {"status": {"phase": "Running", "conditions": ready}}
    sim.store.patch("pods", name, status, namespace="ml", subresource="status")
    return PodRef(uid=PodUID(made["metadata"]["uid"]), namespace="ml", name=name)


def claim_lease(sim: SimApiServer, server: str, *pods: PodRef) -> None:
    claims = [testkit.claim(server=server, pod=pod, state="bound").to_dict() for pod in pods]
    sim.store.create(
        "leases",
        {
            "metadata": {
                "name": f"rgpu-{len(sim.store.list('leases', namespace='rgpu-system'))}",
                "namespace": "rgpu-system",
                "labels": {"app.kubernetes.io/managed-by": "rgpu"},
                "annotations": {"rgpu.io/server": server, "rgpu.io/claims": json.dumps(claims)},
            },
            "spec": {},
        },
    )


async def invoke(args: Sequence[str], env: dict[str, str]):
    # The command runs its own event loop; kubesim keeps serving in this one.
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(app, list(args), env=env))


def exists(sim: SimApiServer, pod: PodRef) -> bool:
    return any(p["metadata"]["uid"] == pod.uid for p in sim.store.list("pods", namespace="ml"))


async def test_drain_cordons_evicts_the_holders_of_that_server_only_and_exits_0(sim) -> None:
    first, second, other = (make_pod(sim, n) for n in ("first", "second", "other"))
    claim_lease(sim, "gpu-b@14834", first)
    claim_lease(sim, "gpu-b@14835", second)
    claim_lease(sim, "gpu-a", other)
    result = await invoke(["drain", "gpu-b@14834", "--timeout", "10"], {"RGPU_KUBE_URL": sim.url})
    assert result.exit_code == 0, result.output
    assert "evicting ml/first" in result.output and "gpu-b@14834 drained" in result.output
    assert not exists(sim, first)
    assert exists(sim, second) and exists(sim, other)
    assert device_cordon(sim, "gpu-b") == "GPU-0,GPU-1"


async def test_drain_of_a_node_moves_every_instance_s_holders(sim) -> None:
    first, second = make_pod(sim, "first"), make_pod(sim, "second")
    claim_lease(sim, "gpu-b@14834", first)
    claim_lease(sim, "gpu-b@14835", second)
    result = await invoke(["drain", "gpu-b", "--timeout", "10"], {"RGPU_KUBE_URL": sim.url})
    assert result.exit_code == 0, result.output
    assert not exists(sim, first) and not exists(sim, second)
    assert node(sim, "gpu-b")["spec"]["unschedulable"] is True


async def test_a_budget_that_forbids_the_eviction_leaves_the_drain_unfinished_with_exit_1(
    sim,
) -> None:
    guarded = make_pod(sim, "guarded")
    claim_lease(sim, "gpu-a", guarded)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": "ml"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    sim.store.create("poddisruptionbudgets", budget)
    result = await invoke(["drain", "gpu-a", "--timeout", "2"], {"RGPU_KUBE_URL": sim.url})
    assert result.exit_code == 1, result.output
    assert "disruption budget forbids it" in result.output
    assert "still held by ml/guarded" in result.output
    assert exists(sim, guarded)
    sim.store.delete("poddisruptionbudgets", "guarded", namespace="ml")
    result = await invoke(["drain", "gpu-a", "--timeout", "10"], {"RGPU_KUBE_URL": sim.url})
    assert result.exit_code == 0, result.output


async def test_drain_of_something_that_is_not_a_server_exits_2(sim) -> None:
    result = await invoke(["drain", "client-1"], {"RGPU_KUBE_URL": sim.url})
    assert result.exit_code == 2
    assert "not a lupine server" in result.output


def test_holders_are_read_from_the_claim_leases_and_unreadable_claims_skipped() -> None:
    pod = testkit.pod_ref(name="p", namespace="ml", uid="u1")
    good = {
        "rgpu.io/server": "gpu-a",
        "rgpu.io/claims": json.dumps([testkit.claim(server="gpu-a", pod=pod).to_dict()]),
    }
    bad = {"rgpu.io/server": "gpu-a@1", "rgpu.io/claims": "{not json"}
    leases = [{"metadata": {"annotations": good}}, {"metadata": {"annotations": bad}}]
    assert holders_in(leases, "gpu-a") == (pod,)
    assert holders_in(leases, "gpu-a@2") == ()


def test_usage_from_the_claims_counts_cards_held_and_hours_within_the_window() -> None:
    pods = [
        testkit.pod_ref(name=f"p{i}", namespace=ns, uid=f"u{i}")
        for i, ns in enumerate(["a", "a", "b"])
    ]
    claims = ClaimSet(
        revision=1,
        claims=(
            testkit.claim(server="gpu-a", cards=(0, 1), pod=pods[0], booked_at=0.0),
            testkit.claim(server="gpu-b", cards=(0,), pod=pods[1], booked_at=5400.0),
            testkit.claim(server="gpu-c", cards=(0,), pod=pods[2], booked_at=7200.0 - 60),
        ),
    )
    usage = from_claims(claims, 3600.0, now=7200.0)
    rows = {r.namespace: (round(r.card_hours, 3), r.held_now) for r in usage.rows}
    # a: 2 cards for the whole hour + 1 card for half an hour; b: one card for a minute.
    assert rows == {"a": (2.5, 3), "b": (round(1 / 60, 3), 1)}
    assert [r.namespace for r in usage.rows] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "seconds"), [("30m", 1800.0), ("24h", 86400.0), (" 7d ", 604800.0)]
)
def test_since_reads_prometheus_durations(text: str, seconds: float) -> None:
    assert parse_since(text)[1] == seconds


@pytest.mark.parametrize("text", ["", "1.5h", "-1h", "0s", "1y", "401d", "h"])
def test_since_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(SpanError, match="--since"):
        parse_since(text)


def prometheus_app(answer: Response, seen: list[str]) -> Starlette:
    async def query(request: Request) -> Response:
        seen.append(request.query_params["query"])
        return answer

    return Starlette(routes=[Route("/api/v1/query", query)])


async def test_usage_from_prometheus_sums_the_counter_increase_per_namespace() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"namespace": "a"}, "value": [1, "7200"]},
                {"metric": {"namespace": "b"}, "value": [1, "36000"]},
            ],
        },
    }
    seen: list[str] = []
    async with running(
        prometheus_app(JSONResponse(body), seen), Listener(listen="127.0.0.1:0")
    ) as urls:
        usage = await from_prometheus(urls[0], "7d")
    assert [(r.namespace, r.card_hours) for r in usage.rows] == [("b", 10.0), ("a", 2.0)]
    assert seen == ["sum by (namespace) (increase(rgpu_namespace_card_seconds_total[7d]))"]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (JSONResponse({"status": "error", "error": "parse error"}, status_code=400), "parse error"),
        (PlainTextResponse("gateway down", status_code=502), "without JSON"),
        (
            JSONResponse({"status": "success", "data": {"resultType": "matrix"}}),
            "no instant vector",
        ),
        (
            JSONResponse(
                {
                    "status": "success",
                    "data": {"resultType": "vector", "result": [{"value": [1, "x"]}]},
                }
            ),
            "unreadable sample",
        ),
    ],
)
async def test_usage_names_what_a_broken_prometheus_answered(answer: Response, said: str) -> None:
    async with running(prometheus_app(answer, []), Listener(listen="127.0.0.1:0")) as urls:
        with pytest.raises(ValueError, match=said):
            await from_prometheus(urls[0], "1h")


async def test_usage_without_prometheus_reads_the_claims_held_now() -> None:
    claims = ClaimSet(revision=3, claims=(testkit.claim(server="gpu-a", cards=(0, 1)),))

    async def answer(request: Request) -> Response:
        return JSONResponse(claims.to_dict())

    api = Starlette(routes=[Route("/v1/claims", answer)])
    async with running(api, Listener(listen="127.0.0.1:0")) as urls:
        result = await invoke(["usage", "--since", "1h", "--allocator-url", urls[0]], {})
    assert result.exit_code == 0, result.output
    assert "claims held now" in result.output
    assert "cards held now" in result.output


def test_help_lists_the_pool_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("cordon", "uncordon", "drain", "usage"):
        assert command in result.output


def test_status_shows_cordoned_servers_and_cards_and_each_server_s_cuda_version() -> None:
    import dataclasses

    from rgpu_cli.status import Snapshot, card_rows, render_servers, render_wide
    from rgpu_contracts import Fleet

    plain = testkit.server(name="gpu-a", cards=2)
    carded = dataclasses.replace(
        plain,
        cuda_version="12.4",
        cards=(dataclasses.replace(plain.cards[0], cordoned=True), plain.cards[1]),
    )
    whole = dataclasses.replace(testkit.server(name="gpu-b", cards=1), cordoned=True)
    fleet = Fleet(revision=1, observed_at=0.0, servers=(carded, whole))
    cards = card_rows(Snapshot(fleet=fleet, claims=ClaimSet(revision=1, claims=())))
    rows = [line for line in render_wide(cards).splitlines() if "gpu-" in line]
    assert "12.4" in rows[0] and "cordoned" in rows[0]
    assert "cordoned" not in rows[1]
    assert "gpu-b (cordoned)" in rows[2] and "free cordoned" in rows[2]
    servers = [line for line in render_servers(cards).splitlines() if "gpu-" in line]
    assert "12.4" in servers[0] and "1 free, 1 free cordoned" in servers[0]
    assert "gpu-b (cordoned)" in servers[1]
