"""With admission by scheduling gate, every GPU pod that reaches ``/filter`` already holds a
booking, and kube-scheduler's serial cycle should only read it: no decision, no write, no hop
to the allocator. So the extender follows the allocator's claims (``GET /v1/claims``, updates
only) and keeps them by pod uid; ``/filter`` and ``/prioritize`` look the pod up here and ask
the allocator only for a pod this mirror does not show booked (not seen yet, or booked by
kube-scheduler's own filter in HAMi's flow).

Only what a read can safely trust is answered from here: a claim still inside its TTL by a
margin (``MARGIN_SECONDS``), whose server the fleet still has. Anything else goes to the
allocator, which judges on the Lease itself; a read never books or keeps anything, so a
mirror that lags can cost a hop, never a double booking.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import httpx

from rgpu_contracts import Claim, ClaimSet, ClaimState, ClaimsUpdate, PodUID, ServerName, UpdateKind
from rgpu_placement import claim_stamp, claim_ttl
from rgpu_runtime import Follower, FollowPolicy

__all__ = ["MARGIN_SECONDS", "POLICY", "Booked"]

MARGIN_SECONDS: Final = 2.0
"""A booking this close to lapsing is left to the allocator, which decides on the Lease."""
POLICY: Final = FollowPolicy(wait_seconds=30.0, margin_seconds=5.0)
"""Follows at once after each change (no coalescing): a pod's ``/filter`` comes moments after
its booking, and every change missed costs that pod a hop to the allocator."""


class Booked:
    """The allocator's claims by pod uid, kept current by one long-poll."""

    __slots__ = ("_by_server", "_by_uid", "_clock", "_last", "_ttl")

    def __init__(self, *, ttl: float, clock: Callable[[], float] = time.time) -> None:
        self._ttl = ttl
        self._clock = clock
        self._by_uid: dict[PodUID, Claim] = {}
        self._by_server: dict[ServerName, tuple[Claim, ...]] = {}
        self._last: ClaimsUpdate | None = None

    def __len__(self) -> int:
        return len(self._by_uid)

    def claim_of(self, uid: str) -> Claim | None:
        """``uid``'s claim when a read can trust it: booked or committed, lapsing no sooner
        than ``MARGIN_SECONDS`` from now, or bound; ``None`` otherwise."""
        claim = self._by_uid.get(PodUID(uid))
        if claim is None or claim.state is ClaimState.BOUND:
            return claim
        lapses = claim_stamp(claim) + claim_ttl(claim, self._ttl)
        return claim if lapses - self._clock() > MARGIN_SECONDS else None

    def follower(
        self, http: httpx.AsyncClient, *, policy: FollowPolicy = POLICY
    ) -> Follower[ClaimSet]:
        """The long-poll keeping this mirror current, over the allocator's client ``http``."""
        return Follower(
            http,
            "/v1/claims",
            name="allocator claims",
            decode=ClaimSet.from_dict,
            revision=_revision,
            updates=self._noted,
            policy=policy,
            on_change=self._changed,
        )

    def _noted(self, raw: object) -> ClaimsUpdate:
        # The follower applies the update itself; remembering which servers it names lets
        # the index change only those.
        update = ClaimsUpdate.from_dict(raw)
        self._last = update
        return update

    def _changed(self, claims: ClaimSet) -> None:
        update, self._last = self._last, None
        if update is not None and update.kind is UpdateKind.DELTA:
            self._patch(update.servers, update.claims)
        else:
            self._rebuild(claims)

    def _rebuild(self, claims: ClaimSet) -> None:
        by_server: dict[ServerName, list[Claim]] = {}
        for claim in claims.claims:
            by_server.setdefault(claim.server, []).append(claim)
        self._by_server = {s: tuple(cs) for s, cs in by_server.items()}
        self._by_uid = {c.pod.uid: c for c in claims.claims}

    def _patch(self, servers: tuple[ServerName, ...], claims: tuple[Claim, ...]) -> None:
        fresh: dict[ServerName, list[Claim]] = {s: [] for s in servers}
        for claim in claims:
            fresh.setdefault(claim.server, []).append(claim)
        for server, now in fresh.items():
            for old in self._by_server.pop(server, ()):
                if self._by_uid.get(old.pod.uid) is old:
                    del self._by_uid[old.pod.uid]
            if now:
                self._by_server[server] = tuple(now)
            for claim in now:
                self._by_uid[claim.pod.uid] = claim


def _revision(value: ClaimSet) -> int:
    return value.revision
