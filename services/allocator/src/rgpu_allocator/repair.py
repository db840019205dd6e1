"""If a claim Lease is deleted or edited by hand, the pods already
running on that server would silently lose their protection and the server would be handed
out again. A bound, running pod of our scheduler carries the truth in its
``hami.io/remote-gpu-devices-allocated`` annotation, so its claim is rebuilt from there.

Only pods of ``RGPU_SCHEDULER_NAME`` are trusted: the webhook denies users these annotations on
our pods, but on any other pod a forged annotation must reserve nothing. A repair that would
overlap another pod's claim is never resolved silently: it is logged, counted, and reported
as a Kubernetes Event on the pod, once per conflict.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    CardId,
    Claim,
    ClaimState,
    ContainerAssignment,
    ContractError,
    NodeName,
    ServerName,
    decode_devices,
    split_card_id,
)

from .claims import LeaseRecord
from .clients import KubeApi, pod_event
from .instruments import Instruments
from .judging import Judge, Policy
from .leases import Edited, LeaseWriter
from .pods import PodInfo, pod_info

__all__ = ["Repairer"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

REPORTED = 10_000
"""Conflicts remembered so each is reported once, not on every sweep."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Outcome:
    """What a repair's Lease edit found: whether it wrote, or who holds the cards instead."""

    wrote: bool = False
    holders: tuple[Claim, ...] = ()


def _names(raw: Mapping[str, Any]) -> list[str]:
    spec = raw.get("spec") or {}
    listed = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return [str(c.get("name", "")) for c in listed if isinstance(c, Mapping)]


def _parts(raw: Mapping[str, Any]) -> tuple[tuple[CardId, ...], ...]:
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    decoded = decode_devices(str(annotations.get(ANNOTATION_ALLOCATED, "")))
    return tuple(tuple(entry.card for entry in part) for part in decoded)


def _claim(pod: PodInfo, raw: Mapping[str, Any], now: float) -> Claim:
    """The claim ``raw``'s annotation describes; raises ``ContractError`` when unusable."""
    parts = _parts(raw)
    cards = tuple(dict.fromkeys(card for part in parts for card in part))
    servers = {split_card_id(card)[0] for card in cards}
    if len(servers) != 1:
        raise ContractError(ANNOTATION_ALLOCATED, f"names {len(servers)} servers, expected 1")
    names = _names(raw)
    # A pod spec never changes its containers, so names and parts line up; "#i" only if an
    # annotation was written for more containers than the pod has.
    named = [names[i] if i < len(names) else f"#{i}" for i in range(len(parts))]
    assigned = zip(named, parts, strict=True)
    return Claim(
        pod=pod.ref,
        server=ServerName(servers.pop()),
        cards=cards,
        containers=tuple(ContainerAssignment(name=n, cards=p) for n, p in assigned),
        state=ClaimState.BOUND,
        booked_at=now,
        committed_at=now,
        node=NodeName(pod.node_name or ""),
    )


class Repairer:
    """Restores missing claims of bound, running pods from their annotations."""

    __slots__ = ("_api", "_instruments", "_judge", "_policy", "_reported", "_writer")

    def __init__(
        self,
        policy: Policy,
        judge: Judge,
        writer: LeaseWriter,
        api: KubeApi,
        instruments: Instruments,
    ) -> None:
        self._policy = policy
        self._judge = judge
        self._writer = writer
        self._api = api
        self._instruments = instruments
        self._reported: OrderedDict[str, None] = OrderedDict()

    def eligible(self, pod: PodInfo) -> bool:
        """Whether ``pod`` may be repaired: ours, bound, running, annotated."""
        ours = pod.scheduler_name == self._policy.scheduler_name
        return ours and pod.bound and pod.phase == "Running" and pod.has_allocated

    def needed(self, pod: PodInfo) -> bool:
        return self.eligible(pod) and not self._judge.ledger.claims_of(pod.uid)

    async def repair(self, pod: PodInfo) -> bool:
        """Rebuild ``pod``'s claim if still needed on a fresh read; returns whether it did."""
        raw = await self._api.get_pod(pod.namespace, pod.name)
        fresh = pod_info(raw) if raw is not None else None
        if raw is None or fresh is None or fresh.uid != pod.uid or not self.needed(fresh):
            return False
        with tracer.start_as_current_span("repair", attributes={"pod": pod.ref.key}):
            try:
                claim = _claim(fresh, raw, self._judge.clock())
            except ContractError as exc:
                await self._report(fresh, f"cannot repair from {ANNOTATION_ALLOCATED}: {exc}")
                return False
            return await self._write(fresh, claim)

    def _restore(self, pod: PodInfo, claim: Claim, record: LeaseRecord | None) -> Edited[_Outcome]:
        if record is not None and record.claim_of(pod.uid) is not None:
            return Edited(None, _Outcome())
        held = self._judge.occupancy(pod.uid, leases=lambda s: record)
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
            self._instruments.repairs.inc()
            logger.warning("repaired the missing claim of %s on %s", pod.ref.key, claim.server)
        return outcome.wrote

    async def _conflict(self, pod: PodInfo, claim: Claim, holders: Sequence[Claim]) -> None:
        names = ", ".join(sorted(h.pod.key for h in holders))
        self._instruments.repair_conflicts.inc()
        await self._report(
            pod,
            f"its claim on {claim.server} is missing and cannot be restored: {names} now holds "
            f"the same cards; one of the pods must be deleted by an operator",
        )

    async def _report(self, pod: PodInfo, message: str) -> None:
        key = f"{pod.uid}:{message}"
        if key in self._reported:
            return
        self._reported[key] = None
        while len(self._reported) > REPORTED:
            self._reported.popitem(last=False)
        logger.warning("pod %s: %s", pod.ref.key, message)
        event = pod_event(pod.ref, reason="RemoteGPUClaimConflict", message=message)
        self._api.record_event(event)
