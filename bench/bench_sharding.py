"""Discovery replicas sharing the probing: probes per server per interval, state writes per
second, and the longest a server went unprobed across a clean leave and a crash.

Run: ``python3 -m uv run --no-sync python bench/bench_sharding.py [--servers 100]
[--replicas 1,2,3] [--interval 1] [--heartbeat 4] [--intervals 8]``

For each replica count R, R discovery apps (in process, each with its own registry and
identity) follow one simulated apiserver and N fake lupine servers. Once every replica sees
all R members, a window of ``--intervals`` probe intervals is measured:

* probes per server per interval - connections the fake servers accepted in the window /
  (N x intervals): the target is 1, whatever R (each server probed by one replica)
* servers probed by >1 replica   - servers whose probe counter grew on two replicas in the
  window: the target is 0
* state writes per second        - every replica's ``rgpu_discovery_state_writes_total``
  (written) over the window: at rest only heartbeats, about N / heartbeat
* at 1,000 servers, defaults     - the same rate projected to 1,000 servers, a 15 s interval
  and the 300 s heartbeat: 1000 / 300, about 3.3 writes per second
* revisions agree                - whether every replica served the same revision and servers

Then (R >= 3) one replica leaves cleanly and another "crashes" (its membership Lease is put
back as a crash leaves it, renewed by nobody): the longest gap between two probes of any
server is measured against one interval plus the membership lease time.

The interval and heartbeat default to 1 s and 4 s (production's are 15 s and 300 s) so a run
takes seconds; rates scale with them.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio
import httpx
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

import rgpu_testkit as testkit
from rgpu_contracts import Fleet
from rgpu_discovery import create_app
from rgpu_discovery.settings import DiscoverySettings
from rgpu_discovery.state_writer import HEARTBEAT_SECONDS, WriterPolicy
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_kubesim.lupine import LupineFleet, LupineSpec, open_lupine_fleet
from rgpu_runtime.replicas import MembershipTiming, member_lease_name

NAMESPACE = "rgpu-system"
GPUS = ("GPU-0", "GPU-1", "GPU-2", "GPU-3")
LEASE_SECONDS = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Replica:
    name: str
    client: httpx.AsyncClient
    registry: CollectorRegistry

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def probes(self, server: str) -> float:
        return self.sample("rgpu_discovery_probe_connections_total", server=server)

    def writes(self) -> float:
        return sum(
            self.sample("rgpu_discovery_state_writes_total", reason=r, outcome="written")
            for r in ("change", "heartbeat")
        )

    async def fleet(self) -> Fleet:
        return Fleet.from_dict((await self.client.get("/v1/fleet")).json())


@asynccontextmanager
async def replica(sim: SimApiServer, name: str, args: argparse.Namespace) -> AsyncIterator[Replica]:
    env = {
        "RGPU_KUBE_URL": sim.url,
        "RGPU_AUTH": "none",
        "RGPU_PROBE_INTERVAL_SECONDS": str(args.interval),
        "RGPU_PROBE_TIMEOUT_SECONDS": "2",
    }
    registry = CollectorRegistry()
    app = create_app(
        DiscoverySettings.from_env(env),
        registry=registry,
        identity=name,
        membership=MembershipTiming(lease_seconds=LEASE_SECONDS, renew_seconds=0.5),
        writer_policy=WriterPolicy(heartbeat_seconds=args.heartbeat),
    )
    async with (
        LifespanManager(app, startup_timeout=30) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://discovery"
        ) as client,
    ):
        yield Replica(name=name, client=client, registry=registry)


async def servers(sim: SimApiServer, lupines: LupineFleet, count: int) -> list[str]:
    cards = [dict(testkit.register_card(uuid=g, index=i)) for i, g in enumerate(GPUS)]
    for i in range(count):
        lupine = await lupines.start(LupineSpec(name=f"gpu-{i:04}", gpus=GPUS))
        labels = {"hami.io/lupine-server": str(lupine.port)}
        node = {
            "metadata": {
                "name": lupine.name,
                "labels": labels,
                "annotations": {"hami.io/node-nvidia-register": testkit.register_annotation(cards)},
            },
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        sim.store.create("nodes", node)
    return [lupine.name for lupine in lupines]


async def until(check: Callable[[], bool]) -> None:
    await testkit.eventually(check, timeout=60.0, what="every replica seeing the others")


async def window(
    replicas: Sequence[Replica], lupines: LupineFleet, names: Sequence[str], seconds: float
) -> tuple[float, int, float]:
    """(connections accepted, servers probed by >1 replica, writes) over ``seconds``."""
    accepted = sum(lupine.connections for lupine in lupines)
    before = {s: [r.probes(s) for r in replicas] for s in names}
    writes = sum(r.writes() for r in replicas)
    await anyio.sleep(seconds)
    shared = sum(
        1
        for s in names
        if sum(1 for r, b in zip(replicas, before[s], strict=True) if r.probes(s) > b) > 1
    )
    return (
        sum(lupine.connections for lupine in lupines) - accepted,
        shared,
        sum(r.writes() for r in replicas) - writes,
    )


async def measure(args: argparse.Namespace, count: int) -> None:
    async with (
        run_apiserver() as sim,
        open_lupine_fleet() as lupines,
        AsyncExitStack() as stack,
    ):
        sim.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        names = await servers(sim, lupines, args.servers)
        replicas = [
            await stack.enter_async_context(replica(sim, f"discovery-{i}", args))
            for i in range(count)
        ]
        await until(lambda: all(r.sample("rgpu_discovery_members") == count for r in replicas))
        await anyio.sleep(2 * args.interval)  # the first rounds, probes launched pre-ring
        seconds = args.intervals * args.interval
        accepted, shared, writes = await window(replicas, lupines, names, seconds)
        fleets = [await r.fleet() for r in replicas]
        agree = all(
            (f.revision, f.servers) == (fleets[0].revision, fleets[0].servers) for f in fleets
        )
        rate = writes / seconds
        print(f"replicas {count}:")
        row(
            "probes per server per interval", f"{accepted / (len(names) * args.intervals):.2f}", "1"
        )
        row("servers probed by >1 replica", f"{shared}", "0")
        row("state writes per second", f"{rate:.1f}", f"~{len(names) / args.heartbeat:.1f}")
        projected = rate * (1000 / len(names)) * (args.heartbeat / HEARTBEAT_SECONDS)
        row(
            f"at 1,000 servers, {HEARTBEAT_SECONDS:.0f} s heartbeat",
            f"{projected:.1f}/s",
            f"~{1000 / HEARTBEAT_SECONDS:.1f}/s",
        )
        row("revisions and servers agree", "yes" if agree else "no", "yes")
        if count >= 3:
            await stack.aclose()
            await handover(sim, lupines, args)


async def handover(sim: SimApiServer, lupines: LupineFleet, args: argparse.Namespace) -> None:
    """Two replicas, then a third member that never renews (a crash): the longest gap
    between two probes of any server while its share is noticed and taken back."""
    async with AsyncExitStack() as stack:
        live = [
            await stack.enter_async_context(replica(sim, f"survivor-{i}", args)) for i in range(2)
        ]
        await until(lambda: all(r.sample("rgpu_discovery_members") == 2 for r in live))
        await anyio.sleep(2 * args.interval)
        sim.store.create("leases", crashed_lease("crashed"), namespace=NAMESPACE)
        gap = await longest_gap(lupines, LEASE_SECONDS + 4 * args.interval)
    target = f"<= {args.interval + LEASE_SECONDS:.1f} s"
    row("longest gap between probes (crash)", f"{gap:.2f} s", target)


async def longest_gap(lupines: LupineFleet, seconds: float) -> float:
    """The longest any server went without a connection (a probe), seen from the servers."""
    counts = {lupine.name: lupine.connections for lupine in lupines}
    last = dict.fromkeys(counts, time.monotonic())
    gap, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        for lupine in lupines:
            if lupine.connections != counts[lupine.name]:
                counts[lupine.name] = lupine.connections
                gap, last[lupine.name] = max(gap, now - last[lupine.name]), now
        await anyio.sleep(0.01)
    return max(gap, *(time.monotonic() - t for t in last.values()))


def crashed_lease(identity: str) -> dict[str, object]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "metadata": {
            "name": member_lease_name("discovery", identity),
            "labels": {"rgpu.io/membership": "discovery"},
        },
        "spec": {"holderIdentity": identity, "leaseDurationSeconds": 2, "renewTime": now},
    }


def row(label: str, value: str, target: str) -> None:
    print(f"  {label:<40} {value:>9}   target {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--heartbeat", type=float, default=4.0)
    parser.add_argument("--intervals", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(
        f"discovery sharding: {args.servers} servers, interval {args.interval} s, "
        f"heartbeat {args.heartbeat} s, membership lease {LEASE_SECONDS} s"
    )
    for count in (int(c) for c in args.replicas.split(",")):
        anyio.run(measure, args, count)


if __name__ == "__main__":
    main()
