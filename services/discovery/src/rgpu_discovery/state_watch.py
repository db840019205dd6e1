"""Every replica's fleet must come from the same probe states, whoever probed, so each
replica follows the state Leases (``probe_states``) with the runtime's ``Reflector`` and folds
every change into its ``FleetState``; its own writes reach its fleet the same way, never as a
shortcut. A caller that wrote a state and must answer with the fleet that contains it (an
on-demand probe) waits for the watch to deliver that version (``caught_up``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts.ids import ServerName
from rgpu_runtime.feeds import Versioned
from rgpu_runtime.kube import ObjectChange, Reflector, ReflectorTiming
from rgpu_runtime.pacing import Backoff

from .clients import StateLeaseApi
from .fleet import FleetState
from .probe_states import StampedState, decode_state

__all__ = ["StateWatch"]

logger = logging.getLogger(__name__)


def _number(version: str) -> int:
    return int(version) if version.isdigit() else 0


class StateWatch:
    """Keeps the fleet's probe states in step with the state Leases."""

    def __init__(self, *, api: StateLeaseApi, fleet: FleetState, backoff: Backoff) -> None:
        self._fleet = fleet
        self.applied: Versioned[int] = Versioned(0)
        """Bumped after every applied change, for ``caught_up``."""
        self.reflector = Reflector[StampedState](
            name="probe states",
            list_pages=api.pages,
            watch=api.watch,
            transform=_decoded,
            on_change=self._changed,
            on_relist=self._relisted,
            timing=ReflectorTiming(backoff=backoff),
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the state Leases until cancelled; started after the first list."""
        await self.reflector.run(task_status=task_status)

    async def caught_up(self, server: ServerName, version: int, timeout: float) -> bool:
        """Wait until the fleet holds ``server``'s state at ``version`` or newer; whether it
        did within ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            seen = self.applied.revision
            while not self._holds(server, version):
                seen, _ = await self.applied.wait_newer(seen, timeout)
            return True
        return False

    def _holds(self, server: ServerName, version: int) -> bool:
        state = self._fleet.state(server)
        return state is not None and _number(state.version) >= version

    def _changed(self, change: ObjectChange[StampedState]) -> None:
        if change.after is not None:
            self._fleet.apply_states((change.after,))
        elif change.before is not None:
            self._fleet.apply_states((), (change.before.server,), _number(change.resource_version))
        self.applied.publish(self.applied.value + 1)

    def _relisted(
        self,
        changes: Sequence[ObjectChange[StampedState]],
        values: Mapping[str, StampedState],
    ) -> None:
        states = [c.after for c in changes if c.after is not None]
        gone = [c.before.server for c in changes if c.after is None and c.before is not None]
        self._fleet.apply_states(states, gone)
        self.applied.publish(self.applied.value + 1)


def _decoded(obj: dict[str, Any]) -> StampedState | None:
    state = decode_state(obj)
    if state is None:
        name = (obj.get("metadata") or {}).get("name")
        logger.warning("state Lease %s is not one discovery wrote; ignored", name)
    return state
