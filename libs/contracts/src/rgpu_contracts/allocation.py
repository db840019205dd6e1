"""The allocator's API and its durable claim format are one vocabulary.

``AllocationRequest`` goes in, an ``Allocation`` or a ``NoFit`` comes out; a ``Claim`` is the
durable record stored in the per-server Lease (and served as a ``ClaimSet``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from . import _validate as v
from .errors import ContractError
from .ids import CardId, NodeName, PodUID, ServerName
from .reasons import Reason, ReasonCount, ReasonCountDict, render_reasons

__all__ = [
    "LABEL_CUDA_MAJOR",
    "MAX_CUDA_MAJOR",
    "READINESS_GATE",
    "Allocation",
    "AllocationDict",
    "AllocationRequest",
    "AllocationRequestDict",
    "Claim",
    "ClaimDict",
    "ClaimSet",
    "ClaimSetDict",
    "ClaimState",
    "CommitRequest",
    "CommitRequestDict",
    "ContainerAssignment",
    "ContainerAssignmentDict",
    "ContainerKind",
    "ContainerRequest",
    "ContainerRequestDict",
    "NoFit",
    "NoFitDict",
    "PodRef",
    "PodRefDict",
    "ServerVerdict",
    "ServerVerdictDict",
]


class ContainerKind(enum.StrEnum):
    """Where a container sits in the pod's lifecycle; Kubernetes counts resources differently."""

    INIT = "init"
    SIDECAR = "sidecar"
    APP = "app"


class ClaimState(enum.StrEnum):
    """booked at filter time, committed when bind annotations were issued, bound once placed."""

    BOOKED = "booked"
    COMMITTED = "committed"
    BOUND = "bound"


class PodRefDict(TypedDict):
    uid: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    """Who a claim is for; ``uid`` is the identity, namespace/name are for humans and events."""

    uid: PodUID
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_dict(self) -> PodRefDict:
        return {"uid": self.uid, "namespace": self.namespace, "name": self.name}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> PodRef:
        m = v.as_mapping(raw, path)
        uid = v.string(m, "uid", path)
        if not uid:
            raise ContractError(v.join(path, "uid"), "must not be empty")
        return cls(
            uid=PodUID(uid),
            namespace=v.string(m, "namespace", path),
            name=v.string(m, "name", path),
        )


class ContainerRequestDict(TypedDict):
    name: str
    kind: str
    count: int
    memoryMiB: int


_MAX_QUANTITY = 2**31 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerRequest:
    """One container's ask: ``count`` cards each with at least ``memory_mib`` (0 = any)."""

    name: str
    kind: ContainerKind
    count: int
    memory_mib: int = 0

    def to_dict(self) -> ContainerRequestDict:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "count": self.count,
            "memoryMiB": self.memory_mib,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ContainerRequest:
        m = v.as_mapping(raw, path)
        kind = v.choice(m, "kind", path, [k.value for k in ContainerKind], "app")
        return cls(
            name=v.string(m, "name", path),
            kind=ContainerKind(kind),
            count=v.integer(m, "count", path, minimum=0, maximum=_MAX_QUANTITY),
            memory_mib=v.integer(m, "memoryMiB", path, 0, minimum=0, maximum=_MAX_QUANTITY),
        )


class AllocationRequestDict(TypedDict):
    pod: PodRefDict
    containers: list[ContainerRequestDict]
    candidateNodes: list[str]
    dryRun: bool
    cudaMajor: int | None


MAX_CUDA_MAJOR = 999
"""CUDA majors are two digits today; three leave room without admitting nonsense."""
LABEL_CUDA_MAJOR = "rgpu.io/cuda-major"
"""The pod label naming the CUDA major version its client shim was built for, e.g. ``"12"``."""
READINESS_GATE = "rgpu.io/remote-gpu-ready"
"""The readiness gate (``spec.readinessGates[].conditionType``) a pod declares to be marked not
Ready while its remote GPU server is lost; the allocator sets the condition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationRequest:
    """Choose (and, unless ``dry_run``, book) a server for ``pod`` near ``candidate_nodes``.

    ``cuda_major``: the CUDA major version the pod's client shim was built for (its
    ``rgpu.io/cuda-major`` label); only servers whose lupine reports that major are chosen.
    """

    pod: PodRef
    containers: tuple[ContainerRequest, ...]
    candidate_nodes: tuple[NodeName, ...] = ()
    dry_run: bool = False
    cuda_major: int | None = None

    def to_dict(self) -> AllocationRequestDict:
        return {
            "pod": self.pod.to_dict(),
            "containers": [c.to_dict() for c in self.containers],
            "candidateNodes": list(self.candidate_nodes),
            "dryRun": self.dry_run,
            "cudaMajor": self.cuda_major,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> AllocationRequest:
        m = v.as_mapping(raw, path)
        containers = v.items(m, "containers", path, ContainerRequest.from_dict)
        if not any(c.count for c in containers):
            raise ContractError(v.join(path, "containers"), "no container asks for a card")
        return cls(
            pod=PodRef.from_dict(m.get("pod"), v.join(path, "pod")),
            containers=containers,
            candidate_nodes=tuple(NodeName(n) for n in v.strings(m, "candidateNodes", path, ())),
            dry_run=v.boolean(m, "dryRun", path, False),
            cuda_major=_cuda_major(m, path),
        )


def _cuda_major(m: Mapping[str, object], path: str) -> int | None:
    if m.get("cudaMajor") is None:
        return None
    return v.integer(m, "cudaMajor", path, minimum=0, maximum=MAX_CUDA_MAJOR)


class ContainerAssignmentDict(TypedDict):
    name: str
    cards: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerAssignment:
    """The cards one container sees (all of the server's in ``server`` granularity)."""

    name: str
    cards: tuple[CardId, ...]

    def to_dict(self) -> ContainerAssignmentDict:
        return {"name": self.name, "cards": list(self.cards)}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ContainerAssignment:
        m = v.as_mapping(raw, path)
        cards = tuple(CardId(c) for c in v.strings(m, "cards", path))
        return cls(name=v.string(m, "name", path), cards=cards)


class ClaimDict(TypedDict):
    pod: PodRefDict
    server: str
    cards: list[str]
    containers: list[ContainerAssignmentDict]
    state: str
    bookedAt: float
    committedAt: float | None
    node: str | None
    admissionTtlSeconds: NotRequired[float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """Cards of ``server`` held by ``pod``: the durable unit of allocation (stored in a Lease)."""

    pod: PodRef
    server: ServerName
    cards: tuple[CardId, ...]
    containers: tuple[ContainerAssignment, ...]
    state: ClaimState
    booked_at: float
    committed_at: float | None = None
    node: NodeName | None = None
    admission_ttl: float | None = None
    """Set on bookings made by admission (the scheduling gate): seconds the booking stays
    valid while its pod is unbound, in place of the booking TTL, since an admitted pod still
    waits its turn in kube-scheduler's queue. A commit restarts the clock with the booking TTL.
    Absent on bookings made at filter time."""

    @property
    def admitted(self) -> bool:
        """Whether admission made this booking (the pod passed rgpu's scheduling gate)."""
        return self.admission_ttl is not None

    def to_dict(self) -> ClaimDict:
        out: ClaimDict = {
            "pod": self.pod.to_dict(),
            "server": self.server,
            "cards": list(self.cards),
            "containers": [c.to_dict() for c in self.containers],
            "state": self.state.value,
            "bookedAt": self.booked_at,
            "committedAt": self.committed_at,
            "node": self.node,
        }
        if self.admission_ttl is not None:
            out["admissionTtlSeconds"] = self.admission_ttl
        return out

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> Claim:
        m = v.as_mapping(raw, path)
        node = v.opt_string(m, "node", path)
        return cls(
            pod=PodRef.from_dict(m.get("pod"), v.join(path, "pod")),
            server=ServerName(v.string(m, "server", path)),
            cards=tuple(CardId(c) for c in v.strings(m, "cards", path)),
            containers=v.items(m, "containers", path, ContainerAssignment.from_dict, ()),
            state=ClaimState(v.choice(m, "state", path, [s.value for s in ClaimState])),
            booked_at=v.number(m, "bookedAt", path),
            committed_at=v.opt_number(m, "committedAt", path),
            node=NodeName(node) if node is not None else None,
            admission_ttl=_positive(m, "admissionTtlSeconds", path),
        )


def _positive(raw: Mapping[str, object], key: str, path: str) -> float | None:
    value = v.opt_number(raw, key, path)
    if value is not None and not value > 0:
        raise ContractError(v.join(path, key), f"must be a positive number of seconds, got {value}")
    return value


class ClaimSetDict(TypedDict):
    revision: int
    claims: list[ClaimDict]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimSet:
    """Every claim the allocator knows, at a ``revision`` for long-polling."""

    revision: int
    claims: tuple[Claim, ...]

    def to_dict(self) -> ClaimSetDict:
        return {"revision": self.revision, "claims": [c.to_dict() for c in self.claims]}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ClaimSet:
        m = v.as_mapping(raw, path)
        return cls(
            revision=v.integer(m, "revision", path, minimum=0),
            claims=v.items(m, "claims", path, Claim.from_dict),
        )


class AllocationDict(TypedDict):
    pod: PodRefDict
    server: str
    endpoint: str
    cards: list[str]
    containers: list[ContainerAssignmentDict]
    state: str
    bookedAt: float
    expiresAt: float | None
    annotations: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """The allocator's answer: ``server`` at ``endpoint`` for ``pod``.

    ``expires_at`` is when an unbound booking lapses (``None`` once bound); ``annotations``
    are filled by commit and must be carried by the Binding.
    """

    pod: PodRef
    server: ServerName
    endpoint: str
    cards: tuple[CardId, ...]
    containers: tuple[ContainerAssignment, ...]
    state: ClaimState
    booked_at: float
    expires_at: float | None = None
    annotations: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> AllocationDict:
        return {
            "pod": self.pod.to_dict(),
            "server": self.server,
            "endpoint": self.endpoint,
            "cards": list(self.cards),
            "containers": [c.to_dict() for c in self.containers],
            "state": self.state.value,
            "bookedAt": self.booked_at,
            "expiresAt": self.expires_at,
            "annotations": dict(self.annotations),
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> Allocation:
        m = v.as_mapping(raw, path)
        return cls(
            pod=PodRef.from_dict(m.get("pod"), v.join(path, "pod")),
            server=ServerName(v.string(m, "server", path)),
            endpoint=v.string(m, "endpoint", path),
            cards=tuple(CardId(c) for c in v.strings(m, "cards", path)),
            containers=v.items(m, "containers", path, ContainerAssignment.from_dict, ()),
            state=ClaimState(v.choice(m, "state", path, [s.value for s in ClaimState])),
            booked_at=v.number(m, "bookedAt", path),
            expires_at=v.opt_number(m, "expiresAt", path),
            annotations=v.string_map(m, "annotations", path, {}),
        )


class CommitRequestDict(TypedDict):
    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitRequest:
    """Body of ``POST /v1/allocations/{uid}/commit``: the node kube-scheduler binds the pod to."""

    node: NodeName

    def to_dict(self) -> CommitRequestDict:
        return {"node": self.node}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> CommitRequest:
        m = v.as_mapping(raw, path)
        node = v.string(m, "node", path)
        if not node:
            raise ContractError(v.join(path, "node"), "expected the node name the pod binds to")
        return cls(node=NodeName(node))


class ServerVerdictDict(TypedDict):
    server: str
    reasons: list[ReasonCountDict]
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerVerdict:
    """Why one server was refused (for ``rgpu explain``)."""

    server: ServerName
    reasons: tuple[ReasonCount, ...]
    detail: str = ""

    def to_dict(self) -> ServerVerdictDict:
        return {
            "server": self.server,
            "reasons": [r.to_dict() for r in self.reasons],
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ServerVerdict:
        m = v.as_mapping(raw, path)
        return cls(
            server=ServerName(v.string(m, "server", path)),
            reasons=v.items(m, "reasons", path, ReasonCount.from_dict),
            detail=v.string(m, "detail", path, ""),
        )


class NoFitDict(TypedDict):
    reasons: list[ReasonCountDict]
    total: int
    message: str
    servers: list[ServerVerdictDict]


@dataclass(frozen=True, slots=True, kw_only=True)
class NoFit:
    """Nothing fits: counts per reason out of ``total`` cards, plus per-server detail."""

    reasons: tuple[ReasonCount, ...]
    total: int
    servers: tuple[ServerVerdict, ...] = ()

    @property
    def message(self) -> str:
        return render_reasons(self.reasons, self.total) or f"0/0 {Reason.NO_SERVERS.value}"

    def to_dict(self) -> NoFitDict:
        return {
            "reasons": [r.to_dict() for r in self.reasons],
            "total": self.total,
            "message": self.message,
            "servers": [s.to_dict() for s in self.servers],
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> NoFit:
        m = v.as_mapping(raw, path)
        return cls(
            reasons=v.items(m, "reasons", path, ReasonCount.from_dict),
            total=v.integer(m, "total", path, minimum=0),
            servers=v.items(m, "servers", path, ServerVerdict.from_dict, ()),
        )
