"""Turning a server Node into a ``Server`` is HAMi's compatibility
contract (DESIGN §3), and it must be exact: port from the label, endpoint from the first
InternalIP, only ``mode == "remote"`` cards, absent health meaning unhealthy.

A server that cannot be used is still listed, with ``error`` saying why, so its holders stay
accounted for and an operator sees the problem in the fleet instead of a missing node.
"""

from __future__ import annotations

from dataclasses import dataclass

from rgpu_contracts import ContractError
from rgpu_contracts.fleet import Card, Server
from rgpu_contracts.hami import (
    ANNOTATION_REGISTER,
    RegisteredCard,
    card_id,
    decode_register,
    join_endpoint,
)
from rgpu_contracts.hami import port_from_label as _port_rule
from rgpu_contracts.ids import ServerName

from .nodes import NodeView
from .probestate import ProbeState

__all__ = ["Register", "build_server", "decode_cards", "port_problem"]


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


def build_server(
    view: NodeView, register: Register, probe: ProbeState, default_port: int
) -> Server:
    """The fleet's view of server node ``view``."""
    port = _port_rule(view.server_label, default_port).port
    endpoint = None if view.internal_ip is None else join_endpoint(view.internal_ip, port)
    problems = [register.error] if register.error else []
    if endpoint is None:
        problems.insert(0, "node has no InternalIP address, so lupine cannot be reached")
    return Server(
        name=ServerName(view.name),
        endpoint=endpoint,
        port=port,
        ready=view.ready,
        reachable=probe.reachable,
        usage_reported=probe.usage_reported,
        busy=probe.busy,
        topology=view.topology,
        cards=register.cards if endpoint is not None else (),
        error="; ".join(problems) or None,
    )
