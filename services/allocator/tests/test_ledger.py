"""The in-memory mirror of claim Leases."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from rgpu_allocator.claims import LeaseRecord, newer_or_equal
from rgpu_allocator.ledger import Ledger
from rgpu_contracts import CardId, Claim, ClaimState, ServerName

pytestmark = pytest.mark.anyio


def claim(pod: str, server: str, cards=("c0",)) -> Claim:
    from rgpu_contracts import PodRef, PodUID

    return Claim(
        pod=PodRef(uid=PodUID(f"uid-{pod}"), namespace="n", name=pod),
        server=ServerName(server),
        cards=tuple(CardId(f"{server}/{c}") for c in cards),
        containers=(),
        state=ClaimState.BOOKED,
        booked_at=1.0,
    )


def record(server: str, version: str, *claims: Claim) -> LeaseRecord:
    return LeaseRecord(
        name=f"rgpu-{server}", server=ServerName(server), resource_version=version, claims=claims
    )


def test_versions_compare_numerically_and_opaque_ones_always_win():
    assert newer_or_equal("10", "9")
    assert not newer_or_equal("9", "10")
    assert newer_or_equal("abc", "10")


def test_apply_indexes_claims_by_pod():
    ledger = Ledger()
    ledger.apply(record("a", "1", claim("p", "a")))
    ledger.apply(record("b", "2", claim("p", "b"), claim("q", "b", ("c1",))))
    assert [c.server for c in ledger.claims_of("uid-p")] == ["a", "b"]
    assert ledger.duplicated_pods() == ("uid-p",)
    assert ledger.revision == 2


def test_older_record_never_replaces_a_newer_one():
    ledger = Ledger()
    ledger.apply(record("a", "5", claim("p", "a")))
    change = ledger.apply(record("a", "4"))
    assert not change.applied
    assert ledger.claims_of("uid-p")


def test_removing_a_claim_reports_freed_capacity():
    ledger = Ledger()
    ledger.apply(record("a", "1", claim("p", "a")))
    change = ledger.apply(record("a", "2"))
    assert change.applied
    assert change.freed
    assert ledger.claims_of("uid-p") == ()


def test_forget_respects_versions_and_frees():
    ledger = Ledger()
    ledger.apply(record("a", "5", claim("p", "a")))
    assert not ledger.forget("a", "3").applied
    change = ledger.forget("a", "6")
    assert change.freed
    assert ledger.lease("a") is None


def test_replace_all_rebuilds_the_pod_index():
    ledger = Ledger()
    ledger.apply(record("a", "1", claim("p", "a")))
    change = ledger.replace_all([record("b", "3", claim("q", "b"))])
    assert change.freed
    assert ledger.claims_of("uid-p") == ()
    assert [c.pod.name for c in ledger.claim_set().claims] == ["q"]


async def test_wait_newer_returns_when_the_revision_moves():
    ledger = Ledger()

    async def later() -> None:
        await anyio.sleep(0.01)
        ledger.apply(record("a", "1"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(later)
        assert await ledger.wait_newer(0, timeout=5) == 1


async def test_wait_newer_times_out_with_the_same_revision():
    ledger = Ledger()
    assert await ledger.wait_newer(0, timeout=0.01) == 0


def test_claim_set_is_built_once_per_revision():
    ledger = Ledger()
    ledger.apply(record("a", "1", claim("p", "a")))
    first = ledger.claim_set()
    assert ledger.claim_set() is first
    ledger.apply(record("a", "2"))
    assert ledger.claim_set().revision == first.revision + 1
    assert ledger.claim_set().claims == ()


def test_released_cards_of_placed_claims_are_remembered_with_their_time():
    now = [10.0]
    ledger = Ledger(clock=lambda: now[0])
    placed = dataclasses.replace(claim("p", "a"), state=ClaimState.BOUND)
    booked = claim("q", "b")
    ledger.apply(record("a", "1", placed))
    ledger.apply(record("b", "1", booked))
    now[0] = 20.0
    ledger.apply(record("a", "2"))
    ledger.apply(record("b", "2"))
    assert ledger.releases["a/c0"] == 20.0
    assert "b/c0" not in ledger.releases


def test_the_read_only_tables_follow_a_fresh_list_instead_of_keeping_the_old_one():
    ledger = Ledger()
    leases, holders = ledger.by_server, ledger.holders
    ledger.apply(record("a", "1", claim("p", "a")))
    ledger.replace_all([record("b", "1", claim("q", "b"))])
    assert list(leases) == ["b"]
    assert list(holders) == [claim("q", "b").pod.uid]
