"""Problems on server Nodes must reach an operator exactly once per
distinct problem — a log line for a port label that falls back to the default, a Kubernetes
Event for a register annotation that cannot be read — not once per watch event, which for a
busy node would be every few seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .kubeevents import NodeEvent
from .nodes import NodeView
from .servers import Register, port_problem

__all__ = ["REASON_BAD_REGISTER", "NodeNotices"]

logger = logging.getLogger(__name__)

REASON_BAD_REGISTER = "RemoteGPURegisterInvalid"


class NodeNotices:
    """Remembers which problems were already reported, per node, until the node goes away."""

    def __init__(self, *, default_port: int, emit: Callable[[NodeEvent], None]) -> None:
        self._default_port = default_port
        self._emit = emit
        self._ports: dict[str, set[str | None]] = {}
        self._errors: dict[str, set[tuple[str, str]]] = {}

    def server(self, view: NodeView, register: Register) -> None:
        """Report what is wrong with server ``view`` that was not reported before."""
        self._port(view)
        if register.undecodable and register.error:
            self._register(view, register.error)

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
        seen = self._errors.setdefault(view.name, set())
        if (view.uid, error) in seen:
            return
        seen.add((view.uid, error))
        logger.warning("%s", error, extra={"node": view.name})
        self._emit(
            NodeEvent(
                node=view.name,
                uid=view.uid,
                reason=REASON_BAD_REGISTER,
                message=f"rgpu-discovery cannot use this server's cards: {error}",
            )
        )
