"""Builders for the placement tests: raw pod JSON (``build``) and contract values (``make``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from rgpu_contracts import (
    Card,
    Claim,
    ClaimState,
    ContainerKind,
    ContainerRequest,
    Fleet,
    GpuUuid,
    NodeName,
    NodeTopology,
    PodRef,
    PodUID,
    Server,
    ServerName,
    Topology,
    card_id,
)
from rgpu_placement import FleetView

Json = dict[str, Any]

COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"
KEYS = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone", "topology.kubernetes.io/region")


class Build:
    """Raw pods as kube-scheduler and the apiserver send them."""

    @staticmethod
    def container(
        name: str = "main", *, count: object = None, memory: object = None, **extra: Any
    ) -> Json:
        """A container asking for ``count`` cards (limits) of ``memory`` MiB."""
        limits: Json = {"memory": "2Gi"}
        if count is not None:
            limits[COUNT] = count
        if memory is not None:
            limits[MEMORY] = memory
        body: Json = {"name": name, "image": "registry.example.com/ml/trainer:1.4"}
        return {**body, "resources": {"limits": limits}, **extra}

    @staticmethod
    def pod(*containers: Json, init: Iterable[Json] = ()) -> Json:
        """A pod with ``containers`` (default: one asking for one card)."""
        spec: Json = {"containers": list(containers) or [Build.container(count="1")]}
        if init:
            spec["initContainers"] = list(init)
        meta = {"name": "trainer-0", "namespace": "ml-team", "uid": "uid-trainer-0"}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Make:
    """Contract values; defaults make a healthy, ready, reachable server of four cards."""

    @staticmethod
    def card(server: str, index: int, *, healthy: bool = True, memory: int = 40960) -> Card:
        uuid = GpuUuid(f"GPU-{server}-{index}")
        return Card(
            id=card_id(server, uuid),
            server=ServerName(server),
            uuid=uuid,
            index=index,
            memory_mib=memory,
            cores=100,
            model="NVIDIA A100-SXM4-40GB",
            numa=0,
            healthy=healthy,
        )

    def server(
        self,
        name: str,
        *,
        cards: int = 4,
        memory: int | Sequence[int] = 40960,
        ready: bool = True,
        reachable: bool = True,
        busy: Iterable[int] = (),
        unhealthy: Iterable[int] = (),
        endpoint: str | None = "10.0.0.1:14833",
        labels: Mapping[str, str] | None = None,
    ) -> Server:
        sick = set(unhealthy)
        sizes = [memory] * cards if isinstance(memory, int) else list(memory)
        made = tuple(
            self.card(name, i, memory=size, healthy=i not in sick) for i, size in enumerate(sizes)
        )
        return Server(
            name=ServerName(name),
            endpoint=endpoint,
            port=14833,
            ready=ready,
            reachable=reachable,
            usage_reported=True,
            busy=frozenset(made[i].uuid for i in busy),
            topology=tuple(sorted((labels or {}).items())),
            cards=made,
        )

    @staticmethod
    def fleet(*servers: Server, revision: int = 1) -> Fleet:
        return Fleet(revision=revision, observed_at=0.0, servers=servers)

    @staticmethod
    def topology(nodes: Mapping[str, Mapping[str, str]]) -> Topology:
        return Topology(
            revision=1,
            nodes=tuple(
                NodeTopology(name=NodeName(n), labels=tuple(sorted(labels.items())))
                for n, labels in nodes.items()
            ),
        )

    def view(
        self,
        servers: Sequence[Server],
        nodes: Mapping[str, Mapping[str, str]] | None = None,
        keys: Sequence[str] = KEYS,
    ) -> FleetView:
        return FleetView.build(self.fleet(*servers), self.topology(nodes or {}), keys)

    @staticmethod
    def container(
        name: str = "main", count: int = 1, memory: int = 0, kind: str = "app"
    ) -> ContainerRequest:
        return ContainerRequest(name=name, kind=ContainerKind(kind), count=count, memory_mib=memory)

    def claim(
        self,
        server: str,
        indices: Iterable[int],
        *,
        state: str = "bound",
        pod: str = "train-0",
        namespace: str = "team-a",
        booked_at: float = 1.0,
    ) -> Claim:
        return Claim(
            pod=PodRef(uid=PodUID(f"uid-{namespace}-{pod}"), namespace=namespace, name=pod),
            server=ServerName(server),
            cards=tuple(self.card(server, i).id for i in indices),
            containers=(),
            state=ClaimState(state),
            booked_at=booked_at,
        )


@pytest.fixture
def build() -> Build:
    return Build()


@pytest.fixture
def make() -> Make:
    return Make()
