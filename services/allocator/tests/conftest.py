"""Builders for fleets, pods and requests shared by the allocator's tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pytest

from rgpu_contracts import (
    AllocationRequest,
    Card,
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


class Build:
    """Small constructors so each test states only what it is about."""

    @staticmethod
    def uuid(server: str, index: int) -> str:
        return f"GPU-{server}-{index}"

    def card(
        self,
        server: str,
        index: int,
        *,
        memory: int = 40000,
        cores: int = 100,
        healthy: bool = True,
    ) -> Card:
        uuid = self.uuid(server, index)
        return Card(
            id=card_id(server, uuid),
            server=ServerName(server),
            uuid=GpuUuid(uuid),
            index=index,
            memory_mib=memory,
            cores=cores,
            model="A100",
            numa=0,
            healthy=healthy,
        )

    def server(
        self,
        name: str,
        *,
        cards: int = 4,
        memory: int | Sequence[int] = 40000,
        unhealthy: Iterable[int] = (),
        busy: Iterable[int] = (),
        ready: bool = True,
        reachable: bool = True,
        endpoint: str | None = "default",
        labels: Mapping[str, str] | None = None,
        port: int = 14833,
    ) -> Server:
        sick = set(unhealthy)
        sizes = [memory] * cards if isinstance(memory, int) else list(memory)
        made = tuple(
            self.card(name, i, memory=sizes[i], healthy=i not in sick) for i in range(len(sizes))
        )
        return Server(
            name=ServerName(name),
            endpoint=f"10.0.0.{len(name)}:{port}" if endpoint == "default" else endpoint,
            port=port,
            ready=ready,
            reachable=reachable,
            usage_reported=True,
            busy=frozenset(GpuUuid(self.uuid(name, i)) for i in busy),
            topology=tuple(sorted((labels or {}).items())),
            cards=made,
        )

    @staticmethod
    def fleet(*servers: Server, revision: int = 1) -> Fleet:
        return Fleet(revision=revision, observed_at=0.0, servers=servers)

    @staticmethod
    def topology(nodes: Mapping[str, Mapping[str, str]], revision: int = 1) -> Topology:
        return Topology(
            revision=revision,
            nodes=tuple(
                NodeTopology(name=NodeName(n), labels=tuple(sorted(labels.items())))
                for n, labels in nodes.items()
            ),
        )

    @staticmethod
    def container(
        name: str = "main", count: int = 1, memory: int = 0, kind: str = "app"
    ) -> ContainerRequest:
        return ContainerRequest(name=name, kind=ContainerKind(kind), count=count, memory_mib=memory)

    @staticmethod
    def pod(name: str = "p", namespace: str = "ml", uid: str | None = None) -> PodRef:
        return PodRef(uid=PodUID(uid or f"uid-{name}"), namespace=namespace, name=name)

    def request(
        self,
        name: str = "p",
        *containers: ContainerRequest,
        candidates: Sequence[str] = (),
        dry_run: bool = False,
        uid: str | None = None,
    ) -> AllocationRequest:
        return AllocationRequest(
            pod=self.pod(name, uid=uid),
            containers=containers or (self.container(),),
            candidate_nodes=tuple(NodeName(n) for n in candidates),
            dry_run=dry_run,
        )


@pytest.fixture
def build() -> Build:
    return Build()
