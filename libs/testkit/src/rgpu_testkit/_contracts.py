"""Tests state only what they are about: these builders make the contract values every
service's tests pass around (cards, servers, fleets, topologies, pods, requests, claims) with
defaults describing a small healthy fleet, so a test names the one field it varies.

Every builder is keyword-only and pure. A card's uuid is ``GPU-<server>-<index>``, so a
test can name a card by its server and index alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rgpu_contracts import (
    AllocationRequest,
    Card,
    Claim,
    ClaimSet,
    ClaimState,
    ContainerAssignment,
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

__all__ = [
    "AUTO_ENDPOINT",
    "allocation_request",
    "card",
    "claim",
    "claim_set",
    "container_request",
    "fleet",
    "gpu_uuid",
    "pod_ref",
    "server",
    "topology",
]

AUTO_ENDPOINT = "auto"
"""``server(endpoint=AUTO_ENDPOINT)``: ``10.0.0.<len(name)>:<port>``, distinct per name length."""


def gpu_uuid(*, server: str = "gpu-a", index: int = 0) -> GpuUuid:
    """The uuid the builders give card ``index`` of ``server``."""
    return GpuUuid(f"GPU-{server}-{index}")


def card(
    *,
    server: str = "gpu-a",
    index: int = 0,
    memory_mib: int = 40960,
    cores: int = 100,
    model: str = "NVIDIA A100-SXM4-40GB",
    numa: int = 0,
    healthy: bool = True,
) -> Card:
    """Card ``index`` of ``server``."""
    uuid = gpu_uuid(server=server, index=index)
    return Card(
        id=card_id(server, uuid),
        server=ServerName(server),
        uuid=uuid,
        index=index,
        memory_mib=memory_mib,
        cores=cores,
        model=model,
        numa=numa,
        healthy=healthy,
    )


def server(
    *,
    name: str = "gpu-a",
    cards: int = 4,
    memory_mib: int | Sequence[int] = 40960,
    model: str = "NVIDIA A100-SXM4-40GB",
    unhealthy: Iterable[int] = (),
    busy: Iterable[int] = (),
    ready: bool = True,
    reachable: bool = True,
    endpoint: str | None = AUTO_ENDPOINT,
    port: int = 14833,
    labels: Mapping[str, str] | None = None,
) -> Server:
    """A lupine server with ``cards`` cards (or one per entry of a ``memory_mib`` sequence);
    ``unhealthy`` and ``busy`` name card indices."""
    sizes = [memory_mib] * cards if isinstance(memory_mib, int) else list(memory_mib)
    sick = set(unhealthy)
    made = tuple(
        card(server=name, index=i, memory_mib=size, model=model, healthy=i not in sick)
        for i, size in enumerate(sizes)
    )
    return Server(
        name=ServerName(name),
        endpoint=f"10.0.0.{len(name)}:{port}" if endpoint == AUTO_ENDPOINT else endpoint,
        port=port,
        ready=ready,
        reachable=reachable,
        usage_reported=True,
        busy=frozenset(gpu_uuid(server=name, index=i) for i in busy),
        topology=tuple(sorted((labels or {}).items())),
        cards=made,
    )


def fleet(*, servers: Iterable[Server] = (), revision: int = 1, observed_at: float = 0.0) -> Fleet:
    """A fleet of ``servers`` at ``revision``."""
    return Fleet(revision=revision, observed_at=observed_at, servers=tuple(servers))


def topology(
    *, nodes: Mapping[str, Mapping[str, str]] | None = None, revision: int = 1
) -> Topology:
    """Client nodes' topology labels: ``{node: {label: value}}``."""
    return Topology(
        revision=revision,
        nodes=tuple(
            NodeTopology(name=NodeName(name), labels=tuple(sorted(labels.items())))
            for name, labels in (nodes or {}).items()
        ),
    )


def pod_ref(*, name: str = "p", namespace: str = "ml", uid: str | None = None) -> PodRef:
    """A pod reference; the uid defaults to ``uid-<name>``."""
    return PodRef(uid=PodUID(uid or f"uid-{name}"), namespace=namespace, name=name)


def container_request(
    *, name: str = "main", kind: str = "app", count: int = 1, memory_mib: int = 0
) -> ContainerRequest:
    """One container's ask: ``count`` cards of at least ``memory_mib`` MiB (0: whole cards)."""
    return ContainerRequest(name=name, kind=ContainerKind(kind), count=count, memory_mib=memory_mib)


def allocation_request(
    *,
    pod: PodRef | None = None,
    containers: Iterable[ContainerRequest] = (),
    candidates: Iterable[str] = (),
    dry_run: bool = False,
) -> AllocationRequest:
    """An allocation request for ``pod`` (default ``pod_ref()``); without containers, one
    container asking for one card."""
    return AllocationRequest(
        pod=pod or pod_ref(),
        containers=tuple(containers) or (container_request(),),
        candidate_nodes=tuple(NodeName(n) for n in candidates),
        dry_run=dry_run,
    )


def claim(
    *,
    server: str = "gpu-a",
    cards: Iterable[int] = (0,),
    pod: PodRef | None = None,
    state: ClaimState | str = ClaimState.BOOKED,
    containers: Mapping[str, Iterable[int]] | None = None,
    booked_at: float = 1.0,
    committed_at: float | None = None,
    node: str | None = None,
) -> Claim:
    """``pod``'s claim on card indices ``cards`` of ``server``; ``containers`` maps container
    names to the indices each got (default: none listed)."""
    ids = tuple(card(server=server, index=i).id for i in cards)
    assigned = tuple(
        ContainerAssignment(name=name, cards=tuple(card(server=server, index=i).id for i in got))
        for name, got in (containers or {}).items()
    )
    return Claim(
        pod=pod or pod_ref(),
        server=ServerName(server),
        cards=ids,
        containers=assigned,
        state=ClaimState(state),
        booked_at=booked_at,
        committed_at=committed_at,
        node=None if node is None else NodeName(node),
    )


def claim_set(*, claims: Iterable[Claim] = (), revision: int = 1) -> ClaimSet:
    """The allocator's claims at ``revision``."""
    return ClaimSet(revision=revision, claims=tuple(claims))
