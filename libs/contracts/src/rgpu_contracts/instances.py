"""One lupine per GPU: a server Node may run several ``lupine_driver_server`` processes, each
on its own port with only its own GPUs visible, and each is then a server of its own — its own
fleet entry, probe, claim Lease and metrics. The Node declares them in one annotation:

    rgpu.io/lupine-instances: '[{"port":14834,"gpus":["GPU-a"]},{"port":14835,"gpus":["GPU-b"]}]'

An instance's server is named ``<node>@<port>``. The name must be unique in the cluster, stable
while the instance runs, and usable wherever a server name goes: a card id
(``<server>/<GPU UUID>``, so no ``/``), HAMi's device codec (``,`` ``:`` ``;`` separate its
fields), a metric label and, hashed, a Lease name. A Node name is a DNS subdomain, which never
holds ``@``, so no instance can take a Node's name, and one Node never listens twice on one
port, so two instances never share one. The port, not the GPU, names the instance: replacing a
card keeps its server.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypedDict

from . import _validate as v
from .errors import ContractError
from .ids import GpuUuid, NodeName, ServerName

__all__ = [
    "ANNOTATION_INSTANCES",
    "INSTANCE_SEPARATOR",
    "MAX_INSTANCES",
    "InstanceDict",
    "LupineInstance",
    "decode_instances",
    "encode_instances",
    "instance_server_name",
    "node_of_server",
]

ANNOTATION_INSTANCES: Final = "rgpu.io/lupine-instances"
INSTANCE_SEPARATOR: Final = "@"
MAX_INSTANCES: Final = 64
"""More lupine processes than any machine has GPUs; bounds what one annotation can cost."""


class InstanceDict(TypedDict):
    port: int
    gpus: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class LupineInstance:
    """One lupine process on a server Node: its port and the GPUs it serves."""

    port: int
    gpus: tuple[GpuUuid, ...]

    def to_dict(self) -> InstanceDict:
        return {"port": self.port, "gpus": list(self.gpus)}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> LupineInstance:
        m = v.as_mapping(raw, path)
        gpus = tuple(GpuUuid(g.strip()) for g in v.strings(m, "gpus", path))
        if not gpus or not all(gpus):
            raise ContractError(v.join(path, "gpus"), "list the GPU UUIDs this instance serves")
        return cls(port=v.integer(m, "port", path, minimum=1, maximum=65535), gpus=gpus)


def instance_server_name(node: str, port: int) -> ServerName:
    """The server name of the lupine instance on ``node`` at ``port``: ``<node>@<port>``."""
    return ServerName(f"{node}{INSTANCE_SEPARATOR}{port}")


def node_of_server(server: str) -> NodeName:
    """The Node a server runs on: the part before ``@`` of an instance, else the name itself."""
    return NodeName(server.partition(INSTANCE_SEPARATOR)[0])


def decode_instances(text: str) -> tuple[LupineInstance, ...]:
    """Decode ``rgpu.io/lupine-instances``.

    Raises ``ContractError`` naming the entry when the text is not a JSON array of
    ``{"port": 1..65535, "gpus": [UUID, ...]}``, is empty or longer than ``MAX_INSTANCES``,
    or when two instances share a port or a GPU.
    """
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ContractError("", f"not JSON ({exc}); expected [{_EXAMPLE}, ...]") from None
    entries = v.as_list(raw, "")
    if not 0 < len(entries) <= MAX_INSTANCES:
        raise ContractError("", f"expected 1 to {MAX_INSTANCES} instances, got {len(entries)}")
    instances = tuple(LupineInstance.from_dict(e, f"[{i}]") for i, e in enumerate(entries))
    _check_distinct(instances)
    return instances


_EXAMPLE = '{"port": 14834, "gpus": ["GPU-..."]}'


def _check_distinct(instances: Sequence[LupineInstance]) -> None:
    ports: set[int] = set()
    owners: dict[str, int] = {}
    for i, instance in enumerate(instances):
        if instance.port in ports:
            raise ContractError(f"[{i}].port", f"port {instance.port} is used twice")
        ports.add(instance.port)
        for gpu in instance.gpus:
            if gpu in owners:
                raise ContractError(
                    f"[{i}].gpus", f"{gpu} is already served by instance [{owners[gpu]}]"
                )
            owners[gpu] = i


def encode_instances(instances: Sequence[LupineInstance]) -> str:
    """The annotation value for ``instances``, as compact JSON."""
    return json.dumps([i.to_dict() for i in instances], separators=(",", ":"))
