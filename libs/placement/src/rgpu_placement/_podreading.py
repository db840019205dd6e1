"""The webhook, the filter and ``rgpu explain`` must read a pod's remote-GPU ask the same
way, and a malformed quantity must be refused with its container and value named, never read as
"asks for nothing" (that would place a GPU pod on a node without any GPU wiring).

Values come from ``limits`` first, then ``requests`` (Kubernetes requires them equal for extended
resources, and defaults a missing request from the limit). Only plain decimal integers in
0..2^31-1 are accepted: ``1.5``, ``-1``, ``1e3`` or a unit suffix are refused even where
Kubernetes' quantity grammar would allow them, because HAMi reads these resources as integers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rgpu_contracts import LABEL_CUDA_MAJOR, MAX_CUDA_MAJOR, ContainerKind, ContainerRequest

from ._errors import InvalidQuantity

__all__ = [
    "MAX_QUANTITY",
    "ContainerDemand",
    "ContainerSlot",
    "PodDemand",
    "Section",
    "container_slots",
    "read_cuda_major",
    "read_demand",
]

MAX_QUANTITY = 2**31 - 1

Section = Literal["initContainers", "containers"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSlot:
    """One container of a pod spec: where it sits (for patches) and how Kubernetes counts it."""

    section: Section
    index: int
    kind: ContainerKind
    name: str
    body: Mapping[str, Any]


def _object(value: object) -> Mapping[str, Any]:
    # Absent and ``null`` read alike: as an empty JSON object.
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _kind(section: Section, body: Mapping[str, Any]) -> ContainerKind:
    if section == "containers":
        return ContainerKind.APP
    # A native sidecar is an init container that keeps running beside the app containers.
    return ContainerKind.SIDECAR if body.get("restartPolicy") == "Always" else ContainerKind.INIT


def container_slots(pod: Mapping[str, Any]) -> Iterator[ContainerSlot]:
    """Yield init containers (sidecars included) then app containers, in pod order."""
    spec = _object(pod.get("spec"))
    sections: tuple[Section, ...] = ("initContainers", "containers")
    for section in sections:
        for index, raw in enumerate(_list(spec.get(section))):
            body = _object(raw)
            name = str(body.get("name") or f"{section}[{index}]")
            kind = _kind(section, body)
            yield ContainerSlot(section=section, index=index, kind=kind, name=name, body=body)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerDemand:
    """One container's ask beside its place in the pod spec."""

    slot: ContainerSlot
    count: int
    memory_mib: int

    def to_request(self) -> ContainerRequest:
        return ContainerRequest(
            name=self.slot.name, kind=self.slot.kind, count=self.count, memory_mib=self.memory_mib
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PodDemand:
    """Every container of a pod (init first, in pod order) with its remote-GPU ask, and the
    CUDA major version it asks for (its ``rgpu.io/cuda-major`` label; ``None``: any)."""

    containers: tuple[ContainerDemand, ...]
    cuda_major: int | None = None

    @property
    def asks(self) -> bool:
        """Whether any container asks for at least one card."""
        return any(c.count for c in self.containers)

    @property
    def requesting(self) -> tuple[ContainerDemand, ...]:
        """The containers that ask for cards (those that need the env wiring)."""
        return tuple(c for c in self.containers if c.count)

    def requests(self) -> tuple[ContainerRequest, ...]:
        """Every container, askers or not: the device codec needs one part per container."""
        return tuple(c.to_request() for c in self.containers)


def read_demand(pod: Mapping[str, Any], *, count_resource: str, memory_resource: str) -> PodDemand:
    """Read each container's count and memory and the pod's CUDA major; raises
    ``InvalidQuantity`` naming the culprit."""
    return PodDemand(
        containers=tuple(
            _container(slot, count_resource, memory_resource) for slot in container_slots(pod)
        ),
        cuda_major=read_cuda_major(pod),
    )


def read_cuda_major(pod: Mapping[str, Any]) -> int | None:
    """The pod's ``rgpu.io/cuda-major`` label as a number, ``None`` when absent.

    Raises ``InvalidQuantity`` when the label is not a whole number up to 999: a pod that asks
    for a version it cannot spell must be told, not placed on any server.
    """
    labels = _object(_object(pod.get("metadata")).get("labels"))
    if LABEL_CUDA_MAJOR not in labels:
        return None
    text = _text(labels[LABEL_CUDA_MAJOR])
    digits = text.lstrip("0")
    if (
        text.isascii()
        and text.isdigit()
        and len(digits) <= 3
        and int(digits or "0") <= MAX_CUDA_MAJOR
    ):
        return int(digits or "0")
    raise InvalidQuantity(
        f"pod label {LABEL_CUDA_MAJOR}={_shown(text)} is not a CUDA major version; write the "
        f'major version the client shim was built for, e.g. "12"',
        container="",
        resource=LABEL_CUDA_MAJOR,
        value=_shown(text, quoted=False),
    )


def _container(slot: ContainerSlot, count_resource: str, memory_resource: str) -> ContainerDemand:
    count = _quantity(slot, count_resource, _COUNT_HINT)
    memory = _quantity(slot, memory_resource, _MEMORY_HINT)
    if memory and not count:
        raise InvalidQuantity(
            f'container "{slot.name}" asks for {memory_resource}={memory} but not for '
            f'{count_resource}; add {count_resource}: "1" to its limits, or drop the memory ask',
            container=slot.name,
            resource=count_resource,
            value="",
        )
    return ContainerDemand(slot=slot, count=count, memory_mib=memory)


_COUNT_HINT = 'cards per container, e.g. "1"'
_MEMORY_HINT = 'MiB per card, e.g. "40000" (no unit suffix)'


def _raw_quantity(body: Mapping[str, Any], resource: str) -> object | None:
    resources = _object(body.get("resources"))
    for part in ("limits", "requests"):
        values = _object(resources.get(part))
        if resource in values:
            value: object = values[resource]
            return value
    return None


def _quantity(slot: ContainerSlot, resource: str, hint: str) -> int:
    raw = _raw_quantity(slot.body, resource)
    if raw is None:
        return 0
    text = _text(raw)
    problem = _problem(text)
    if problem is not None:
        raise InvalidQuantity(
            f'container "{slot.name}": {resource}={_shown(text)} {problem}; '
            f"write a plain whole number of {hint}",
            container=slot.name,
            resource=resource,
            value=_shown(text, quoted=False),
        )
    return int(text.lstrip("0") or "0")


_MAX_DIGITS = len(str(MAX_QUANTITY))
_SHOWN_CHARS = 40


def _text(raw: object) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, int):
        # A JSON integer of thousands of digits cannot even be turned into text (Python refuses
        # int-to-str conversions past 4300 digits); anything past 19 digits is too large anyway.
        return str(raw) if -(10**19) < raw < 10**19 else "9" * 20
    if isinstance(raw, float):
        return repr(raw)
    return f"<{type(raw).__name__}>"


def _shown(text: str, *, quoted: bool = True) -> str:
    """The value as messages show it: cut short, so a megabyte of digits is not echoed back."""
    cut = text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}... ({len(text)} chars)"
    return repr(cut) if quoted else cut


def _problem(text: str) -> str | None:
    if text.isascii() and text.isdigit():
        # Count digits before int(): Python refuses to convert more than 4300 of them, and a
        # value this long is out of range whatever it says.
        digits = text.lstrip("0")
        if len(digits) > _MAX_DIGITS or int(digits or "0") > MAX_QUANTITY:
            return f"is larger than {MAX_QUANTITY}"
        return None
    if text.startswith("-"):
        return "is negative"
    return "is not a whole number"
