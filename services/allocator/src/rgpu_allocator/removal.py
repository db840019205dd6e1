"""Claims leave Leases for three reasons — the pod released them, they became invalid, or the pod
holds claims on two servers because replicas raced on it — and each removal is decided again on
the Lease as the apiserver holds it, never on a stale copy, so that no valid claim is ever
dropped. Duplicates settle deterministically: every replica keeps ``winner(...)`` (most
advanced state, then smallest server name) and releases the rest, so racing replicas converge
on one server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from opentelemetry import trace

from rgpu_contracts import Claim
from rgpu_placement import Validity, precedence, winner

from .claims import LeaseRecord
from .clients import KubeApi
from .instruments import Instruments
from .judging import Judge, Seen
from .leases import Edited, LeaseWriter
from .pods import PodInfo, pod_info

__all__ = ["Remover", "read_pod"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


async def read_pod(api: KubeApi, claim: Claim) -> PodInfo | None:
    """``claim``'s pod as the apiserver has it now; ``None`` when it is gone (or another pod
    took its name)."""
    raw = await api.get_pod(claim.pod.namespace, claim.pod.name)
    pod = pod_info(raw) if raw is not None else None
    return pod if pod is not None and pod.uid == claim.pod.uid else None


def _ignore(claim: Claim) -> None:
    return None


class Remover:
    """Every way a claim leaves a Lease, each decided on the Lease as written."""

    __slots__ = ("_instruments", "_judge", "_lapsed", "_writer")

    def __init__(
        self,
        judge_: Judge,
        writer: LeaseWriter,
        instruments: Instruments,
        *,
        lapsed: Callable[[Claim], None] = _ignore,
    ) -> None:
        self._judge = judge_
        self._writer = writer
        self._instruments = instruments
        self._lapsed = lapsed

    def why_invalid(self, claim: Claim, seen: Seen) -> str:
        """A metric label for why ``claim`` no longer holds its cards."""
        uid = claim.pod.uid
        pods = self._judge.pods
        pod = seen[uid] if uid in seen else pods.get(uid)
        if (uid in seen and pod is None) or (uid not in seen and pods.gone(uid)):
            return "deleted"
        if pod is not None and (pod.uid != uid or pod.finished):
            return "finished"
        return "expired"

    async def drop_invalid(self, server: str, seen: Seen | None = None) -> int:
        """Remove the claims on ``server`` that are invalid, each judged again as found in the
        Lease being written (its state, booking time and commit), on the pods read fresh
        (``seen``) or else the pod cache; returns how many were removed.

        A claim judged invalid on an earlier read may have been committed since: judged again
        here, the commit restarts its clock and it stays (docs/design.md §10).
        """
        fresh: Seen = seen or {}

        def change(record: LeaseRecord | None) -> Edited[tuple[Claim, ...]]:
            if record is None:
                return Edited(None, ())
            verdicts = [(c, self._judge.validity(c, fresh)) for c in record.claims]
            dead = tuple(c for c, v in verdicts if v is Validity.INVALID)
            kept = tuple(c for c, v in verdicts if v is not Validity.INVALID)
            return Edited(kept if dead else None, dead)

        dropped = await self._writer.edit(server, change, op="sweep")
        for claim in dropped:
            why = self.why_invalid(claim, fresh)
            self._instruments.sweep_removals.labels(why).inc()
            logger.info("removed invalid claim of %s on %s", claim.pod.key, server)
            if why == "expired" and claim.admitted and claim.committed_at is None:
                self._lapsed(claim)
        return len(dropped)

    async def release(self, uid: str) -> int:
        """Remove every claim of ``uid`` (the caller gave the server up); returns how many."""
        removed = 0
        with tracer.start_as_current_span("release", attributes={"k8s.pod.uid": uid}):
            for claim in self._judge.ledger.claims_of(uid):
                removed += await self._writer.edit(claim.server, _released(uid), op="release")
        return removed

    async def settle(self, uid: str) -> Claim | None:
        """Leave ``uid`` with at most one claim; returns the one kept."""
        claims = self._judge.ledger.claims_of(uid)
        if len(claims) < 2:
            return claims[0] if claims else None
        keep = winner(c for c in claims if self._judge.validity(c).blocks)
        for claim in claims:
            loser = keep is None or claim.server != keep.server
            if loser and await self._drop_loser(claim.server, uid, keep):
                self._instruments.sweep_removals.labels("duplicate").inc()
        return keep

    async def _drop_loser(self, server: str, uid: str, keep: Claim | None) -> int:
        """Remove ``uid``'s claim from ``server`` unless, as found in the Lease, it still holds
        and beats ``keep`` (it was committed meanwhile: the next settle keeps it instead)."""

        def change(record: LeaseRecord | None) -> Edited[int]:
            claim = record.claim_of(uid) if record is not None else None
            if record is None or claim is None:
                return Edited(None, 0)
            holds = self._judge.validity(claim).blocks
            if holds and (keep is None or precedence(claim) < precedence(keep)):
                return Edited(None, 0)
            return Edited(record.without(uid), 1)

        return await self._writer.edit(server, change, op="release")


def _released(uid: str) -> Callable[[LeaseRecord | None], Edited[int]]:
    def change(record: LeaseRecord | None) -> Edited[int]:
        if record is None or record.claim_of(uid) is None:
            return Edited(None, 0)
        return Edited(record.without(uid), 1)

    return change
