"""A preemption's victims leave through the Eviction API, so PodDisruptionBudgets decide, and a
set of victims is rehearsed before anyone goes (dry runs, then the budgets' count: a dry run
judges one eviction, not the set). A victim still behind rgpu's scheduling gate never ran: its
booking is taken back instead, and it waits in the admission queue again. A set can still stop
half-way (a budget that changed since the rehearsal, an apiserver shedding load), and how far
it got decides what the preemption does next (docs/preemption.md), so evicting says it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from rgpu_contracts import Claim, PodRef
from rgpu_runtime.errors import KubeError, RgpuError

from .budgets import afford
from .clients import KubeApi, pod_event
from .errors import EvictionRefused
from .instruments import Instruments
from .judging import Judge
from .removal import Remover

__all__ = ["Asked", "Evicted", "Evictor"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Evicted:
    """How far evicting a set of victims got."""

    done: int
    """Victims evicted (or whose booking was taken back) before ``stopped``."""
    stopped: RgpuError | None = None
    """What stopped the rest: ``EvictionRefused`` (a budget) or a ``KubeError``."""

    @property
    def refused(self) -> bool:
        """Whether a budget (not the apiserver) stopped the set."""
        return isinstance(self.stopped, EvictionRefused)


@dataclass(frozen=True, slots=True, kw_only=True)
class Asked:
    """The victims this replica evicted and whose leaving its pod cache has not seen yet.

    The pod watch tells of an eviction a moment after it is made; a preemption resumed in
    that moment (the admitter's next pass comes at once) would find the victim still there
    and evict it again: a second call, a second Event, a victim counted twice.
    """

    judge: Judge
    pairs: set[tuple[str, str]] = field(default_factory=set)
    """(preemptor, victim) uids."""

    def of(self, uid: str) -> frozenset[str]:
        """The victims evicted for ``uid`` that the pod cache still shows staying."""
        pods = self.judge.pods
        for pair in tuple(self.pairs):
            victim = pods.get(pair[1])
            if victim is None or victim.deleting or victim.finished:
                self.pairs.discard(pair)
        return frozenset(victim for nominee, victim in self.pairs if nominee == uid)


@dataclass(frozen=True, slots=True, kw_only=True)
class Evictor:
    """Evicts victims for a preemptor, and says which victims must not be touched now."""

    judge: Judge
    api: KubeApi
    remover: Remover
    instruments: Instruments
    asked: set[tuple[str, str]]
    """(preemptor, victim) uids whose victim this replica asked to leave (see ``Asked``)."""

    def gated(self, victim: Claim) -> bool:
        """Whether ``victim`` is still behind rgpu's gate: it has not run, nor can it yet."""
        held = self.judge.pods.get(victim.pod.uid)
        return held is not None and held.gated is not None

    def gang_through(self, victim: Claim) -> bool:
        """Whether ``victim`` is behind the gate while members of its gang are through it."""
        held = self.judge.pods.get(victim.pod.uid)
        gang = held.gated.gang if held is not None and held.gated is not None else None
        if gang is None or gang.size is None:
            return False
        behind = sum(1 for p in self.judge.pods if p.gated is not None and p.gated.gang == gang)
        return behind < gang.size

    async def rehearse(self, victims: Sequence[Claim]) -> None:
        """Ask every victim's eviction as a dry run, then whether the budgets let them all go
        together; raises ``EvictionRefused`` at the first refusal, before anyone is evicted."""
        evicted = [v for v in victims if not self.gated(v)]
        for victim in evicted:
            await self.api.evict_pod(victim.pod.namespace, victim.pod.name, dry_run=True)
        await afford(self.api, tuple(v.pod for v in evicted))

    async def evict(self, victims: Sequence[Claim], pod: PodRef) -> Evicted:
        """Evict ``victims`` for ``pod`` in order, stopping at the first that cannot go."""
        for done, victim in enumerate(victims):
            try:
                await self._one(victim, pod)
            except (EvictionRefused, KubeError) as exc:
                return Evicted(done=done, stopped=exc)
        return Evicted(done=len(victims))

    async def _one(self, victim: Claim, pod: PodRef) -> None:
        if self.gated(victim):
            await self._take_back(victim, pod)
            return
        evicted = await self.api.evict_pod(victim.pod.namespace, victim.pod.name)
        self.asked.add((pod.uid, victim.pod.uid))
        if not evicted:
            return
        self.instruments.preemption_victims.inc()
        message = f"preempted by {pod.key} for a remote GPU on {victim.server}"
        self.api.record_event(pod_event(victim.pod, reason="Preempted", message=message))
        logger.info("evicted %s from %s for %s", victim.pod.key, victim.server, pod.key)

    async def _take_back(self, victim: Claim, pod: PodRef) -> None:
        await self.remover.release(victim.pod.uid)
        self.instruments.preemption_victims.inc()
        message = (
            f"booking of remote GPU server {victim.server} taken back for {pod.key} "
            "(higher priority); the pod waits in rgpu's admission queue again"
        )
        self.api.record_event(pod_event(victim.pod, reason="Preempted", message=message))
        logger.info("took back %s's booking of %s for %s", victim.pod.key, victim.server, pod.key)
