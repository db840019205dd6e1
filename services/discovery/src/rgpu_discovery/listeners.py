"""A server Node runs one lupine for all its GPUs (HAMi's way: the ``hami.io/lupine-server``
label's port) or one per GPU (``rgpu.io/lupine-instances``: each its own port and GPUs), and
every listener is a server of the fleet. This module lays a Node out into its listeners — name,
port and cards, device cordons applied — so the fleet builds one ``Server`` per listener and
nothing else needs to know which way the Node runs.

An instance is named ``<node>@<port>`` (``rgpu_contracts.instances`` says why) and gets the
register's cards it lists, their ids under its own name. A GPU an instance lists that the
register does not hold as a remote card is a problem shown on that instance. An annotation that
cannot be read must not silently turn the Node back into one server on the label's port (its
instances' holders would suddenly share it): the Node is listed as one server with no cards and
the error, and an Event says why (``nodes.NodeNotices``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rgpu_contracts import ContractError
from rgpu_contracts.fleet import Card
from rgpu_contracts.hami import card_id, decode_device_cordon
from rgpu_contracts.hami import port_from_label as _port_rule
from rgpu_contracts.ids import GpuUuid, NodeName, ServerName
from rgpu_contracts.instances import (
    ANNOTATION_INSTANCES,
    LupineInstance,
    decode_instances,
    instance_server_name,
)

from .nodes import NodeView, Register

__all__ = ["Layout", "Listener", "listeners", "read_layout"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """A Node's ``rgpu.io/lupine-instances`` annotation, decoded once per text.

    ``instances`` is ``None`` when the Node is one server; ``error`` says why the annotation
    is unusable.
    """

    text: str | None
    instances: tuple[LupineInstance, ...] | None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    """One lupine listener of a Node: a server of the fleet."""

    name: ServerName
    node: NodeName | None
    """The Node it runs on when it is one of several instances (``None``: it is the Node)."""
    port: int
    cards: tuple[Card, ...]
    problem: str | None = None


def read_layout(text: str | None) -> Layout:
    """Decode the instances annotation (never raises)."""
    if text is None:
        return Layout(text=None, instances=None)
    try:
        return Layout(text=text, instances=decode_instances(text))
    except ContractError as exc:
        error = f"annotation {ANNOTATION_INSTANCES} is unusable ({exc}); no cards until it is fixed"
        return Layout(text=text, instances=None, error=error)


def listeners(
    view: NodeView, register: Register, layout: Layout, default_port: int
) -> tuple[Listener, ...]:
    """The servers Node ``view`` runs, in the annotation's order."""
    cordoned = decode_device_cordon(view.device_cordon)
    if layout.error is not None:
        port = _port_rule(view.server_label, default_port).port
        name = ServerName(view.name)
        return (Listener(name=name, node=None, port=port, cards=(), problem=layout.error),)
    if layout.instances is None:
        port = _port_rule(view.server_label, default_port).port
        cards = _cordoned(register.cards, cordoned)
        return (Listener(name=ServerName(view.name), node=None, port=port, cards=cards),)
    return tuple(_instance(view, register, i, cordoned) for i in layout.instances)


def _instance(
    view: NodeView, register: Register, instance: LupineInstance, cordoned: frozenset[GpuUuid]
) -> Listener:
    name = instance_server_name(view.name, instance.port)
    by_uuid = {card.uuid: card for card in register.cards}
    missing = [gpu for gpu in instance.gpus if gpu not in by_uuid]
    cards = tuple(_renamed(by_uuid[gpu], name) for gpu in instance.gpus if gpu in by_uuid)
    problem = None
    if missing and register.error is None:
        problem = f"{', '.join(missing)} not registered as remote cards on node {view.name}"
    return Listener(
        name=name,
        node=view.name,
        port=instance.port,
        cards=_cordoned(cards, cordoned),
        problem=problem,
    )


def _renamed(card: Card, server: ServerName) -> Card:
    return dataclasses.replace(card, id=card_id(server, card.uuid), server=server)


def _cordoned(cards: tuple[Card, ...], cordoned: frozenset[GpuUuid]) -> tuple[Card, ...]:
    if not cordoned:
        return cards
    return tuple(
        dataclasses.replace(card, cordoned=True) if card.uuid in cordoned else card
        for card in cards
    )
