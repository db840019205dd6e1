"""Every decision needs "who holds what" in microseconds, so the allocator mirrors its claim
Leases in memory: the ``Ledger``, indexed by server, by pod and by namespace, and versioned for
long-polls. It is fed by the Lease watch and by the replies to our own writes, which can arrive
in either order; a record older than the one held (by ``resourceVersion``) is ignored so the
view never steps back in time. It also remembers when cards of committed or bound claims were
released: lupine keeps reporting a finished pod's card as busy until discovery probes again,
and a busy report older than the release is stale (see ``occupancy.Occupancy.busy``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar, cast

from rgpu_contracts import CardId, Claim, ClaimSet, ClaimState, PodUID, ServerName
from rgpu_placement import Nomination
from rgpu_runtime.feeds import Versioned

from .claims import LeaseRecord, newer_or_equal, placed

V = TypeVar("V")

__all__ = ["RELEASES_KEPT", "Change", "Ledger", "Nominee"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """What one update did: whether it applied, and whether capacity appeared (cards freed)."""

    applied: bool
    freed: bool = False


RELEASES_KEPT = 100_000
"""Released cards remembered (the oldest are forgotten first); far more than any fleet has."""


def _unbound(claim: Claim) -> int:
    return 1 if claim.admitted and claim.state is ClaimState.BOOKED else 0


def _freed(before: LeaseRecord | None, after: LeaseRecord | None) -> bool:
    if before is None:
        return False
    kept = {c for claim in after.claims for c in claim.cards} if after else set()
    return any(card not in kept for claim in before.claims for card in claim.cards)


def _released(before: LeaseRecord | None, after: LeaseRecord | None) -> list[CardId]:
    if before is None:
        return []
    kept = {c for claim in after.claims for c in claim.cards} if after else set()
    return [c for claim in before.claims if placed(claim) for c in claim.cards if c not in kept]


@dataclass(frozen=True, slots=True, kw_only=True)
class Nominee:
    """A pod with a live nomination, as the nudger needs it."""

    expires_at: float
    freed: bool
    """Whether no other pod's claim holds the promised cards any more: the pod can book."""


def _promised_cards_free(record: LeaseRecord, nomination: Nomination) -> bool:
    promised = set(nomination.cards)
    nominee = nomination.pod.uid
    return not any(c.pod.uid != nominee and promised.intersection(c.cards) for c in record.claims)


def _by_str(table: Mapping[Any, V]) -> dict[str, V]:
    return cast("dict[str, V]", table)


class Ledger:
    """The claim Leases as last seen, with a revision that moves on every change."""

    __slots__ = (
        "_by_pod",
        "_cards",
        "_changes",
        "_clock",
        "_leases",
        "_nominated",
        "_released",
        "_snapshot",
        "_unbound",
        "by_server",
        "holders",
        "nominations",
        "releases",
        "synced",
    )

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._released: dict[CardId, float] = {}
        # Built on demand and kept until the next change: every long-poll waiter woken by one
        # change gets the same snapshot.
        self._snapshot: ClaimSet | None = None
        self._leases: dict[ServerName, LeaseRecord] = {}
        self._by_pod: dict[PodUID, set[ServerName]] = {}
        # Cards claimed per namespace: quotas and fair share ask on every admission pass.
        self._cards: dict[str, int] = {}
        self._unbound = 0
        # Few Leases carry a nomination; decisions and every pod deletion ask for them.
        self._nominated: dict[ServerName, LeaseRecord] = {}
        # Only the revision moves here (the claim set is built on demand, above); Versioned
        # makes its wake-up event on first wait, so decisions and benchmarks outside any
        # event loop pay nothing.
        self._changes: Versioned[None] = Versioned(None, revision=0)
        self.synced = False
        """Whether a complete list has been loaded."""
        # What a decision reads, as read-only mappings over the tables above (kept in place,
        # never rebound, so a decision's Occupancy reads them without calling back here).
        # Keyed by plain str: the ids are NewTypes of str, and readers ask with plain names.
        self.by_server: Mapping[str, LeaseRecord] = MappingProxyType(_by_str(self._leases))
        """Every Lease as last seen, by server."""
        self.holders: Mapping[str, Collection[ServerName]] = MappingProxyType(_by_str(self._by_pod))
        """The servers each pod (by uid) holds claims on."""
        self.nominations: Mapping[str, LeaseRecord] = MappingProxyType(_by_str(self._nominated))
        """The Leases that carry a nomination, live or expired, by server."""
        self.releases: Mapping[str, float] = MappingProxyType(_by_str(self._released))
        """When each card last left a committed or bound claim (wall clock)."""

    @property
    def revision(self) -> int:
        return self._changes.revision

    def __len__(self) -> int:
        return len(self._leases)

    def lease(self, server: str) -> LeaseRecord | None:
        return self._leases.get(ServerName(server))

    def leases(self) -> tuple[LeaseRecord, ...]:
        return tuple(self._leases.values())

    def claims_of(self, uid: str) -> tuple[Claim, ...]:
        """Every claim ``uid`` holds, ordered by server name."""
        servers = sorted(self._by_pod.get(PodUID(uid), ()))
        found = (self._leases[s].claim_of(uid) for s in servers)
        return tuple(c for c in found if c is not None)

    def nominees(self, now: float) -> dict[PodUID, Nominee]:
        """Pods with a live nomination on some server (capacity is being freed for them)."""
        return {
            r.nomination.pod.uid: Nominee(
                expires_at=r.nomination.expires_at, freed=_promised_cards_free(r, r.nomination)
            )
            for r in self._nominated.values()
            if r.nomination is not None and now < r.nomination.expires_at
        }

    def cards_by_namespace(self) -> Mapping[str, int]:
        """Cards claimed per pod namespace, as stored (a claim counts until it is removed)."""
        return self._cards

    def admitted_unbound(self) -> int:
        """Bookings admission made that no ``/bind`` has committed yet: pods let through the
        gate and still in kube-scheduler's queue."""
        return self._unbound

    def servers_of(self, uid: str) -> int:
        """On how many servers ``uid`` holds claims."""
        return len(self._by_pod.get(PodUID(uid), ()))

    def duplicated_pods(self) -> tuple[PodUID, ...]:
        """Pods holding claims on more than one server (replicas raced on the same pod)."""
        return tuple(uid for uid, servers in self._by_pod.items() if len(servers) > 1)

    def claim_set(self) -> ClaimSet:
        """Every stored claim, ordered by server, at the current revision."""
        revision = self._changes.revision
        if self._snapshot is None or self._snapshot.revision != revision:
            claims = (c for s in sorted(self._leases) for c in self._leases[s].claims)
            self._snapshot = ClaimSet(revision=revision, claims=tuple(claims))
        return self._snapshot

    def apply(self, record: LeaseRecord) -> Change:
        """Take a Lease read from the apiserver (watch event or write reply)."""
        before = self._leases.get(record.server)
        if before is not None and not newer_or_equal(
            record.resource_version, before.resource_version
        ):
            return Change(applied=False)
        if before == record:
            return Change(applied=False)
        self._unindex(before)
        self._leases[record.server] = record
        self._index(record)
        self._remember(_released(before, record))
        self._bump()
        return Change(applied=True, freed=_freed(before, record))

    def forget(self, server: str, resource_version: str = "") -> Change:
        """Drop a deleted Lease (unless we already hold a newer one)."""
        before = self._leases.get(ServerName(server))
        if before is None:
            return Change(applied=False)
        if resource_version and not newer_or_equal(resource_version, before.resource_version):
            return Change(applied=False)
        self._unindex(before)
        del self._leases[before.server]
        self._remember(_released(before, None))
        self._bump()
        return Change(applied=True, freed=_freed(before, None))

    def replace_all(self, records: Iterable[LeaseRecord]) -> Change:
        """Swap in a fresh list; freed when any card held before is not held now."""
        fresh: Mapping[ServerName, LeaseRecord] = {r.server: r for r in records}
        freed = any(_freed(old, fresh.get(s)) for s, old in self._leases.items())
        for server, old in self._leases.items():
            self._remember(_released(old, fresh.get(server)))
        self._leases.clear()
        self._leases.update(fresh)
        self._by_pod.clear()
        self._nominated.clear()
        self._cards.clear()
        self._unbound = 0
        for record in self._leases.values():
            self._index(record)
        self.synced = True
        self._bump()
        return Change(applied=True, freed=freed)

    async def wait_newer(self, since: int, timeout: float) -> int:
        """Wait until the revision differs from ``since`` or ``timeout`` passes.

        "Differs" rather than "exceeds": a reader holding a revision from before this
        process started gets the current state at once instead of sleeping out its wait.
        """
        revision, _ = await self._changes.wait_newer(since, timeout)
        return revision

    def _remember(self, cards: list[CardId]) -> None:
        now = self._clock()
        for card in cards:
            self._released.pop(card, None)
            self._released[card] = now
        while len(self._released) > RELEASES_KEPT:
            del self._released[next(iter(self._released))]

    def _bump(self) -> None:
        self._changes.publish(None)

    def _index(self, record: LeaseRecord) -> None:
        if record.nomination is not None:
            self._nominated[record.server] = record
        for claim in record.claims:
            self._by_pod.setdefault(claim.pod.uid, set()).add(record.server)
            namespace = claim.pod.namespace
            self._cards[namespace] = self._cards.get(namespace, 0) + len(claim.cards)
            self._unbound += _unbound(claim)

    def _unindex(self, record: LeaseRecord | None) -> None:
        if record is None:
            return
        self._nominated.pop(record.server, None)
        for claim in record.claims:
            self._unbound -= _unbound(claim)
            namespace = claim.pod.namespace
            left = self._cards.get(namespace, 0) - len(claim.cards)
            if left > 0:
                self._cards[namespace] = left
            else:
                self._cards.pop(namespace, None)
            servers = self._by_pod.get(claim.pod.uid)
            if servers is not None:
                servers.discard(record.server)
                if not servers:
                    del self._by_pod[claim.pod.uid]
