"""A probe's result reaches every replica's fleet only through the server's state Lease, so
writing it must be right under every race the apiserver allows, and cheap enough at a
thousand servers.

* **Only on change, plus a heartbeat.** A probe whose state equals the stored one writes
  nothing, unless the stored one is older than ``heartbeat_seconds``; so a fleet at rest
  costs ``servers / heartbeat`` writes per second, and a state nobody refreshes is visibly
  stale.
* **Compare-and-swap.** A write carries the resourceVersion read; on ``409`` another replica
  wrote first (two owners for a moment during a handover): re-read, fold the probe's outcome
  into what is stored now, decide again. A bounded number of rounds.
* **Nothing lost to an apiserver failure.** A state that could not be written stays pending
  and is retried every ``retry_seconds``; the next probe of that server folds its outcome
  into the pending state, so two failed probes still count as two.
* **Tidy.** The state Lease of a server whose Node is gone is deleted by the replica owning
  that name (with a resourceVersion precondition), so states do not pile up.
* **Bounded.** Every write spends a token of ``budget``; with none left a change waits as
  pending, a heartbeat for the next probe. ``rgpu_discovery_state_writes_total`` counts
  every attempt by reason and outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts.ids import ServerName
from rgpu_runtime.errors import KubeConflict, KubeError, KubeNotFound
from rgpu_runtime.pacing import TokenBucket

from .clients import StateLeaseApi
from .fleet import FleetState, ProbeReport
from .instruments import Instruments
from .probe_states import ProbeState, StampedState, decode_state, encode_state, state_lease_name
from .state_watch import StateWatch

__all__ = ["ATTEMPTS", "HEARTBEAT_SECONDS", "StateWriter", "WriterPolicy"]

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 300.0
"""An unchanged state is rewritten every five minutes, as a kubelet reports an unchanged Node
status (``nodeStatusReportFrequency``): the heartbeat only shows that a server's prober is
alive (``rgpu_discovery_stale_states``), which membership Leases already do for the replicas,
while every rewrite costs an apiserver write and a watch event in every replica. At 60 s
the heartbeats were a third of discovery's CPU at rest at 1,000 servers."""

ATTEMPTS = 5
"""Compare-and-swap rounds per write; more than two owners of one server never happen, so
losing five times in a row means the apiserver is misbehaving, and the state stays pending."""

Fold = Callable[[ProbeState], ProbeState]


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterPolicy:
    """How often states are rewritten and how fast."""

    heartbeat_seconds: float = HEARTBEAT_SECONDS
    """An unchanged state is rewritten at the first probe this long after its last write."""
    writes_per_second: float = 50.0
    """Budget for this replica's writes; at 1,000 servers and a 300 s heartbeat the steady
    rate is about 3.3 per second, so changes have room."""
    retry_seconds: float = 1.0
    """How often states the apiserver refused are retried."""
    reflect_seconds: float = 2.0
    """How long a writer waits for its own write to come back through the watch."""
    orphan_seconds: float = 10.0
    """A state whose Node is gone is deleted once it was last written this long ago: a Node
    watch lagging behind the Lease watch for a moment must not cost a new server its state."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pending:
    endpoint: str
    probe: ProbeState


class StateWriter:
    """Writes probe results into state Leases; ``run`` retries what failed."""

    def __init__(
        self,
        *,
        api: StateLeaseApi,
        fleet: FleetState,
        watch: StateWatch,
        instruments: Instruments,
        identity: str,
        policy: WriterPolicy,
        owns: Callable[[ServerName], bool] = lambda _: True,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._fleet = fleet
        self._watch = watch
        self._instruments = instruments
        self._identity = identity
        self._owns = owns
        self._policy = policy
        self._wall = wall_clock
        self._budget = TokenBucket(policy.writes_per_second, burst=policy.writes_per_second)
        self._pending: dict[ServerName, _Pending] = {}

    @property
    def pending(self) -> int:
        """States waiting to be written (apiserver failures or budget)."""
        return len(self._pending)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Retry pending states and delete orphaned ones every ``retry_seconds``, until
        cancelled."""
        task_status.started()
        while True:
            await anyio.sleep(self._policy.retry_seconds)
            for server, pending in list(self._pending.items()):
                if self._pending.get(server) is pending:
                    del self._pending[server]
                    fold = _constant(pending.probe)
                    await self._write(server, pending.endpoint, fold, retrying=True)
            for orphan in self._fleet.orphans():
                stale = self._wall() - orphan.renewed_at > self._policy.orphan_seconds
                if stale and self._owns(orphan.server):
                    await self._delete(orphan)

    async def _delete(self, orphan: StampedState) -> None:
        try:
            await self._api.delete(state_lease_name(orphan.server), orphan.version)
        except KubeError as exc:
            # Gone already, rewritten meanwhile, or the apiserver is away: next time.
            logger.debug("orphaned state of %s not deleted: %s", orphan.server, exc)

    def stale_states(self) -> int:
        """Probe states of listed servers last written more than two heartbeats ago."""
        limit = self._wall() - 2 * self._policy.heartbeat_seconds
        return sum(1 for state in self._fleet.listed_states() if state.renewed_at < limit)

    async def record(self, report: ProbeReport) -> None:
        """Fold ``report`` into its server's state and write it if that is due; returns once
        the write is in this replica's fleet (or failed, or is pending)."""
        pending = self._pending.pop(report.server, None)
        outcome = report.outcome
        if pending is not None and pending.endpoint == report.endpoint:
            await self._write(
                report.server, report.endpoint, _constant(pending.probe.after(outcome))
            )
        else:
            await self._write(report.server, report.endpoint, lambda base: base.after(outcome))

    async def _write(
        self, server: ServerName, endpoint: str, fold: Fold, *, retrying: bool = False
    ) -> None:
        current = self._fleet.state(server)
        try:
            for _ in range(ATTEMPTS):
                written = await self._attempt(server, endpoint, fold, current)
                if not isinstance(written, _Lost):
                    if written is not None:
                        await self._watch.caught_up(
                            server, int(written.version), self._policy.reflect_seconds
                        )
                    return
                current = written.current
        except _Deferred:
            pass
        except KubeError as exc:
            # Once per outage and server; the retries are counted, not logged.
            level = logging.DEBUG if retrying else logging.WARNING
            logger.log(level, "probe state of %s not written, will retry: %s", server, exc)
        self._pending[server] = _Pending(endpoint=endpoint, probe=fold(_base(current, endpoint)))

    async def _attempt(
        self, server: ServerName, endpoint: str, fold: Fold, current: StampedState | None
    ) -> StampedState | _Lost | None:
        """One round: ``None`` when nothing was due, the written state, or ``_Lost``."""
        probe = fold(_base(current, endpoint))
        kept = current if current is not None and current.endpoint == endpoint else None
        same = kept is not None and kept.probe == probe
        reason = "heartbeat" if same else "change"
        if same and not self._heartbeat_due(current):
            return None
        if not self._budget.take():
            self._count(reason, "deferred")
            if reason == "change":
                raise _Deferred
            return None
        since = kept.since if kept is not None and kept.probe.same_for_fleet(probe) else None
        body = self._body(server, endpoint, probe, since)
        try:
            raw = await self._send(body, current)
        except (KubeConflict, KubeNotFound):
            self._count(reason, "conflict")
            return _Lost(await self._reread(server))
        except KubeError:
            self._count(reason, "error")
            raise
        self._count(reason, "written")
        return decode_state(raw)

    async def _send(self, body: dict[str, Any], current: StampedState | None) -> dict[str, Any]:
        if current is None:
            return await self._api.create(body)
        body["metadata"]["resourceVersion"] = current.version
        return await self._api.replace(body)

    async def _reread(self, server: ServerName) -> StampedState | None:
        try:
            return decode_state(await self._api.read(state_lease_name(server)))
        except KubeNotFound:
            return None

    def _heartbeat_due(self, current: StampedState | None) -> bool:
        if current is None:
            return True
        return self._wall() - current.renewed_at >= self._policy.heartbeat_seconds

    def _body(
        self,
        server: ServerName,
        endpoint: str,
        probe: ProbeState,
        since: int | None,
    ) -> dict[str, Any]:
        return encode_state(
            server=server,
            endpoint=endpoint,
            probe=probe,
            since=since,
            holder=self._identity,
            now=self._wall(),
            heartbeat_seconds=self._policy.heartbeat_seconds,
        )

    def _count(self, reason: str, outcome: str) -> None:
        self._instruments.state_writes.labels(reason, outcome).inc()


@dataclass(frozen=True, slots=True)
class _Lost:
    """A compare-and-swap lost; ``current`` is what the apiserver holds now."""

    current: StampedState | None


class _Deferred(Exception):
    """The write budget is spent: the change stays pending (never leaves this module)."""


def _constant(probe: ProbeState) -> Fold:
    def fold(_: ProbeState) -> ProbeState:
        return probe

    return fold


def _base(current: StampedState | None, endpoint: str) -> ProbeState:
    if current is None or current.endpoint != endpoint:
        return ProbeState()
    return current.probe
