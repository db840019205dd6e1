"""A Node object from the apiserver is a large, loosely typed JSON document, and discovery
needs a few facts from it. Reading them in one place, tolerantly, keeps the rest of the service
working on a small frozen value instead of nested dicts.

A node is a **server** when it carries the ``hami.io/lupine-server`` label (any value, even
empty); every other node is a **client** node, of which only the topology labels matter.

A server's cards come from its register annotation, read by HAMi's compatibility contract
(docs/design.md §3), which must be exact: only ``mode == "remote"`` cards, absent health meaning
unhealthy. A server whose cards cannot be read is still listed, with ``error`` saying why, so
its holders stay accounted for and an operator sees the problem in the fleet instead of a
missing node.

Problems on server Nodes must reach an operator exactly once per distinct problem — a log line
for a port label that falls back to the default, a Kubernetes Event for a register annotation
that cannot be read — not once per watch event, which for a busy node would be every few
seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rgpu_contracts import ContractError
from rgpu_contracts.fleet import Card
from rgpu_contracts.hami import (
    ANNOTATION_DEVICE_CORDON,
    ANNOTATION_REGISTER,
    LABEL_SERVER,
    RegisteredCard,
    card_id,
    decode_register,
)
from rgpu_contracts.hami import port_from_label as _port_rule
from rgpu_contracts.ids import NodeName, ServerName
from rgpu_contracts.instances import ANNOTATION_INSTANCES

from .clients import NodeEvent
from .errors import MalformedNode

__all__ = [
    "REASON_BAD_INSTANCES",
    "REASON_BAD_REGISTER",
    "NodeNotices",
    "NodeView",
    "Register",
    "decode_cards",
    "node_name",
    "node_view",
    "port_problem",
]

logger = logging.getLogger(__name__)

REASON_BAD_REGISTER = "RemoteGPURegisterInvalid"
REASON_BAD_INSTANCES = "LupineInstancesInvalid"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """What discovery reads from one Node.

    ``server_label`` is the ``hami.io/lupine-server`` value (``None`` on a client node),
    ``register`` the raw register annotation, ``internal_ip`` the first ``InternalIP``,
    ``ready`` whether the ``Ready`` condition is ``True``, and ``topology`` the configured
    topology labels present on the node, in the configured order. ``unschedulable`` is
    ``spec.unschedulable`` (``kubectl cordon``); ``device_cordon`` and ``instances`` are the
    raw ``hami.io/device-cordon`` and ``rgpu.io/lupine-instances`` annotations.
    """

    name: NodeName
    uid: str
    server_label: str | None
    register: str | None
    internal_ip: str | None
    ready: bool
    topology: Labels
    unschedulable: bool = False
    device_cordon: str | None = None
    instances: str | None = None

    @property
    def is_server(self) -> bool:
        """Whether this node serves GPUs through lupine."""
        return self.server_label is not None


def node_view(raw: Mapping[str, object], topology_keys: Sequence[str]) -> NodeView:
    """Read a Node object; raises ``MalformedNode`` when it has no ``metadata.name``."""
    metadata = _mapping(raw.get("metadata"))
    status = _mapping(raw.get("status"))
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    return NodeView(
        name=node_name(raw),
        uid=_text(metadata.get("uid")) or "",
        server_label=_text(labels.get(LABEL_SERVER)),
        register=_text(annotations.get(ANNOTATION_REGISTER)),
        internal_ip=_first_internal_ip(status.get("addresses")),
        ready=_is_ready(status.get("conditions")),
        topology=_topology(labels, topology_keys),
        unschedulable=_mapping(raw.get("spec")).get("unschedulable") is True,
        device_cordon=_text(annotations.get(ANNOTATION_DEVICE_CORDON)),
        instances=_text(annotations.get(ANNOTATION_INSTANCES)),
    )


def node_name(raw: Mapping[str, object]) -> NodeName:
    """``metadata.name`` of a Node; raises ``MalformedNode`` when absent or empty."""
    name = _text(_mapping(raw.get("metadata")).get("name"))
    if not name:
        raise MalformedNode("a Node object without metadata.name was received; it is ignored")
    return NodeName(name)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _first_internal_ip(addresses: object) -> str | None:
    # The kubelet lists addresses in preference order; HAMi takes the first InternalIP.
    for address in addresses if isinstance(addresses, list) else ():
        entry = _mapping(address)
        value = _text(entry.get("address"))
        if entry.get("type") == "InternalIP" and value:
            return value
    return None


def _is_ready(conditions: object) -> bool:
    for condition in conditions if isinstance(conditions, list) else ():
        entry = _mapping(condition)
        if entry.get("type") == "Ready":
            return entry.get("status") == "True"
    return False


def _topology(labels: Mapping[str, object], keys: Sequence[str]) -> Labels:
    pairs = ((key, labels.get(key)) for key in keys)
    return tuple((key, value) for key, value in pairs if isinstance(value, str))


@dataclass(frozen=True, slots=True, kw_only=True)
class Register:
    """A server's decoded register annotation: its remote cards, or why there are none.

    ``text`` is the annotation it came from, so an unchanged annotation is never decoded
    twice; ``undecodable`` marks errors worth a Kubernetes Event (a missing annotation is
    normal while the device plugin starts and is not one).
    """

    text: str | None
    cards: tuple[Card, ...]
    error: str | None
    undecodable: bool = False


def decode_cards(server: ServerName, text: str | None) -> Register:
    """Decode ``hami.io/node-nvidia-register`` of ``server`` into cards (never raises)."""
    if text is None:
        error = f"no {ANNOTATION_REGISTER} annotation yet (HAMi's device plugin registers it)"
        return Register(text=None, cards=(), error=error)
    try:
        registered = decode_register(text)
    except ContractError as exc:
        error = f"annotation {ANNOTATION_REGISTER} is unusable ({exc}); no cards until it is fixed"
        return Register(text=text, cards=(), error=error, undecodable=True)
    cards = tuple(_card(server, entry) for entry in registered)
    return Register(text=text, cards=cards, error=None)


def _card(server: ServerName, entry: RegisteredCard) -> Card:
    return Card(
        id=card_id(server, entry.uuid),
        server=server,
        uuid=entry.uuid,
        index=entry.index,
        memory_mib=entry.memory_mib,
        cores=entry.cores,
        model=entry.model,
        numa=entry.numa,
        healthy=entry.healthy,
    )


def port_problem(view: NodeView, default_port: int) -> str | None:
    """Why the server label does not name a usable port (``None`` when it does)."""
    if view.server_label == "":
        return f"label value is empty; using the default port {default_port}"
    problem = _port_rule(view.server_label, default_port).problem
    return None if problem is None else f"{problem}; using the default port {default_port}"


class NodeNotices:
    """Remembers which problems were already reported, per node, until the node goes away."""

    def __init__(self, *, default_port: int, emit: Callable[[NodeEvent], None]) -> None:
        self._default_port = default_port
        self._emit = emit
        self._ports: dict[str, set[str | None]] = {}
        self._errors: dict[str, set[tuple[str, str]]] = {}

    def server(self, view: NodeView, register: Register, instances: str | None = None) -> None:
        """Report what is wrong with server ``view`` that was not reported before;
        ``instances`` says why its lupine instances annotation is unusable."""
        if view.instances is None:
            self._port(view)
        if register.undecodable and register.error:
            self._register(view, register.error)
        if instances is not None:
            self._report(view, REASON_BAD_INSTANCES, instances)

    def retain(self, names: Iterable[str]) -> None:
        """Forget every node not in ``names`` (after a relist)."""
        keep = set(names)
        self._ports = {name: seen for name, seen in self._ports.items() if name in keep}
        self._errors = {name: seen for name, seen in self._errors.items() if name in keep}

    def forget(self, name: str) -> None:
        """Forget node ``name`` (deleted): it is reported afresh if it comes back."""
        self._ports.pop(name, None)
        self._errors.pop(name, None)

    def _port(self, view: NodeView) -> None:
        seen = self._ports.setdefault(view.name, set())
        if view.server_label in seen:
            return
        seen.add(view.server_label)
        problem = port_problem(view, self._default_port)
        if problem is not None:
            level = logging.INFO if view.server_label == "" else logging.WARNING
            logger.log(level, "lupine port label: %s", problem, extra={"node": view.name})

    def _register(self, view: NodeView, error: str) -> None:
        self._report(view, REASON_BAD_REGISTER, error)

    def _report(self, view: NodeView, reason: str, error: str) -> None:
        seen = self._errors.setdefault(view.name, set())
        if (view.uid, error) in seen:
            return
        seen.add((view.uid, error))
        logger.warning("%s", error, extra={"node": view.name})
        what = "cards" if reason == REASON_BAD_REGISTER else "lupine instances"
        self._emit(
            NodeEvent(
                node=view.name,
                uid=view.uid,
                reason=reason,
                message=f"rgpu-discovery cannot use this server's {what}: {error}",
            )
        )
