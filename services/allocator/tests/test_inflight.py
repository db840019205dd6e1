"""In-flight bookings and keyed locks; refused-pod memory; capacity detection."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from rgpu_allocator.inputs import Inputs, capacity_grew
from rgpu_allocator.leases import KeyedLocks, Pending
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.nudging import Refused, retry_stamp
from rgpu_allocator.occupancy import Occupancy
from rgpu_allocator.pods import PodIndex
from rgpu_contracts import CardId, Claim, ClaimState, PodUID, ServerName
from rgpu_placement import FleetView

pytestmark = pytest.mark.anyio

KEYS = ("rack",)


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
    occupancy = lambda uid: Occupancy(  # noqa: E731
        Ledger().lease, PodIndex(), uid=PodUID(uid), now=0.0, ttl=30.0, pending=pending.claims
    )
    with pending.hold(claim(build, "a")):
        assert [c.pod.name for c in occupancy("uid-b").blocking("s")] == ["a"]
        assert occupancy("uid-a").blocking("s") == ()
    assert occupancy("uid-b").blocking("s") == ()
    assert pending.claims("s") == ()


async def test_keyed_locks_serialise_one_key_and_forget_idle_keys():
    locks = KeyedLocks()
    order: list[str] = []

    async def work(name: str, key: str, pause: float) -> None:
        async with locks.hold(key):
            order.append(f"{name}+")
            await anyio.sleep(pause)
            order.append(f"{name}-")

    async with anyio.create_task_group() as tg:
        tg.start_soon(work, "a", "k", 0.05)
        await anyio.sleep(0.01)
        tg.start_soon(work, "b", "k", 0.0)
        tg.start_soon(work, "c", "other", 0.0)
    assert order.index("a-") < order.index("b+")
    assert order.index("c+") < order.index("a-")
    assert len(locks) == 0


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


@pytest.mark.parametrize(
    ("before", "after", "grew"),
    [
        ({"ready": False}, {}, True),
        ({"reachable": False}, {}, True),
        ({"unhealthy": (0, 1)}, {}, True),
        ({"busy": (0,)}, {}, True),
        ({}, {"ready": False}, False),
        ({}, {}, False),
    ],
)
def test_capacity_grows_when_a_server_becomes_usable_or_frees_cards(build, before, after, grew):
    old = FleetView.build(build.fleet(build.server("a", **before)), None, KEYS)
    new = FleetView.build(build.fleet(build.server("a", **after)), None, KEYS)
    assert capacity_grew(old, new) is grew


def test_a_new_server_is_new_capacity_but_the_first_fleet_is_not(build):
    one = FleetView.build(build.fleet(build.server("a")), None, KEYS)
    two = FleetView.build(build.fleet(build.server("a"), build.server("b")), None, KEYS)
    assert capacity_grew(one, two)
    assert not capacity_grew(None, two)


def test_fleet_age_is_zero_while_polled_and_counts_from_the_last_answer_after(build):
    now = [100.0]
    inputs = Inputs(KEYS, clock=lambda: now[0])
    assert inputs.fleet_age() is None
    inputs.set_fleet(build.fleet(build.server("a")))
    inputs.fleet_polled(True)
    now[0] = 130.0
    assert inputs.fleet_age() == 0.0
    inputs.fleet_polled(False)
    now[0] = 133.0
    assert inputs.fleet_age() == 33.0


@pytest.mark.parametrize(
    ("before", "after", "grew"),
    [
        ({"cordoned": True}, {}, True),
        ({"card_cordon": True}, {}, True),
        ({"cuda_version": None}, {"cuda_version": "12.4"}, True),
        ({}, {"cordoned": True}, False),
        ({}, {"card_cordon": True}, False),
    ],
)
def test_uncordoning_or_a_cuda_version_learned_is_new_capacity(build, before, after, grew):
    def server(cordoned=False, card_cordon=False, cuda_version="12.4"):
        made = build.server("a")
        cards = (dataclasses.replace(made.cards[0], cordoned=card_cordon), *made.cards[1:])
        return dataclasses.replace(made, cordoned=cordoned, cards=cards, cuda_version=cuda_version)

    old = FleetView.build(build.fleet(server(**before)), None, KEYS)
    new = FleetView.build(build.fleet(server(**after)), None, KEYS)
    assert capacity_grew(old, new) is grew
