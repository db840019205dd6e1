"""Whether a claim still holds its cards decides double-booking on one side and leaked servers
on the other; every activity asks it, on the same caches, under the same policy. The rule
itself is ``rgpu_placement.judge``; this module applies it to the allocator's caches.

While choosing a server for one pod, "which cards are held by someone else?" is asked of many
servers; ``Occupancy`` answers it from the Leases and the pod cache, judging each claim's
validity once per decision. It also says which of lupine's busy reports still count. A card
our own placed pod used is reported busy until discovery's next probe after that pod is gone;
if the pod's claim is invalid (finished, deleted) or the card was released after the fleet was
observed, that report is stale and ignored — otherwise a freed server would stay refused for a
probe interval. Busy cards no claim explains (clients placed outside rgpu) always count.

Claims leave Leases for three reasons — the pod released them, they became invalid, or the pod
holds claims on two servers because replicas raced on it — and each removal (``Remover``) is
decided again on the Lease as the apiserver holds it, never on a stale copy, so that no valid
claim is ever dropped. Duplicates settle deterministically: every replica keeps
``winner(...)`` (most advanced state, then smallest server name) and releases the rest, so
racing replicas converge on one server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from opentelemetry import trace

from rgpu_contracts import CardId, Claim, PodUID, card_id, split_card_id
from rgpu_placement import Granularity, ServerFacts, Validity, judge, precedence, winner
from rgpu_runtime import Settings

from .claims import LeaseRecord, Ledger, placed
from .clients import KubeApi
from .inputs import Inputs
from .instruments import Instruments
from .leases import Edited, LeaseWriter, Pending
from .pods import PodIndex, pod_info

__all__ = [
    "ClaimsGone",
    "Judge",
    "LeaseLookup",
    "Occupancy",
    "PendingLookup",
    "Policy",
    "ReleaseLookup",
    "Remover",
    "confirmed_invalid",
]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

LeaseLookup = Callable[[str], LeaseRecord | None]
"""Where a server's Lease is read from: the ledger, or a fresher copy during a write."""

PendingLookup = Callable[[str], tuple[Claim, ...]]
"""This replica's bookings still being written, per server (see ``leases.Pending``)."""


ReleaseLookup = Callable[[str, float], bool]
"""Whether a card left a placed claim after a moment (see ``Ledger.released_after``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """The settings allocation decisions depend on."""

    granularity: Granularity
    ttl: float
    """Seconds an unbound booking (or commit) stays valid."""
    scheduler_name: str
    """Only pods of this scheduler are ever repaired from their annotations."""
    namespace: str
    """Where the claim Leases live."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        s = settings.scheduling
        return cls(
            granularity=s.granularity,
            ttl=s.booking_ttl_seconds,
            scheduler_name=s.scheduler_name,
            namespace=s.namespace,
        )


def _nothing_pending(server: str) -> tuple[Claim, ...]:
    return ()


def _never_released(card: str, moment: float) -> bool:
    return False


def _uuid(card: CardId) -> str:
    return split_card_id(card)[1]


class Occupancy:
    """Claims of pods other than ``uid`` that still hold cards, per server, at time ``now``."""

    __slots__ = (
        "_cache",
        "_leases",
        "_now",
        "_observed",
        "_pending",
        "_pods",
        "_released",
        "_ttl",
        "uid",
    )

    def __init__(
        self,
        leases: LeaseLookup,
        pods: PodIndex,
        *,
        uid: PodUID,
        now: float,
        ttl: float,
        pending: PendingLookup = _nothing_pending,
        released: ReleaseLookup = _never_released,
        observed_at: float = float("inf"),
    ) -> None:
        self._leases = leases
        self._pending = pending
        self._released = released
        self._observed = observed_at
        self._pods = pods
        self._now = now
        self._ttl = ttl
        self.uid = uid
        self._cache: dict[str, tuple[Claim, ...]] = {}

    def validity(self, claim: Claim) -> Validity:
        """The verdict on any claim, from the pod cache at this decision's time."""
        uid = claim.pod.uid
        pod = self._pods.get(uid)
        return judge(claim, pod, now=self._now, ttl=self._ttl, gone=self._pods.gone(uid))

    def blocking(self, server: str) -> tuple[Claim, ...]:
        """Claims of other pods on ``server`` that are valid or not yet known to be invalid."""
        found = self._cache.get(server)
        if found is None:
            found = self._judge(server)
            self._cache[server] = found
        return found

    def problem(self, server: str) -> str | None:
        """Why the server's Lease cannot be trusted (it then counts as fully held)."""
        record = self._leases(server)
        return record.problem if record is not None else None

    def taken(self, server: str) -> frozenset[CardId]:
        """Cards of ``server`` held by other pods."""
        return frozenset(card for claim in self.blocking(server) for card in claim.cards)

    def busy(self, facts: ServerFacts, *, claims_gone: bool = False) -> frozenset[str]:
        """GPU UUIDs of ``facts`` whose busy report still counts (see the module docstring).

        With ``claims_gone``, the busy reports every placed claim explains are discounted too
        ("would this server be free if its holders were gone?").
        """
        if not facts.busy:
            return facts.busy
        record = self._leases(facts.name)
        claims = record.claims if record is not None else ()
        stale = {
            _uuid(card)
            for c in claims
            if placed(c) and (claims_gone or not self.validity(c).blocks)
            for card in c.cards
        }
        stale.update(
            u for u in facts.busy if self._released(card_id(facts.name, u), self._observed)
        )
        return facts.busy - stale if stale else facts.busy

    def without_claims(self) -> ClaimsGone:
        """These holdings as if every claim were gone (lupine's reports of them too)."""
        return ClaimsGone(self)

    def _judge(self, server: str) -> tuple[Claim, ...]:
        record = self._leases(server)
        stored = record.claims if record is not None else ()
        held = [c for c in stored if c.pod.uid != self.uid and self.validity(c).blocks]
        seen = {c.pod.uid for c in stored} | {self.uid}
        held.extend(c for c in self._pending(server) if c.pod.uid not in seen)
        return tuple(held)


class ClaimsGone:
    """``Occupancy`` with its claims removed: which servers only claims keep from a pod."""

    __slots__ = ("_held",)

    def __init__(self, held: Occupancy) -> None:
        self._held = held

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return ()

    def problem(self, server: str) -> str | None:
        return None

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset()

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return self._held.busy(facts, claims_gone=True)

    def without_claims(self) -> ClaimsGone:
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class Judge:
    """Verdicts on claims from the caches (Leases, pods, fleet) at the current time."""

    ledger: Ledger
    pods: PodIndex
    inputs: Inputs
    ttl: float
    pending: Pending = field(default_factory=Pending)
    """Bookings this replica is writing right now; they count as held meanwhile."""
    clock: Callable[[], float] = field(default=time.time)
    """Wall-clock seconds: claim times are compared across replicas."""

    def occupancy(self, uid: str, *, leases: LeaseLookup | None = None) -> Occupancy:
        """Who else holds what, for a decision about ``uid`` now."""
        view = self.inputs.view
        return Occupancy(
            leases or self.ledger.lease,
            self.pods,
            uid=PodUID(uid),
            now=self.clock(),
            ttl=self.ttl,
            pending=self.pending.claims,
            released=self.ledger.released_after,
            observed_at=view.fleet.observed_at if view is not None else float("inf"),
        )

    def validity(self, claim: Claim) -> Validity:
        return self.occupancy(claim.pod.uid).validity(claim)

    def live(self, uid: str) -> tuple[Claim, ...]:
        """``uid``'s claims that still hold their cards."""
        return tuple(c for c in self.ledger.claims_of(uid) if self.validity(c).blocks)


async def confirmed_invalid(judge_: Judge, api: KubeApi, claim: Claim) -> bool:
    """Whether ``claim`` is invalid, checked against a fresh read of its pod when the cache
    cannot tell (or says it still holds)."""
    if judge_.validity(claim) is Validity.INVALID:
        return True
    raw = await api.get_pod(claim.pod.namespace, claim.pod.name)
    pod = pod_info(raw) if raw is not None else None
    if pod is None or pod.uid != claim.pod.uid:
        return True
    verdict = judge(claim, pod, now=judge_.clock(), ttl=judge_.ttl)
    return verdict is Validity.INVALID


class Remover:
    """Every way a claim leaves a Lease, each decided on the Lease as written."""

    __slots__ = ("_instruments", "_judge", "_writer")

    def __init__(self, judge_: Judge, writer: LeaseWriter, instruments: Instruments) -> None:
        self._judge = judge_
        self._writer = writer
        self._instruments = instruments

    def why_invalid(self, claim: Claim, gone: Collection[str] = ()) -> str:
        """A metric label for why ``claim`` no longer holds its cards."""
        uid = claim.pod.uid
        pods = self._judge.pods
        if uid in gone or pods.gone(uid):
            return "deleted"
        pod = pods.get(uid)
        if pod is not None and (pod.uid != uid or pod.finished):
            return "finished"
        return "expired"

    async def drop_invalid(self, server: str, gone: Collection[str] = ()) -> int:
        """Remove the claims on ``server`` that are invalid (or whose pods were just confirmed
        ``gone`` by a fresh read); returns how many were removed."""

        def change(record: LeaseRecord | None) -> Edited[tuple[Claim, ...]]:
            if record is None:
                return Edited(None, ())
            dead = tuple(
                c
                for c in record.claims
                if c.pod.uid in gone or self._judge.validity(c) is Validity.INVALID
            )
            kept = tuple(c for c in record.claims if c not in dead)
            return Edited(kept if dead else None, dead)

        dropped = await self._writer.edit(server, change, op="sweep")
        for claim in dropped:
            self._instruments.sweep_removals.labels(self.why_invalid(claim, gone)).inc()
            logger.info("removed invalid claim of %s on %s", claim.pod.key, server)
        return len(dropped)

    async def release(self, uid: str) -> int:
        """Remove every claim of ``uid`` (the caller gave the server up); returns how many."""
        removed = 0
        with tracer.start_as_current_span("release", attributes={"pod.uid": uid}):
            for claim in self._judge.ledger.claims_of(uid):
                removed += await self._drop_one(claim.server, uid, keep=None)
        return removed

    async def settle(self, uid: str) -> Claim | None:
        """Leave ``uid`` with at most one claim; returns the one kept."""
        claims = self._judge.ledger.claims_of(uid)
        if len(claims) < 2:
            return claims[0] if claims else None
        keep = winner(c for c in claims if self._judge.validity(c).blocks)
        for claim in claims:
            loser = keep is None or claim.server != keep.server
            if loser and await self._drop_one(claim.server, uid, keep=keep):
                self._instruments.sweep_removals.labels("duplicate").inc()
        return keep

    async def _drop_one(self, server: str, uid: str, *, keep: Claim | None) -> int:
        """Remove ``uid``'s claim from ``server`` unless, read fresh, it now beats ``keep``."""

        def change(record: LeaseRecord | None) -> Edited[int]:
            claim = record.claim_of(uid) if record is not None else None
            if record is None or claim is None:
                return Edited(None, 0)
            if (
                keep is not None
                and self._judge.validity(claim).blocks
                and precedence(claim) < precedence(keep)
            ):
                # It moved ahead (committed meanwhile): the next settle keeps this one instead.
                return Edited(None, 0)
            return Edited(record.without(uid), 1)

        return await self._writer.edit(server, change, op="release")
