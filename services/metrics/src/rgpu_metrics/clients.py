"""All the exporter's peer I/O: it mirrors two peers — discovery's fleet and the allocator's
claims — and must survive either going away; this names the two long-polls (the sources) and
how the exporter paces them.

Each is an ``rgpu_runtime.feeds.Follower`` of its feed's ``Mirror``, reading updates (``delta=1``:
one server changing costs the decoding of that server, not of the fleet or every claim, and
unchanged servers reach the board as the same objects, so it re-renders only the changed
ones); each new revision goes to the board at once, a failure leaves the last snapshot in
place (the series stay, their age grows) while the follower backs off and then asks afresh,
and its ``FollowStatus`` feeds ``rgpu_source_up``, ``rgpu_source_age_seconds`` and, through
``answered``, the readiness probe.
"""

from __future__ import annotations

from typing import Final

import httpx

from rgpu_contracts import ClaimSet, Fleet
from rgpu_runtime.feeds import CLAIMS_FEED, FLEET_FEED, Follower, FollowPolicy, Mirror

from .board import Board

__all__ = ["POLICY", "follow_claims", "follow_fleet"]

POLICY: Final = FollowPolicy(wait_seconds=10.0, coalesce_seconds=0.5)
"""A 10 s hold bounds ``rgpu_source_age_seconds`` of a healthy but quiet source below
Prometheus' usual 15 s scrape interval. Nothing decides on the exporter's copy and a scrape
comes every 15 s or more, so changes are fetched at most twice a second: in a burst of
bookings that is one delta per half second instead of a round trip per Lease write (the
exporter spent about half its CPU on those round trips)."""


def follow_fleet(http: httpx.AsyncClient, board: Board, policy: FollowPolicy) -> Follower[Fleet]:
    """Follow discovery's fleet (``FLEET_FEED``) into ``board`` (status name ``discovery``)."""
    mirror = Mirror(FLEET_FEED, name="discovery", on_change=board.set_fleet)
    return Follower(http, mirror, policy=policy)


def follow_claims(
    http: httpx.AsyncClient, board: Board, policy: FollowPolicy
) -> Follower[ClaimSet]:
    """Follow the allocator's claims (``CLAIMS_FEED``) into ``board`` (status name
    ``allocator``)."""
    mirror = Mirror(CLAIMS_FEED, name="allocator", on_change=board.set_claims)
    return Follower(http, mirror, policy=policy)
