"""Which servers are lost, why, and since when: the facts the lost-server watch acts on, kept
apart from its writes so the rule reads in one place. A listed server is lost while its Node is
not Ready or lupine does not answer its probes; a held server the fleet no longer lists (its
Node deleted or unlabelled) is lost too, since its holders' CUDA calls hang the same. A loss is
dated from when this replica first saw it, on its own clock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rgpu_contracts import Server, ServerName

__all__ = ["Loss", "Losses"]

logger = logging.getLogger(__name__)

UNLISTED = "it is no longer in the fleet (its Node was deleted or lost its lupine label)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Loss:
    since: float
    why: str


class Losses:
    """The lost servers this replica has seen, with the moment it first saw each."""

    __slots__ = ("_losses",)

    def __init__(self) -> None:
        self._losses: dict[ServerName, Loss] = {}

    def __bool__(self) -> bool:
        return bool(self._losses)

    def track(
        self, servers: Mapping[ServerName, Server], held: set[ServerName], now: float
    ) -> None:
        """Look at the fleet's ``servers`` and the ``held`` ones (claims on them) at ``now``."""
        for name, server in servers.items():
            self._lose(name, _lost_because(server), now)
        for name in held - servers.keys():
            self._lose(name, UNLISTED, now)
        for name in self._losses.keys() - servers.keys() - held:
            del self._losses[name]

    def past(self, server: ServerName, now: float, grace: float) -> Loss | None:
        """``server``'s loss once it has lasted ``grace`` seconds."""
        loss = self._losses.get(server)
        return loss if loss is not None and now - loss.since >= grace else None

    def lost(self, server: ServerName) -> bool:
        return server in self._losses

    def deadlines(self, grace: float) -> Iterable[float]:
        """When each loss will have lasted the grace."""
        return (loss.since + grace for loss in self._losses.values())

    def clear(self) -> None:
        self._losses.clear()

    def _lose(self, name: ServerName, why: str | None, now: float) -> None:
        if why is None:
            self._losses.pop(name, None)
        elif name not in self._losses:
            logger.warning("remote GPU server %s is lost: %s", name, why)
            self._losses[name] = Loss(since=now, why=why)


def _lost_because(server: Server) -> str | None:
    if not server.ready:
        return f"Node {server.node_name} is not Ready"
    if not server.reachable:
        return f"lupine at {server.endpoint} does not answer probes"
    return None
