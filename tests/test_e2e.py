"""End to end: the whole stack as processes on loopback — kubesim with its scheduler and kubelet
emulators in this process, the four services as separate processes, pods admitted through the TLS
webhook. Verdicts come from what the emulated kubelet saw, not from rgpu's own bookkeeping."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from rgpu_cli.explain import explain
from rgpu_cli.main import app as cli
from rgpu_cli.status import card_rows, fetch_snapshot, render_servers
from rgpu_kubesim.fleet import PodPlan, WorkloadSpec, plan_workload
from rgpu_kubesim.kubelet import KubeletConfig
from rgpu_runtime.settings import Settings
from rgpu_sim.checks import check_endpoints, check_no_sharing
from rgpu_sim.span_receiver import receiving
from rgpu_sim.spans import read_spans
from rgpu_sim.stack import Stack, StackOptions, run_stack
from rgpu_testkit import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(180)]


def _pods(
    count: int, *, seed: int, run: tuple[float, float], max_cards: int = 1
) -> tuple[PodPlan, ...]:
    spec = WorkloadSpec(
        pods=count,
        seed=seed,
        max_cards=max_cards,
        run_seconds=run,
        mean_gap_seconds=0.01,
        memory_mib_choices=(8192,),
        multi_container_share=0.0,
    )
    return plan_workload(spec)


async def _submit(stack: Stack, plans: tuple[PodPlan, ...]) -> None:
    for plan in plans:
        response = await stack.create_pod(plan.manifest())
        assert response.status_code == 201, response.text


def _phases(stack: Stack) -> dict[str, str]:
    return {r.key: r.phase for r in stack.kubelet.records.values()}


def _assert_clean_run(stack: Stack) -> None:
    records = list(stack.kubelet.records.values())
    sharing = check_no_sharing(
        records, time.monotonic(), per_card=stack.options.granularity == "card"
    )
    assert sharing.passed, sharing.detail
    endpoints = check_endpoints(records, stack.fleet.endpoints())
    assert endpoints.passed, endpoints.detail


def _options(**changes: Any) -> StackOptions:
    base: dict[str, Any] = {
        "servers": 3,
        "cards": 2,
        "clients": 4,
        "seed": 3,
        "probe_interval_seconds": 0.5,
        "kubelet": KubeletConfig(start_delay_seconds=0.1),
        # The deployed scheduler runs with podMaxBackoffSeconds: 2 (k8s/base); so does this one.
        "max_backoff_seconds": 2.0,
    }
    base.update(changes)
    return StackOptions(**base)


async def test_a_workload_that_saturates_the_fleet_drains_without_sharing() -> None:
    plans = _pods(9, seed=5, run=(0.5, 1.5))
    async with run_stack(_options()) as stack:
        await _submit(stack, plans)
        await eventually(
            lambda: list(_phases(stack).values()).count("Succeeded") == 9,
            timeout=90,
            what="all pods done",
        )
        _assert_clean_run(stack)


def _record(stack: Stack, key: str) -> Any:
    return next((r for r in stack.kubelet.records.values() if r.key == key), None)


def _parked(stack: Stack, key: str, admission: str) -> bool:
    """The second pod waits: refused by the scheduler (filter path), or still gated with the
    reason announced (gate path: it never reaches the scheduler while no server is free)."""
    if admission == "filter":
        return any(r.key == key and r.refusals for r in stack.scheduler.records.values())
    namespace, name = key.split("/")
    pod = stack.sim.store.get("pods", name, namespace=namespace)
    gates = [g["name"] for g in pod["spec"].get("schedulingGates", ())]
    events = stack.sim.store.list("events", namespace=namespace)
    waiting = any(
        e.get("reason") == "RemoteGPUWaiting" and e["involvedObject"]["name"] == name
        for e in events
    )
    return "rgpu.io/admission" in gates and waiting


async def test_a_lookalike_resource_is_warned_about_in_the_creations_answer() -> None:
    async with run_stack(_options(servers=1)) as stack:
        manifest = _pods(1, seed=9, run=(1.0, 1.0))[0].manifest()
        resources = manifest["spec"]["containers"][0]["resources"]
        for amounts in resources.values():
            amounts.pop("nvidia.com/remote-gpu-memory", None)
            amounts["nvidia.com/remote-gpus"] = amounts.pop("nvidia.com/remote-gpu")
        created = await stack.create_pod(manifest)
        assert created.status_code == 201, created.text
        # kubectl prints each Warning header as "Warning: ..." on stderr.
        [warning] = created.headers.get_list("Warning")
        assert "nvidia.com/remote-gpus" in warning and "nvidia.com/remote-gpu?" in warning


async def test_one_lupine_per_gpu_gives_each_pod_one_instance_of_its_own() -> None:
    plans = _pods(4, seed=6, run=(60.0, 60.0))
    async with run_stack(_options(servers=2, cards=2, per_gpu=True)) as stack:
        await _submit(stack, plans)
        await eventually(
            lambda: list(_phases(stack).values()).count("Running") == 4,
            timeout=60,
            what="four pods running on four instances",
        )
        snapshot = await fetch_snapshot(stack.url("discovery"), stack.url("allocator"))
        held = sorted(str(c.server) for c in snapshot.claims.claims)
        assert len(set(held)) == 4 and all("@" in server for server in held), held
        assert all(len(c.cards) == 1 for c in snapshot.claims.claims)
        _assert_clean_run(stack)


@pytest.mark.parametrize("admission", ["gate", "filter"])
@pytest.mark.parametrize("how", ["finishes", "is deleted"])
async def test_a_parked_pod_is_scheduled_within_2s_of_capacity_freeing(
    how: str, admission: str
) -> None:
    holder, parked = _pods(2, seed=8, run=(4.0, 4.0))
    env = {s: {"RGPU_ADMISSION": admission} for s in ("allocator", "extender")}
    async with run_stack(_options(servers=1, extra_env=env)) as stack:
        await _submit(stack, (holder,))
        await eventually(
            lambda: (
                (r := _record(stack, holder.namespace + "/" + holder.name)) is not None
                and r.phase == "Running"
            ),
            timeout=30,
            what="holder running",
        )
        await _submit(stack, (parked,))
        parked_key = f"{parked.namespace}/{parked.name}"
        await eventually(
            lambda: _parked(stack, parked_key, admission), timeout=10, what="parked pod waiting"
        )
        holder_key = f"{holder.namespace}/{holder.name}"
        if how == "is deleted":
            await stack.apiserver.delete(
                f"/api/v1/namespaces/{holder.namespace}/pods/{holder.name}"
            )
        # A graceful deletion frees the server once the kubelet has stopped the holder.
        await eventually(
            lambda: _record(stack, holder_key).finished_at is not None,
            timeout=20,
            what="holder stopped",
        )
        freed = _record(stack, holder_key).finished_at
        await eventually(
            lambda: any(
                r.key == parked_key and r.bound_at for r in stack.scheduler.records.values()
            ),
            timeout=15,
            what="parked pod bound",
        )
        bound_at = next(r.bound_at for r in stack.scheduler.records.values() if r.key == parked_key)
        assert bound_at - freed <= 2.0, (
            f"parked pod bound {bound_at - freed:.2f}s after capacity freed"
        )
        _assert_clean_run(stack)


async def test_the_stack_keeps_each_pods_story_and_rgpu_trace_draws_it(tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    (plan,) = _pods(1, seed=9, run=(0.5, 0.5))
    key = f"{plan.namespace}/{plan.name}"
    async with run_stack(_options(servers=1, spans_file=spans_file)) as stack:
        await _submit(stack, (plan,))
        await eventually(
            lambda: _phases(stack).get(key) == "Succeeded", timeout=30, what="pod done"
        )

        def drawn() -> Result | None:
            result = CliRunner().invoke(cli, ["trace", key, "--file", str(spans_file)])
            return result if result.exit_code == 0 and " commit " in result.output else None

        await eventually(drawn, timeout=15, what="the pod's story up to its commit")
        env = {"RGPU_KUBE_URL": stack.sim.url, "RGPU_ALLOCATOR_URL": stack.url("allocator")}
        explanation = await explain(Settings.from_env(env, service="extender"), *key.split("/"))
    result = drawn()
    assert result is not None
    rows = result.output.splitlines()[2:]  # below the header, which names the slowest step
    steps = ["extender.mutate", "allocator.admit", "extender.filter", "extender.bind", "commit"]
    found = [next(i for i, row in enumerate(rows) if f" {step} " in row) for step in steps]
    assert found == sorted(found), result.output
    assert f"trace {explanation.trace_id}" in result.output
    by_trace: dict[str, set[str]] = {}
    for span in read_spans(spans_file):
        by_trace.setdefault(span.trace_id, set()).add(span.service)
    # Admitted behind the gate: the booking is the allocator's own trace, the filter a read.
    admits = {s.trace_id for s in read_spans(spans_file) if s.name == "allocator.admit"}
    assert admits and all(by_trace[t] == {"rgpu-allocator"} for t in admits)
    filters = {s.trace_id for s in read_spans(spans_file) if s.name == "extender.filter"}
    assert filters and all(by_trace[t] == {"rgpu-extender"} for t in filters)


async def test_an_otlp_endpoint_receives_the_spans_instead_of_the_span_file(
    tmp_path: Path,
) -> None:
    """``--otlp-endpoint``: a collector of the user's (here an OTLP/HTTP receiver) gets them."""
    kept, elsewhere = tmp_path / "kept.jsonl", tmp_path / "collector.jsonl"
    (plan,) = _pods(1, seed=10, run=(0.5, 0.5))
    async with receiving(elsewhere) as collector:
        options = _options(servers=1, spans_file=kept, otlp_endpoint=collector)
        async with run_stack(options) as stack:
            await _submit(stack, (plan,))
            await eventually(
                lambda: any(s.name == "extender.bind" for s in read_spans(elsewhere)),
                timeout=30,
                what="the bind's span at the endpoint",
            )
    assert not kept.exists()
    assert {s.service for s in read_spans(elsewhere)} >= {"rgpu-extender", "rgpu-allocator"}


async def test_killing_allocator_and_extender_mid_run_loses_no_booking() -> None:
    plans = _pods(12, seed=11, run=(1.0, 2.5))
    async with run_stack(_options()) as stack:
        await _submit(stack, plans)
        await eventually(
            lambda: sum(r.bound_at is not None for r in stack.scheduler.records.values()) >= 3,
            timeout=30,
            what="first pods bound",
        )
        await stack.restart("allocator", hard=True)
        await eventually(
            lambda: list(_phases(stack).values()).count("Succeeded") >= 5,
            timeout=60,
            what="progress after restart",
        )
        await stack.restart("extender", hard=True)
        await eventually(
            lambda: list(_phases(stack).values()).count("Succeeded") == 12,
            timeout=90,
            what="all pods done",
        )
        _assert_clean_run(stack)


async def test_status_and_explain_show_the_holder_and_why_the_other_pod_waits() -> None:
    holder, waiting = _pods(2, seed=12, run=(6.0, 6.0))
    async with run_stack(_options(servers=1)) as stack:
        await _submit(stack, (holder,))
        holder_key = f"{holder.namespace}/{holder.name}"
        await eventually(
            lambda: (r := _record(stack, holder_key)) is not None and r.phase == "Running",
            timeout=30,
            what="run",
        )
        await _submit(stack, (waiting,))

        snapshot = await fetch_snapshot(stack.url("discovery"), stack.url("allocator"))
        assert [c.pod.key for c in snapshot.claims.claims] == [holder_key]
        assert "2 bound" in render_servers(card_rows(snapshot))
        assert holder_key in render_servers(card_rows(snapshot))

        env = {"RGPU_KUBE_URL": stack.sim.url, "RGPU_ALLOCATOR_URL": stack.url("allocator")}
        env["RGPU_DISCOVERY_URL"] = stack.url("discovery")
        settings = Settings.from_env(env, service="extender")
        explanation = await explain(settings, waiting.namespace, waiting.name)
        assert explanation.never is None  # it waits for the holder, not for a bigger server
        assert explanation.nofit is not None
        assert "ExclusiveDeviceAllocateConflict" in explanation.nofit.message
        assert [v.server for v in explanation.nofit.servers] == list(stack.fleet.endpoints())
