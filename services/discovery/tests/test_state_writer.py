"""Probe states written to the simulated apiserver over HTTP: a compare-and-swap lost to
another replica is decided again on what the apiserver holds, a heartbeat keeps the
fleet's revision, and apiserver failures delay a state but never lose it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest
from prometheus_client import CollectorRegistry

from rgpu_contracts.ids import ServerName
from rgpu_discovery.clients import StateLeaseApi
from rgpu_discovery.fleet import FleetState, ProbeReport
from rgpu_discovery.instruments import Instruments
from rgpu_discovery.lupine import ProbeOutcome
from rgpu_discovery.probe_states import (
    COMPONENT_SELECTOR,
    ProbeState,
    StampedState,
    decode_state,
    encode_state,
    state_lease_name,
)
from rgpu_discovery.settings import DiscoverySettings
from rgpu_discovery.state_watch import StateWatch
from rgpu_discovery.state_writer import StateWriter, WriterPolicy
from rgpu_discovery.topology import TopologyState
from rgpu_kubesim.lupine import run_lupine
from rgpu_runtime.kube import kube_client
from rgpu_runtime.pacing import Backoff

pytestmark = pytest.mark.anyio

GPU_A = ServerName("gpu-a")
ENDPOINT = "10.0.0.1:14833"
NAMESPACE = "rgpu-system"
BUSY = ProbeState(probed=True, usage_reported=True, busy=frozenset({"GPU-1"}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Rig:
    fleet: FleetState
    writer: StateWriter
    registry: CollectorRegistry

    def writes(self, reason: str, outcome: str) -> float:
        labels = {"reason": reason, "outcome": outcome}
        value = self.registry.get_sample_value("rgpu_discovery_state_writes_total", labels)
        return value or 0.0


@asynccontextmanager
async def writer_rig(sim, policy: WriterPolicy) -> AsyncIterator[Rig]:
    """A writer and a fleet on ``sim``, without the state watch running (so the fleet keeps
    whatever the test feeds it, stale on purpose)."""
    settings = DiscoverySettings.from_env({"RGPU_KUBE_URL": sim.url})
    fleet, registry = FleetState(default_port=14833), CollectorRegistry()
    instruments = Instruments.create(registry, fleet, TopologyState())
    async with kube_client(settings) as kube:
        api = StateLeaseApi(kube, NAMESPACE, COMPONENT_SELECTOR)
        watch = StateWatch(api=api, fleet=fleet, backoff=Backoff(initial=0.05, maximum=0.1))
        writer = StateWriter(
            api=api,
            fleet=fleet,
            watch=watch,
            instruments=instruments,
            identity="discovery-1",
            policy=policy,
        )
        yield Rig(fleet=fleet, writer=writer, registry=registry)


def stored(sim) -> StampedState:
    state = decode_state(sim.store.get("leases", state_lease_name(GPU_A), namespace=NAMESPACE))
    assert state is not None
    return state


def written_by(holder: str, probe: ProbeState, since: int | None = None) -> dict[str, object]:
    return encode_state(
        server=GPU_A,
        endpoint=ENDPOINT,
        probe=probe,
        since=since,
        holder=holder,
        now=0.0,
        heartbeat_seconds=60,
    )


def timed_out() -> ProbeReport:
    return ProbeReport(server=GPU_A, endpoint=ENDPOINT, outcome=ProbeOutcome(result="timeout"))


QUICK = WriterPolicy(heartbeat_seconds=60.0, reflect_seconds=0.05)


async def test_a_lost_compare_and_swap_is_decided_again_on_the_stored_state(sim) -> None:
    created = sim.store.create("leases", written_by("discovery-2", BUSY), namespace=NAMESPACE)
    stale = decode_state(created)
    assert stale is not None
    # Another replica counted a failed probe after this one last read the Lease.
    once = written_by("discovery-2", BUSY.after(ProbeOutcome(result="refused")))
    once["metadata"]["resourceVersion"] = stale.version  # type: ignore[index]
    sim.store.replace("leases", once, namespace=NAMESPACE)
    async with writer_rig(sim, QUICK) as rig:
        rig.fleet.apply_states([stale])
        await rig.writer.record(timed_out())
        conflicts, written = rig.writes("change", "conflict"), rig.writes("change", "written")
    state = stored(sim)
    assert (state.probe.failures, state.probe.reachable, state.probe.busy) == (
        2,
        False,
        frozenset({"GPU-1"}),
    )
    assert (state.holder, conflicts, written) == ("discovery-1", 1, 1)


async def test_an_unchanged_state_is_not_written_until_its_heartbeat_is_due(sim) -> None:
    sim.store.create("leases", written_by("discovery-1", BUSY), namespace=NAMESPACE)
    usage = ProbeReport(
        server=GPU_A, endpoint=ENDPOINT, outcome=ProbeOutcome(result="usage", busy=BUSY.busy)
    )
    async with writer_rig(sim, QUICK) as rig:
        rig.fleet.apply_states([stored(sim)])
        await rig.writer.record(usage)
        quiet = rig.writes("heartbeat", "written")
    # The Lease was renewed at time 0 (1970): long overdue for a heartbeat.
    assert quiet == 1
    before, after = (
        stored(sim),
        sim.store.get("leases", state_lease_name(GPU_A), namespace=NAMESPACE),
    )
    assert before.since < int(after["metadata"]["resourceVersion"])
    async with writer_rig(sim, QUICK) as rig:
        rig.fleet.apply_states([stored(sim)])
        await rig.writer.record(usage)
        assert rig.writes("heartbeat", "written") == 0


async def test_a_state_the_apiserver_refused_is_written_once_it_is_back(sim, start, build) -> None:
    async with run_lupine(gpus=("GPU-0", "GPU-1")) as lupine, start() as discovery:
        cards = (build.card("GPU-0"), build.card("GPU-1", 1))
        node = build.node(
            "gpu-a", server=str(lupine.port), ip="127.0.0.1", annotation=build.register(*cards)
        )
        sim.store.create("nodes", node)
        await discovery.server_when("gpu-a", lambda s: s.usage_reported)
        for verb in ("create", "update"):
            sim.faults.set_error(verb=verb, resource="leases", rate=1.0, code=500)
        lupine.add_client("pod-a", ["GPU-1"])
        await discovery.counted(
            "rgpu_discovery_state_writes_total", 2, reason="change", outcome="error"
        )
        assert (await discovery.fleet()).servers[0].busy == frozenset()
        sim.faults.clear()
        server = await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-1"})
    assert server.reachable


async def test_the_write_budget_defers_changes_and_counts_them(sim) -> None:
    tight = WriterPolicy(writes_per_second=1.0, reflect_seconds=0.05, retry_seconds=0.05)
    async with writer_rig(sim, tight) as rig:
        await rig.writer.record(timed_out())
        await rig.writer.record(timed_out())
        deferred, pending = rig.writes("change", "deferred"), rig.writer.pending
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                await tg.start(rig.writer.run)
                while rig.writer.pending:
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
    assert (deferred, pending) == (1, 1)
    assert stored(sim).probe.failures >= 1
