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

A server being freed for an urgent pod (a live ``Nomination`` on its Lease) counts as held by
that pod for every pod of lower or equal priority, so nobody else books what the victims
leave behind; the nomination stops counting once the nominee holds a claim, is gone or
finished, or the nomination expires (DESIGN §11).

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from opentelemetry import trace

from rgpu_contracts import CardId, Claim, PodUID, card_id, split_card_id
from rgpu_placement import (
    Granularity,
    ServerFacts,
    Validity,
    judge,
    lasting,
    precedence,
    winner,
)
from rgpu_runtime import Settings

from .claims import LeaseRecord, Ledger, placed
from .clients import KubeApi
from .inputs import Inputs
from .instruments import Instruments
from .leases import Edited, LeaseWriter, Pending
from .pods import PodIndex, PodInfo, pod_info

__all__ = [
    "ClaimsGone",
    "HoldsLookup",
    "Judge",
    "LeaseLookup",
    "Occupancy",
    "PendingLookup",
    "Policy",
    "ReleaseLookup",
    "Remover",
    "Seen",
    "Settled",
    "read_pod",
]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

LeaseLookup = Callable[[str], LeaseRecord | None]
"""Where a server's Lease is read from: the ledger, or a fresher copy during a write."""

PendingLookup = Callable[[str], tuple[Claim, ...]]
"""This replica's bookings still being written, per server (see ``leases.Pending``)."""

HoldsLookup = Callable[[str], bool]
"""Whether a pod (by uid) holds a claim anywhere: a nominee that booked needs no promise."""


Seen = Mapping[PodUID, PodInfo | None]
"""Pods read fresh from the apiserver, by the uid their claim names (``None``: it is gone)."""

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


def _holds_nothing(uid: str) -> bool:
    return False


def _never_released(card: str, moment: float) -> bool:
    return False


def _merely_old(claim: Claim, pod: PodInfo | None) -> bool:
    """Whether only the claim's age, not a fact about its pod, makes it invalid."""
    return pod is not None and pod.uid == claim.pod.uid and not pod.finished


def _uuid(card: CardId) -> str:
    return split_card_id(card)[1]


def _unchanged(record: LeaseRecord, seen: tuple[PodInfo | None, ...], pods: PodIndex) -> bool:
    """Whether every claim's pod is still the object ``seen`` when it was judged."""
    for claim, pod in zip(record.claims, seen, strict=True):
        if pods.get(claim.pod.uid) is not pod:
            return False
    return True


SETTLED_KEPT = 65_536
"""Servers ``Settled`` remembers; past it the memo starts over (bounded)."""


class Settled:
    """Per server, the stored claims that hold its cards whatever the time, remembered for the
    Lease version and the pod states they were judged on.

    A refusal judges every server, and at 1,000 servers that was most of its cost, though a
    bound holder's claim reads the same on every retry. The memo is keyed on the Lease record
    and on each claim's pod object (both immutable and replaced on change), so a change to
    either is a miss, never a stale answer; claims whose verdict depends on the time (unbound
    pods, pods not in the cache) are never remembered.
    """

    __slots__ = ("_found",)

    def __init__(self) -> None:
        self._found: dict[str, tuple[LeaseRecord, tuple[PodInfo | None, ...], tuple[Claim, ...]]]
        self._found = {}

    def holding(self, record: LeaseRecord, pods: PodIndex) -> tuple[Claim, ...] | None:
        """The claims of ``record`` that hold their cards, if that does not depend on the time;
        ``None`` when it does."""
        found = self._found.get(record.server)
        if found is not None and found[0] is record and _unchanged(record, found[1], pods):
            return found[2]
        seen = tuple(pods.get(c.pod.uid) for c in record.claims)
        verdicts = [lasting(c, p) for c, p in zip(record.claims, seen, strict=True)]
        if None in verdicts:
            return None
        holding = tuple(
            c for c, v in zip(record.claims, verdicts, strict=True) if v is Validity.VALID
        )
        if len(self._found) >= SETTLED_KEPT:
            self._found.clear()
        self._found[record.server] = (record, seen, holding)
        return holding


class Occupancy:
    """Claims of pods other than ``uid`` that still hold cards, per server, at time ``now``."""

    __slots__ = (
        "_cache",
        "_holds",
        "_leases",
        "_now",
        "_observed",
        "_pending",
        "_pods",
        "_priority",
        "_released",
        "_settled",
        "_trusted",
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
        trusted: bool = True,
        priority: int = 0,
        holds: HoldsLookup = _holds_nothing,
        settled: Settled | None = None,
    ) -> None:
        self._leases = leases
        self._settled = settled
        self._priority = priority
        self._holds = holds
        self._trusted = trusted
        self._pending = pending
        self._released = released
        self._observed = observed_at
        self._pods = pods
        self._now = now
        self._ttl = ttl
        self.uid = uid
        self._cache: dict[str, tuple[Claim, ...]] = {}

    def validity(self, claim: Claim) -> Validity:
        """The verdict on any claim, from the pod cache at this decision's time.

        On a cache that is not ``trusted`` (its watch has been silent too long) "the pod is
        still unbound and the claim is old" may only mean the binding was missed: that claim
        is ``UNKNOWN`` (it keeps blocking until a fresh read decides), never ``INVALID``.
        """
        uid = claim.pod.uid
        pod = self._pods.get(uid)
        verdict = judge(claim, pod, now=self._now, ttl=self._ttl, gone=self._pods.gone(uid))
        if verdict is Validity.INVALID and not self._trusted and _merely_old(claim, pod):
            return Validity.UNKNOWN
        return verdict

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
        if record is not None and record.nomination is None and self._settled is not None:
            holding = self._settled.holding(record, self._pods)
            if holding is not None and not self._pending(server):
                return tuple(c for c in holding if c.pod.uid != self.uid)
        stored = record.claims if record is not None else ()
        held = [c for c in stored if c.pod.uid != self.uid and self.validity(c).blocks]
        seen = {c.pod.uid for c in stored} | {self.uid}
        held.extend(c for c in self._pending(server) if c.pod.uid not in seen)
        promised = self._promised(record)
        if promised is not None and promised.pod.uid not in seen:
            held.append(promised)
        return tuple(held)

    def _promised(self, record: LeaseRecord | None) -> Claim | None:
        """The server's nomination as the nominee's hold, while it still keeps this pod off."""
        nomination = record.nomination if record is not None else None
        if record is None or nomination is None:
            return None
        nominee = nomination.pod.uid
        if not nomination.holds_against(self.uid, self._priority, self._now):
            return None
        pod = self._pods.get(nominee)
        if self._pods.gone(nominee) or (pod is not None and pod.finished) or self._holds(nominee):
            return None
        return nomination.as_claim(record.server)


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


def _always() -> bool:
    return True


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
    pods_trusted: Callable[[], bool] = field(default=_always)
    """Whether the pod cache heard from the apiserver recently enough to drop claims on
    (DESIGN §10, "stale caches are noticed")."""
    settled: Settled = field(default_factory=Settled)
    """Time-independent verdicts per server, shared by this replica's decisions."""

    def occupancy(
        self,
        uid: str,
        *,
        leases: LeaseLookup | None = None,
        pending: PendingLookup | None = None,
    ) -> Occupancy:
        """Who else holds what, for a decision about ``uid`` now (``pending``: bookings in
        flight, this replica's by default)."""
        view = self.inputs.view
        return Occupancy(
            leases or self.ledger.lease,
            self.pods,
            uid=PodUID(uid),
            now=self.clock(),
            ttl=self.ttl,
            pending=self.pending.claims if pending is None else pending,
            released=self.ledger.released_after,
            observed_at=view.fleet.observed_at if view is not None else float("inf"),
            trusted=self.pods_trusted(),
            priority=self.priority_of(uid),
            holds=self._holds,
            settled=self.settled,
        )

    def priority_of(self, uid: str) -> int:
        """The pod's priority as the cache has it (0 when unknown)."""
        pod = self.pods.get(uid)
        return pod.priority if pod is not None else 0

    def _holds(self, uid: str) -> bool:
        return self.ledger.servers_of(uid) > 0

    def validity(self, claim: Claim, seen: Seen | None = None) -> Validity:
        """The verdict on ``claim`` now, from its pod as read fresh (``seen``) if it was, else
        from the pod cache."""
        uid = claim.pod.uid
        if seen is None or uid not in seen:
            return self.occupancy(uid).validity(claim)
        pod = seen[uid]
        if pod is None or pod.uid != uid:
            return Validity.INVALID
        return judge(claim, pod, now=self.clock(), ttl=self.ttl)

    def live(self, uid: str) -> tuple[Claim, ...]:
        """``uid``'s claims that still hold their cards."""
        return tuple(c for c in self.ledger.claims_of(uid) if self.validity(c).blocks)


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
        here, the commit restarts its clock and it stays (DESIGN §10).
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
