"""The claim validity rule of docs/design.md#validity."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from rgpu_contracts import Claim, ClaimState, PodRef, PodUID, ServerName
from rgpu_placement import Validity, expires_at, judge, lasting

TTL = 30.0


def claim(state=ClaimState.BOOKED, booked_at=100.0, committed_at=None, uid="u1") -> Claim:
    return Claim(
        pod=PodRef(uid=PodUID(uid), namespace="n", name="p"),
        server=ServerName("s"),
        cards=(),
        containers=(),
        state=state,
        booked_at=booked_at,
        committed_at=committed_at,
    )


@dataclass(frozen=True)
class Pod:
    """A pod as the rule sees it (``PodFacts``)."""

    uid: str
    node_name: str | None
    phase: str

    @property
    def finished(self) -> bool:
        return self.phase in {"Succeeded", "Failed"}

    @property
    def bound(self) -> bool:
        return bool(self.node_name)


def pod(node=None, phase="Pending", uid="u1") -> Pod:
    return Pod(uid=uid, node_name=node, phase=phase)


def test_fresh_booking_of_an_existing_pod_is_valid():
    assert judge(claim(), pod(), now=110.0, ttl=TTL) is Validity.VALID


def test_unbound_booking_older_than_ttl_is_invalid():
    assert judge(claim(), pod(), now=131.0, ttl=TTL) is Validity.INVALID


def test_commit_restarts_the_ttl_window():
    c = claim(state=ClaimState.COMMITTED, committed_at=125.0)
    assert judge(c, pod(), now=140.0, ttl=TTL) is Validity.VALID
    assert expires_at(c, pod(), TTL) == 155.0


def test_bound_pod_keeps_its_claim_forever():
    assert judge(claim(), pod(node="n1", phase="Running"), now=10_000.0, ttl=TTL) is Validity.VALID
    assert expires_at(claim(), pod(node="n1"), TTL) is None


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pod_invalidates_its_claim(phase):
    assert judge(claim(), pod(node="n1", phase=phase), now=101.0, ttl=TTL) is Validity.INVALID


def test_missing_pod_with_fresh_booking_is_valid_because_the_watch_may_lag():
    assert judge(claim(), None, now=101.0, ttl=TTL) is Validity.VALID


def test_missing_pod_with_old_claim_is_unknown_and_still_blocks():
    verdict = judge(claim(state=ClaimState.BOUND), None, now=101.0, ttl=TTL)
    assert verdict is Validity.UNKNOWN
    assert verdict.blocks
    assert judge(claim(), None, now=200.0, ttl=TTL) is Validity.UNKNOWN


def test_same_name_pod_with_another_uid_invalidates():
    assert judge(claim(uid="old"), pod(uid="new"), now=101.0, ttl=TTL) is Validity.INVALID


@pytest.mark.parametrize(
    ("cached", "expected"),
    [
        (pod(node="n1", phase="Running"), Validity.VALID),
        (pod(node="n1", phase="Succeeded"), Validity.INVALID),
        (pod(node="n1", phase="Running", uid="u2"), Validity.INVALID),
        (pod(phase="Pending"), None),
        (None, None),
    ],
    ids=["bound", "finished", "replaced", "unbound", "not cached"],
)
def test_a_lasting_verdict_is_given_only_where_time_cannot_change_it(cached, expected):
    assert lasting(claim(), cached) is expected
    if expected is not None:
        for now in (100.0, 10_000.0):
            assert judge(claim(), cached, now=now, ttl=30.0) is expected


def test_an_admitted_booking_keeps_its_own_ttl_after_its_commit():
    admitted = claim(state=ClaimState.COMMITTED, committed_at=125.0)
    admitted = dataclasses.replace(admitted, admission_ttl=90.0)
    assert judge(admitted, pod(), now=200.0, ttl=TTL) is Validity.VALID
    assert expires_at(admitted, pod(), TTL) == 215.0
    assert judge(admitted, pod(), now=216.0, ttl=TTL) is Validity.INVALID
