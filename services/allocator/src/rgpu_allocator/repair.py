"""If a claim Lease is deleted or edited by hand, the pods already
running on that server would silently lose their protection and the server would be handed
out again. A bound, running pod of our scheduler carries the truth in its
``hami.io/remote-gpu-devices-allocated`` annotation, so its claim is rebuilt from there.

But the annotation is text on a pod, and not every pod passes the webhook that guards it: a pod
that asks for no GPU, or sets ``spec.nodeName`` itself, is never sent there. So nothing in it
is taken on trust (docs/design.md §10): a claim is rebuilt only for a pod in a namespace the webhook
sees (not ``kube-system``, not labelled ``rgpu.io/webhook=ignore``: there anyone may write the
annotation), that asks for the count resource, runs ``RGPU_SCHEDULER_NAME``, and whose
annotation names cards of one server of the fleet exactly as rgpu would have given them for
the pod's own demand (``server`` granularity: every healthy card, each ask fitting; ``card``:
the effective count, each card large enough; per container the cards
``rgpu_placement.assign`` gives). Anything else is a
refused repair: an Event on the pod and a metric, and nothing booked. A repair that would
overlap another pod's claim is never resolved silently either. Each is reported once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace

from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    Claim,
    PodUID,
)
from rgpu_runtime.settings import ResourceSettings
from rgpu_runtime.telemetry import pod_attributes

from .claims import LeaseRecord
from .clients import KubeApi, pod_event
from .instruments import Instruments
from .judging import Judge
from .leases import Edited, LeaseWriter
from .pods import PodInfo, pod_info
from .policy import Policy
from .vetting import Untrusted, vet

__all__ = [
    "REFUSED_REASON",
    "WEBHOOK_EXEMPT_NAMESPACES",
    "WEBHOOK_IGNORE_LABEL",
    "Repairer",
]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

REPORTED = 10_000
"""Refusals and conflicts remembered so each is reported once, not on every sweep."""
WHY_CHARS = 300
"""A refusal's reason is trimmed to this in Events and logs: it may quote the annotation."""
REFUSED_REASON = "RemoteGPURepairRefused"
"""The Event reason of a refused repair."""
CONFLICT_REASON = "RemoteGPUClaimConflict"
"""The Event reason of a repair that found the cards held by another pod."""
WEBHOOK_EXEMPT_NAMESPACES = frozenset({"kube-system"})
"""Namespaces the webhook's ``namespaceSelector`` leaves out (k8s/base/extender/webhook.yaml):
their pods never pass the guard on scheduler-owned annotations, so none is trusted."""
WEBHOOK_IGNORE_LABEL = ("rgpu.io/webhook", "ignore")
"""The namespace label that opts a namespace out of the webhook, as the selector reads it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Outcome:
    """What a repair's Lease edit found: whether it wrote, or who holds the cards instead."""

    wrote: bool = False
    holders: tuple[Claim, ...] = ()


class Repairer:
    """Restores missing claims of bound, running pods from their annotations, when trusted."""

    __slots__ = (
        "_api",
        "_instruments",
        "_judge",
        "_policy",
        "_refused",
        "_reported",
        "_resources",
        "_writer",
    )

    def __init__(
        self,
        policy: Policy,
        judge: Judge,
        writer: LeaseWriter,
        api: KubeApi,
        instruments: Instruments,
        *,
        resources: ResourceSettings,
    ) -> None:
        self._policy = policy
        self._judge = judge
        self._writer = writer
        self._api = api
        self._instruments = instruments
        self._resources = resources
        self._reported: OrderedDict[str, None] = OrderedDict()
        self._refused: OrderedDict[PodUID, int | None] = OrderedDict()
        """Refused pods and the fleet revision they were refused on (``None``: whatever the
        fleet). The pod's spec cannot change and only trusted users may change its
        annotation, so only a new fleet can turn a refusal around; until then the pod is not
        read again on every sweep."""

    def eligible(self, pod: PodInfo) -> bool:
        """Whether ``pod`` claims cards: bound, running, annotated (trust is judged later)."""
        return pod.bound and pod.phase == "Running" and pod.has_allocated

    def needed(self, pod: PodInfo) -> bool:
        """Whether ``pod`` claims cards it holds no claim for, and was not refused already."""
        return (
            self.eligible(pod)
            and not self._judge.ledger.claims_of(pod.uid)
            and not self._settled(pod.uid)
        )

    def _settled(self, uid: PodUID) -> bool:
        if uid not in self._refused:
            return False
        refused_on = self._refused[uid]
        view = self._judge.discovery.view
        return refused_on is None or (view is not None and view.fleet.revision == refused_on)

    async def repair(self, pod: PodInfo) -> bool:
        """Rebuild ``pod``'s claim if still needed on a fresh read and trusted; returns
        whether it did."""
        if pod.scheduler_name != self._policy.scheduler_name:
            # schedulerName is immutable: the cached pod is as good as a fresh read.
            why = f"it runs {pod.scheduler_name}, not rgpu's {self._policy.scheduler_name}"
            await self._refuse(pod, Untrusted(why=why), revision=None)
            return False
        view = self._judge.discovery.view
        if view is None:
            return False  # judged against the fleet, so not before discovery sent one
        unwatched = await self._unwatched(pod.namespace)
        if unwatched is not None:
            await self._refuse(pod, unwatched, revision=None)
            return False
        raw = await self._api.get_pod(pod.namespace, pod.name)
        fresh = pod_info(raw) if raw is not None else None
        if raw is None or fresh is None or fresh.uid != pod.uid or not self.needed(fresh):
            return False
        named = pod_attributes(namespace=pod.namespace, name=pod.name, uid=pod.uid)
        with tracer.start_as_current_span("repair", attributes=named):
            vetted = vet(
                raw,
                fresh,
                view=view,
                resources=self._resources,
                granularity=self._policy.granularity,
                now=self._judge.clock(),
            )
            if isinstance(vetted, Untrusted):
                await self._refuse(fresh, vetted, revision=view.fleet.revision)
                return False
            return await self._write(fresh, vetted)

    async def _unwatched(self, namespace: str) -> Untrusted | None:
        """Why rgpu's webhook never saw pods of ``namespace`` (so nothing rgpu wrote can be on
        them), or ``None`` when it does see them."""
        if namespace in WEBHOOK_EXEMPT_NAMESPACES:
            return Untrusted(why=f"namespace {namespace} is exempt from rgpu's webhook")
        raw = await self._api.get_namespace(namespace)
        labels = ((raw or {}).get("metadata") or {}).get("labels") or {}
        key, value = WEBHOOK_IGNORE_LABEL
        if labels.get(key) == value:
            why = f"namespace {namespace} is labelled {key}={value}, so rgpu's webhook skips it"
            return Untrusted(why=why)
        return None

    async def _refuse(self, pod: PodInfo, untrusted: Untrusted, *, revision: int | None) -> None:
        self._refused[pod.uid] = revision
        self._refused.move_to_end(pod.uid)
        while len(self._refused) > REPORTED:
            self._refused.popitem(last=False)
        why = untrusted.why if len(untrusted.why) <= WHY_CHARS else f"{untrusted.why[:WHY_CHARS]}…"
        message = (
            f"no claim restored from {ANNOTATION_ALLOCATED}: {why}. If rgpu did not place this "
            "pod, the annotation is forged: delete the pod. If it did (the fleet or "
            "RGPU_GRANULARITY changed since), the pod holds no server: delete it to schedule "
            "it again"
        )
        if await self._report(pod, message, reason=REFUSED_REASON):
            self._instruments.repairs.labels(outcome="refused_untrusted").inc()

    def _restore(self, pod: PodInfo, claim: Claim, record: LeaseRecord | None) -> Edited[_Outcome]:
        if record is not None and record.claim_of(pod.uid) is not None:
            return Edited(None, _Outcome())
        held = self._judge.occupancy(pod.uid).with_lease(claim.server, record)
        holders = tuple(
            c
            for c in held.blocking(claim.server)
            if self._policy.granularity == "server" or set(c.cards) & set(claim.cards)
        )
        if holders:
            return Edited(None, _Outcome(holders=holders))
        return Edited((*(record.claims if record is not None else ()), claim), _Outcome(wrote=True))

    async def _write(self, pod: PodInfo, claim: Claim) -> bool:
        outcome = await self._writer.edit(
            claim.server, lambda record: self._restore(pod, claim, record), op="repair"
        )
        if outcome.holders:
            await self._conflict(pod, claim, outcome.holders)
        elif outcome.wrote:
            self._instruments.repairs.labels(outcome="repaired").inc()
            logger.warning("repaired the missing claim of %s on %s", pod.ref.key, claim.server)
        return outcome.wrote

    async def _conflict(self, pod: PodInfo, claim: Claim, holders: Sequence[Claim]) -> None:
        names = ", ".join(sorted(h.pod.key for h in holders))
        self._instruments.repair_conflicts.inc()
        await self._report(
            pod,
            f"its claim on {claim.server} is missing and cannot be restored: {names} now holds "
            f"the same cards; one of the pods must be deleted by an operator",
            reason=CONFLICT_REASON,
        )

    async def _report(self, pod: PodInfo, message: str, *, reason: str) -> bool:
        """Log and record ``message`` as an Event once per pod; returns whether it was new."""
        key = f"{pod.uid}:{message}"
        if key in self._reported:
            return False
        self._reported[key] = None
        while len(self._reported) > REPORTED:
            self._reported.popitem(last=False)
        logger.warning("pod %s: %s", pod.ref.key, message)
        self._api.record_event(pod_event(pod.ref, reason=reason, message=message))
        return True
