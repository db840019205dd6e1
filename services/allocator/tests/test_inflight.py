"""In-flight bookings and a plan's bookings over them; refused-pod memory."""

from __future__ import annotations

import dataclasses

import pytest

from rgpu_allocator.booker import Pending
from rgpu_allocator.claims import LeaseRecord
from rgpu_allocator.judging import Judge, occupancy_of
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.nominating import Nominations
from rgpu_allocator.nudging import retry_stamp
from rgpu_allocator.occupancy import Occupancy
from rgpu_allocator.pods import PodIndex
from rgpu_allocator.waiters import Refused
from rgpu_contracts import CardId, Claim, ClaimState, ServerName
from rgpu_placement import FleetView, Nomination
from rgpu_runtime.feeds import DiscoveryMirror

pytestmark = pytest.mark.anyio


def claim(build, pod: str, server: str = "s") -> Claim:
    return Claim(
        pod=build.pod(pod),
        server=ServerName(server),
        cards=(CardId(f"{server}/GPU-0"),),
        containers=(),
        state=ClaimState.BOOKED,
        booked_at=0.0,
    )


def test_pending_booking_blocks_other_pods_only_while_held(build):
    pending = Pending()

    def occupancy(uid: str) -> Occupancy:
        return occupancy_of(
            Ledger(), PodIndex(), uid=uid, now=0.0, ttl=30.0, pending=pending.by_server
        )

    with pending.hold(claim(build, "a")):
        assert [c.pod.name for c in occupancy("uid-b").blocking("s")] == ["a"]
        assert occupancy("uid-a").blocking("s") == ()
    assert occupancy("uid-b").blocking("s") == ()
    assert "s" not in pending.by_server


def test_a_plans_bookings_count_as_held_over_those_in_flight_without_being_in_flight(build):
    pending, plan = Pending(), Pending()

    def holders(planned) -> list[str]:
        held = occupancy_of(
            Ledger(),
            PodIndex(),
            uid="uid-c",
            now=0.0,
            ttl=30.0,
            pending=pending.by_server,
            planned=planned,
        )
        return sorted(c.pod.name for c in held.blocking("s"))

    with pending.hold(claim(build, "a")):
        plan.add(claim(build, "b"))
        plan.add(claim(build, "d", server="t"))
        assert holders(plan.by_server) == ["a", "b"]
        assert holders({}) == ["a"]
    assert holders(plan.by_server) == ["b"]
    assert "s" not in pending.by_server


def test_a_booking_in_flight_onto_promised_cards_does_not_end_the_nomination(build):
    # The booking was chosen before the promise was read; its write re-fits on the Lease,
    # where the promise keeps it off. Until a claim is written there, the nominee stays held
    # to its server: freed for a moment, it would preempt a second one.
    nominee, victim = build.pod("urgent"), build.pod("victim")
    promised = (CardId("s/GPU-0"), CardId("s/GPU-1"))
    nomination = Nomination(
        pod=nominee,
        priority=1000,
        cards=promised,
        victims=(victim,),
        nominated_at=0.0,
        expires_at=60.0,
    )
    held = Claim(
        pod=victim,
        server=ServerName("s"),
        cards=promised[:1],
        containers=(),
        state=ClaimState.BOUND,
        booked_at=0.0,
    )
    ledger = Ledger(clock=lambda: 1.0)
    record = LeaseRecord(
        name="rgpu-s", server=ServerName("s"), resource_version="1", claims=(held,)
    )
    ledger.replace_all([dataclasses.replace(record, nomination=nomination)])
    pending = Pending()
    judge = Judge(
        ledger=ledger,
        pods=PodIndex(),
        discovery=DiscoveryMirror(FleetView.build, topology_keys=()),
        ttl=30.0,
        clock=lambda: 1.0,
        pending=pending.by_server,
    )
    nominations = Nominations(judge=judge)
    view = FleetView.build(build.fleet(build.server("s")), None, ())
    late = dataclasses.replace(claim(build, "late"), cards=promised[1:])
    with pending.hold(late):
        assert nominations.nominated_on(nominee.uid, view) == "s"
    written = dataclasses.replace(record, resource_version="2", claims=(held, late))
    ledger.replace_all([dataclasses.replace(written, nomination=nomination)])
    assert nominations.nominated_on(nominee.uid, view) is None


def test_refused_pods_are_bounded_and_taken_oldest_first(build):
    refused = Refused(limit=3)
    for name in ("a", "b", "c", "a", "d"):
        refused.remember(build.pod(name))
    assert len(refused) == 3
    assert "uid-a" not in refused
    refused.forget("uid-c")
    assert [p.name for p in refused.take(5)] == ["b", "d"]
    assert len(refused) == 0


def test_retry_stamp_changes_with_time():
    assert retry_stamp(0.0) == "1970-01-01T00:00:00.000000Z"
    assert retry_stamp(0.000001) != retry_stamp(0.0)
