"""Claims leave Leases for three reasons — the pod released them, they
became invalid, or the pod holds claims on two servers because replicas raced on it — and
each removal must be decided again on the Lease as the apiserver holds it, never on a
stale copy, so that no valid claim is ever dropped.

Duplicates settle deterministically: every replica keeps ``winner(...)`` (most advanced state,
then smallest server name) and releases the rest, so racing replicas converge on one server.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from opentelemetry import trace

from rgpu_contracts import Claim
from rgpu_placement import Validity, precedence, winner

from .core import Core
from .leases import LeaseRecord

__all__ = ["drop_invalid", "release", "settle", "why_invalid"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


def why_invalid(core: Core, claim: Claim, gone: Collection[str] = ()) -> str:
    """A metric label for why ``claim`` no longer holds its cards."""
    uid = claim.pod.uid
    if uid in gone or core.pods.gone(uid):
        return "deleted"
    pod = core.pods.get(uid)
    if pod is not None and (pod.uid != uid or pod.finished):
        return "finished"
    return "expired"


async def drop_invalid(core: Core, server: str, gone: Collection[str] = ()) -> int:
    """Remove the claims on ``server`` that are invalid (or whose pods were just confirmed
    ``gone`` by a fresh read); returns how many were removed."""
    dropped: list[Claim] = []

    def change(record: LeaseRecord | None) -> tuple[Claim, ...] | None:
        if record is None:
            return None
        dead = [
            c for c in record.claims if c.pod.uid in gone or core.validity(c) is Validity.INVALID
        ]
        dropped[:] = dead
        return tuple(c for c in record.claims if c not in dead) if dead else None

    await core.writer.edit(server, change, op="sweep")
    for claim in dropped:
        core.instruments.sweep_removals.labels(why_invalid(core, claim, gone)).inc()
        logger.info("removed invalid claim of %s on %s", claim.pod.key, server)
    return len(dropped)


async def release(core: Core, uid: str) -> int:
    """Remove every claim of ``uid`` (the caller gave the server up); returns how many."""
    removed = 0
    with tracer.start_as_current_span("release", attributes={"pod.uid": uid}):
        for claim in core.ledger.claims_of(uid):
            removed += await _drop_one(core, claim.server, uid, keep=None)
    core.refused.forget(uid)
    return removed


async def settle(core: Core, uid: str) -> Claim | None:
    """Leave ``uid`` with at most one claim; returns the one kept."""
    claims = core.ledger.claims_of(uid)
    if len(claims) < 2:
        return claims[0] if claims else None
    keep = winner(c for c in claims if core.validity(c).blocks)
    for claim in claims:
        loser = keep is None or claim.server != keep.server
        if loser and await _drop_one(core, claim.server, uid, keep=keep):
            core.instruments.sweep_removals.labels("duplicate").inc()
    return keep


async def _drop_one(core: Core, server: str, uid: str, *, keep: Claim | None) -> int:
    """Remove ``uid``'s claim from ``server`` unless, read fresh, it now beats ``keep``."""
    dropped = 0

    def change(record: LeaseRecord | None) -> tuple[Claim, ...] | None:
        nonlocal dropped
        claim = record.claim_of(uid) if record is not None else None
        if record is None or claim is None:
            return None
        if (
            keep is not None
            and core.validity(claim).blocks
            and precedence(claim) < precedence(keep)
        ):
            # It moved ahead (committed meanwhile): the next settle keeps this one instead.
            return None
        dropped = 1
        return record.without(uid)

    await core.writer.edit(server, change, op="release")
    return dropped
