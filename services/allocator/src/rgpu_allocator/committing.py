"""At bind time the extender commits the pod's booking and gets back
the annotations the Binding must carry; commit must honour only a booking that is still
valid and still exclusively the pod's, and must find it even when another replica booked it
a moment ago and this replica's Lease watch has not delivered that write yet.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from opentelemetry import trace

from rgpu_contracts import Allocation, Claim, ClaimState, NodeName
from rgpu_placement import Validity, winner

from .annotations import binding_annotations
from .core import Core
from .errors import BookingExpired, CardsGone, ClaimNotFound, ServerTaken
from .leases import LeaseRecord, decode_lease
from .settling import settle

__all__ = ["Finder", "commit", "lookup"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

WATCH_GRACE = 0.5
"""Seconds to wait for the Lease watch to deliver another replica's booking before listing
the Leases: watch delivery takes milliseconds, a commit comes a whole scheduling cycle later."""
RELIST_INTERVAL = 1.0
"""At most one full Lease list per second for claims nobody has seen."""


class Finder:
    """Finds a pod's claims, waiting briefly for the watch and then listing if need be."""

    __slots__ = ("_core", "_listed", "_monotonic")

    def __init__(self, core: Core, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._core = core
        self._monotonic = monotonic
        self._listed = -RELIST_INTERVAL

    async def claims(self, uid: str) -> tuple[Claim, ...]:
        """``uid``'s claims; raises ``ClaimNotFound`` when none exist even after a fresh list."""
        ledger = self._core.ledger
        deadline = self._monotonic() + WATCH_GRACE
        while not ledger.claims_of(uid) and (left := deadline - self._monotonic()) > 0:
            await ledger.wait_newer(ledger.revision, left)
        if not ledger.claims_of(uid) and self._monotonic() - self._listed >= RELIST_INTERVAL:
            await self._relist()
        found = ledger.claims_of(uid)
        if not found:
            raise ClaimNotFound(f"no claim for pod uid {uid}; book it first (POST /v1/allocations)")
        return found

    async def _relist(self) -> None:
        self._listed = self._monotonic()
        listing = await self._core.api.list_leases()
        for raw in listing.items:
            record = decode_lease(raw)
            if record is not None:
                self._core.ledger.apply(record)


def lookup(core: Core, uid: str) -> Allocation:
    """The pod's current allocation; raises ``ClaimNotFound`` when it holds no valid claim."""
    claim = winner(core.live(uid))
    if claim is None:
        raise ClaimNotFound(f"no valid claim for pod uid {uid}")
    return core.allocation_of(claim)


def _committed(core: Core, uid: str, node: str, record: LeaseRecord | None) -> Claim:
    claim = record.claim_of(uid) if record is not None else None
    if record is None or claim is None:
        raise ClaimNotFound(f"the claim of pod uid {uid} was released; filter the pod again")
    if core.validity(claim) is not Validity.VALID:
        raise BookingExpired(
            f"the booking of {claim.pod.key} on {claim.server} expired "
            f"(older than {core.policy.ttl:g} s); filter the pod again"
        )
    held = core.occupancy(uid, leases=lambda s: record)
    taken = held.taken(claim.server)
    if held.blocking(claim.server) and (
        core.policy.granularity == "server" or taken & set(claim.cards)
    ):
        raise ServerTaken(f"{claim.server} is held by another pod; filter the pod again")
    state = ClaimState.BOUND if claim.state is ClaimState.BOUND else ClaimState.COMMITTED
    return dataclasses.replace(claim, state=state, committed_at=core.clock(), node=NodeName(node))


async def commit(core: Core, finder: Finder, uid: str, node: str) -> Allocation:
    """Commit ``uid``'s booking for ``node`` and return the Binding's annotations.

    Raises ``ClaimNotFound`` (no claim), ``BookingExpired`` (lapsed), ``ServerTaken`` (another
    pod holds the cards), ``CardsGone`` (cards left the fleet) and ``KubeUnavailable``.
    """
    view = core.require_view()
    with tracer.start_as_current_span("commit", attributes={"pod.uid": uid, "node": node}):
        claims = await finder.claims(uid)
        target = winner(c for c in claims if core.validity(c).blocks) or winner(claims)
        assert target is not None
        facts = view.facts.get(target.server)
        endpoint = facts.server.endpoint if facts is not None else None
        if not endpoint:
            raise CardsGone(f"{target.server} has no lupine endpoint now; filter the pod again")
        annotations = binding_annotations(
            target, endpoint=endpoint, cards=view.cards, granularity=core.policy.granularity
        )
        done: list[Claim] = []

        def change(record: LeaseRecord | None) -> tuple[Claim, ...]:
            done[:] = [_committed(core, uid, node, record)]
            assert record is not None
            return (*record.without(uid), done[0])

        await core.writer.edit(target.server, change, op="commit")
        await settle(core, uid)
    logger.info("committed %s on %s for node %s", target.pod.key, target.server, node)
    return core.allocation_of(done[0], annotations)
