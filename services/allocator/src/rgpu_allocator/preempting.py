"""kube-scheduler cannot preempt for a remote GPU: its victims must run on the candidate node,
and a remote GPU's holder runs on another. So when a pod of priority is refused because servers
are held, the allocator frees one itself (docs/design.md §11):

1. choose the cheapest server to free (``rgpu_placement.preemptions``: every victim of lower
   priority; fewest victims, lowest priority, least run time lost, name);
2. nominate the pod on that server's Lease with compare-and-swap: the freed cards are promised
   to it (``occupancy.Occupancy`` keeps everyone of lower or equal priority off them), and a
   replica that finds a live nomination for the pod evicts nothing more — the nomination is
   the de-duplication between replicas and between the pod's retries;
3. evict the victims through the Eviction API, so PodDisruptionBudgets decide: every eviction
   is first asked as a dry run, and the victims one budget covers are counted against the
   disruptions it allows (``budgets``: a dry run judges one eviction, not the set); only when
   all would be allowed are they made, so a budget forbidding one victim's eviction moves on
   to the next server without evicting anyone. A budget that changes between the check and
   the evictions can still refuse a later one, and an apiserver shedding load can fail it:
   that attempt counts as ``partial``, the nomination stays, and the pod's next attempt
   evicts the rest (``resumed``) instead of freeing another server, since the victims that
   went would then have gone for nothing;
4. record Events on the victims and the pod, and nudge the pod: once the victims' claims are
   released after their graceful termination, its next filter books the server. Until then
   the pod books nothing else (``nominated_on``), even a server that frees first: a victim
   is never evicted for a pod that then does not take the server freed for it. Victims that
   had not started are deleted by their eviction at once; the booking path reads them again
   right after and, finding them gone, books the server in the same request, since a refusal
   would cost the pod a kube-scheduler backoff (1-2 s) while its server stood empty. A victim
   still behind rgpu's scheduling gate (a gang member whose siblings were being booked, a pod
   whose gate lift failed) is not evicted: its booking is taken back and it waits in the
   admission queue again — evicting it would delete a pod that never ran, and a gang would
   wait forever for the member nobody recreates.

The nomination expires after the booking TTL plus the victims' longest grace period, and
stops counting once its pod books, is gone or finished.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio
from opentelemetry import trace

from rgpu_contracts import AllocationRequest, Claim, PodRef, ServerName
from rgpu_placement import Demand, FleetView, Preemption, preemptions
from rgpu_runtime.errors import KubeError, RgpuError
from rgpu_runtime.telemetry import pod_attributes

from .clients import KubeApi, pod_event
from .errors import Contended, EvictionRefused, LeaseUnreadable
from .evicting import Asked, Evictor
from .instruments import Instruments
from .judging import Judge
from .leases import LeaseWriter
from .nominating import Nominations, Step, nominate, withdraw
from .pods import PodInfo, pod_info
from .policy import Policy
from .preemption_outcomes import Outcome, judged, may_preempt
from .removal import Remover

__all__ = ["MAX_CANDIDATES", "Preemptor"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

MAX_CANDIDATES = 3
"""Servers tried per refusal when evictions are refused (PodDisruptionBudgets); the pod's next
retry tries again, so a few keep one refusal's apiserver calls bounded."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Preemptor:
    """Frees a server for a refused pod of priority; the booking path calls ``preempt``."""

    policy: Policy
    judge: Judge
    writer: LeaseWriter
    api: KubeApi
    instruments: Instruments
    nudge: Callable[[], None]
    """Wakes the nudger, which moves refused pods (this one among them) back into the queue."""
    remover: Remover
    enabled: bool = True
    _taking_back: set[str] = field(default_factory=set, init=False)
    _spending: anyio.Lock = field(default_factory=anyio.Lock, init=False)
    _asked: set[tuple[str, str]] = field(default_factory=set, init=False)

    def unfinished(self, uid: str, view: FleetView) -> bool:
        """Whether ``uid`` holds a nomination whose victims were not all evicted (a
        ``partial`` attempt): its next attempt evicts the rest."""
        server = self.nominations.nominated_on(uid, view)
        return server is not None and bool(self._unevicted(uid, server))

    def taking_back(self) -> frozenset[str]:
        """The pods whose booking a preemption under way may take back: the admitter must
        not admit them meanwhile (their gate would be lifted with nothing booked)."""
        return frozenset(self._taking_back)

    async def preempt(
        self,
        request: AllocationRequest,
        demand: Demand,
        view: FleetView,
        *,
        admitting: Callable[[str], bool] = lambda uid: False,
    ) -> Outcome:
        """Try to free a server for ``request.pod`` after a refusal; returns what happened.
        ``admitting(uid)``: whether the admitter is lifting ``uid``'s gate now.

        Never raises our errors: the refusal stands whatever happens here, and the pod's next
        retry tries again.
        """
        if not self.enabled:
            return Outcome.NONE
        ref = request.pod
        named = pod_attributes(namespace=ref.namespace, name=ref.name, uid=ref.uid)
        with tracer.start_as_current_span("preempt", attributes=named):
            try:
                pod = await self._pod(request.pod)
                if pod is None or not may_preempt(pod):
                    return Outcome.NONE
                outcome = await self._preempt(pod, demand, view, admitting)
            except RgpuError as exc:
                logger.warning("preemption for %s failed: %s", request.pod.key, exc)
                outcome = Outcome.FAILED
        self.instruments.preemptions.labels(outcome.value).inc()
        return outcome

    @property
    def nominations(self) -> Nominations:
        """Where pods are held to while their victims leave (on this replica's caches)."""
        return Nominations(judge=self.judge)

    async def _pod(self, ref: PodRef) -> PodInfo | None:
        cached = self.judge.pods.get(ref.uid)
        if cached is not None:
            return cached
        raw = await self.api.get_pod(ref.namespace, ref.name)
        found = pod_info(raw) if raw is not None else None
        return found if found is not None and found.uid == ref.uid else None

    async def _preempt(
        self, pod: PodInfo, demand: Demand, view: FleetView, admitting: Callable[[str], bool]
    ) -> Outcome:
        nominated = self.nominations.nominated_on(pod.uid, view)
        if nominated is not None:
            return await self._resume(pod, nominated, admitting)
        options = preemptions(
            view,
            demand,
            self.judge.occupancy(pod.uid),
            priority=pod.priority,
            standing=self.nominations.standing,
            granularity=self.policy.granularity,
        )
        if not options:
            return Outcome.NONE
        for option in options[:MAX_CANDIDATES]:
            outcome = await self._attempt(pod, option, view, admitting)
            if outcome is not Outcome.BLOCKED:
                return outcome
        return Outcome.BLOCKED

    async def _attempt(
        self,
        pod: PodInfo,
        option: Preemption,
        view: FleetView,
        admitting: Callable[[str], bool],
    ) -> Outcome:
        return await self._guarded(
            pod, option.server, option.victims, admitting, lambda: self._try(pod, option, view)
        )

    async def _resume(
        self, pod: PodInfo, server: ServerName, admitting: Callable[[str], bool]
    ) -> Outcome:
        """Evict what the pod's standing nomination on ``server`` still waits for: victims
        left when an eviction stopped half-way (a budget, the apiserver shedding load)."""
        victims = self._unevicted(pod.uid, server)
        if not victims:
            return Outcome.PENDING
        return await self._guarded(
            pod, server, victims, admitting, lambda: self._continue(pod, server)
        )

    async def _guarded(
        self,
        pod: PodInfo,
        server: ServerName,
        victims: Sequence[Claim],
        admitting: Callable[[str], bool],
        act: Callable[[], Awaitable[Outcome]],
    ) -> Outcome:
        evictor = self._evictor
        held = {v.pod.uid for v in victims if evictor.gated(v)}
        lifting = any(admitting(uid) or uid in self._taking_back for uid in held)
        if lifting or any(evictor.gang_through(v) for v in victims):
            # Its gate may be lifted at any moment (or another preemption is taking it): a
            # booking taken back now would leave the pod through the gate with nothing booked.
            # A gang member whose siblings are through already is the rest of a gang booked
            # whole: taking its booking back would leave the gang running in part, for good.
            key = pod.ref.key
            logger.info("preemption for %s on %s waits: a victim is being admitted", key, server)
            return Outcome.BLOCKED
        self._taking_back.update(held)
        try:
            # Evictions spend disruption budgets: one preemption at a time rehearses and
            # evicts, so each sees what the one before spent (side by side, both would see
            # room for their own victims and be refused half-way, victims evicted for nothing).
            async with self._spending:
                return await act()
        finally:
            self._taking_back.difference_update(held)

    async def _try(self, pod: PodInfo, option: Preemption, view: FleetView) -> Outcome:
        if self.nominations.nominated_on(pod.uid, view) is not None:
            # Nominated while this attempt waited its turn (the filter path and an admission
            # pass both refused it): one promise per pod, or victims go on two servers.
            return Outcome.PENDING
        rehearsed = await self._rehearse(pod, option.server, option.victims)
        if rehearsed is not None:
            return rehearsed
        return await self._carry_out(pod, option)

    async def _continue(self, pod: PodInfo, server: ServerName) -> Outcome:
        victims = self._unevicted(pod.uid, server)
        if not victims:
            return Outcome.PENDING
        rehearsed = await self._rehearse(pod, server, victims)
        if rehearsed is not None:
            return rehearsed
        evicted = await self._evictor.evict(victims, pod.ref)
        outcome = judged(pod.ref.key, server, evicted, len(victims))
        if outcome is Outcome.NOMINATED:
            logger.info("preemption for %s on %s evicted the rest", pod.ref.key, server)
            self.nudge()
            return Outcome.RESUMED
        return outcome

    async def _rehearse(
        self, pod: PodInfo, server: ServerName, victims: Sequence[Claim]
    ) -> Outcome | None:
        """``None`` when every victim may go; else what the attempt amounts to."""
        try:
            await self._evictor.rehearse(victims)
        except EvictionRefused as exc:
            logger.info("preemption for %s on %s refused: %s", pod.ref.key, server, exc)
            return Outcome.BLOCKED
        except KubeError as exc:
            logger.warning("preemption for %s on %s failed: %s", pod.ref.key, server, exc)
            return Outcome.FAILED
        return None

    async def _carry_out(self, pod: PodInfo, option: Preemption) -> Outcome:
        nomination = self.nominations.nomination_for(pod, option, self.policy.ttl)
        try:
            step = await self.writer.edit(option.server, nominate(nomination), op="nominate")
        except (Contended, LeaseUnreadable) as exc:
            logger.info("cannot nominate %s on %s: %s", pod.ref.key, option.server, exc)
            return Outcome.BLOCKED
        if step is Step.MINE:
            return Outcome.PENDING
        if step is Step.TAKEN:
            return Outcome.BLOCKED
        evicted = await self._evictor.evict(option.victims, pod.ref)
        outcome = judged(pod.ref.key, option.server, evicted, len(option.victims))
        if outcome is Outcome.NOMINATED:
            self._announce(pod, option)
        elif not outcome.holds:
            # Nobody went: the server is no nearer free, and the promise would only keep
            # others off it.
            await self.writer.edit(option.server, withdraw(pod.uid), op="withdraw")
        return outcome

    def _unevicted(self, uid: str, server: ServerName) -> tuple[Claim, ...]:
        asked = Asked(judge=self.judge, pairs=self._asked).of(uid)
        return self.nominations.unevicted(uid, server, asked)

    @property
    def _evictor(self) -> Evictor:
        return Evictor(
            judge=self.judge,
            api=self.api,
            remover=self.remover,
            instruments=self.instruments,
            asked=self._asked,
        )

    def _announce(self, pod: PodInfo, option: Preemption) -> None:
        victims = ", ".join(v.pod.key for v in option.victims)
        message = (
            f"nominated for remote GPU server {option.server}; evicting {victims} "
            "(lower priority); the server is booked once they are gone"
        )
        event = pod_event(pod.ref, reason="Preempting", message=message, warning=False)
        self.api.record_event(event)
        self.nudge()
