"""Lease naming and the claims codec stored in Leases."""

from __future__ import annotations

import re

from rgpu_allocator.claims import (
    ANNOTATION_CLAIMS,
    ANNOTATION_NOMINATION,
    ANNOTATION_SERVER,
    MANAGED_BY_LABEL,
    decode_lease,
    encode_lease,
    holder_of,
    lease_name,
)
from rgpu_contracts import CardId, Claim, ClaimState, ContainerAssignment, ServerName
from rgpu_placement import Nomination

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def claim(build, pod: str, server: str = "gpu-a", cards=(0,)) -> Claim:
    ids = tuple(CardId(f"{server}/{build.uuid(server, i)}") for i in cards)
    return Claim(
        pod=build.pod(pod),
        server=ServerName(server),
        cards=ids,
        containers=(ContainerAssignment(name="main", cards=ids),),
        state=ClaimState.BOOKED,
        booked_at=1700000000.5,
    )


def as_read(body, version="7"):
    body["metadata"]["resourceVersion"] = version
    return body


def test_lease_name_is_readable_for_short_servers():
    assert lease_name("gpu-a.example") == "rgpu-gpu-a.example"


def test_lease_name_is_hashed_and_valid_past_63_characters():
    long = "gpu-" + "x" * 70 + ".rack-7.example.com"
    other = "gpu-" + "x" * 70 + ".rack-8.example.com"
    name = lease_name(long)
    assert len(name) <= 63
    assert DNS_SUBDOMAIN.match(name)
    assert name.startswith("rgpu-gpu-xxx")
    assert name != lease_name(other)


def test_lease_name_never_ends_with_a_separator_when_cut():
    server = "a" * 46 + "-" + "b" * 30
    assert DNS_SUBDOMAIN.match(lease_name(server))


def test_encode_then_decode_round_trips_claims(build):
    claims = (claim(build, "b"), claim(build, "a", cards=(1,)))
    body = encode_lease(
        server="gpu-a", namespace="rgpu-system", claims=claims, resource_version=None
    )
    record = decode_lease(as_read(body))
    assert record is not None
    assert record.server == "gpu-a"
    assert record.resource_version == "7"
    assert record.problem is None
    assert [c.pod.name for c in record.claims] == ["a", "b"]
    assert body["metadata"]["labels"] == {MANAGED_BY_LABEL: "rgpu"}
    assert (
        "resourceVersion"
        in encode_lease(server="gpu-a", namespace="n", claims=(), resource_version="9")["metadata"]
    )


def test_holder_identity_names_the_holder_for_people(build):
    one = claim(build, "a")
    assert holder_of([one]) == one.pod.key
    assert holder_of([one, claim(build, "b", cards=(1,))]) == "2 pods"
    assert holder_of([]) is None
    body = encode_lease(server="gpu-a", namespace="n", claims=[one], resource_version=None)
    assert body["spec"] == {"holderIdentity": one.pod.key}


def test_unreadable_claims_are_reported_not_dropped():
    raw = {
        "metadata": {
            "name": "rgpu-s",
            "annotations": {ANNOTATION_SERVER: "s", ANNOTATION_CLAIMS: "{"},
        }
    }
    record = decode_lease(raw)
    assert record is not None
    assert record.claims == ()
    assert record.problem is not None
    assert "not JSON" in record.problem


def test_claims_with_a_bad_field_name_the_field():
    text = '[{"pod": {"uid": "", "namespace": "a", "name": "b"}}]'
    raw = {"metadata": {"annotations": {ANNOTATION_SERVER: "s", ANNOTATION_CLAIMS: text}}}
    record = decode_lease(raw)
    assert record.problem is not None
    assert "[0].pod.uid" in record.problem


def test_claim_for_another_server_is_a_problem(build):
    text = encode_lease(
        server="x", namespace="n", claims=[claim(build, "a", server="x")], resource_version=None
    )
    annotations = text["metadata"]["annotations"]
    annotations[ANNOTATION_SERVER] = "y"
    record = decode_lease(text)
    assert record.problem is not None
    assert "'x'" in record.problem


def test_lease_without_server_annotation_is_not_ours():
    assert decode_lease({"metadata": {"name": "other", "annotations": {}}}) is None


def nomination(build, server: str = "gpu-a") -> Nomination:
    return Nomination(
        pod=build.pod("urgent"),
        priority=1000,
        cards=(CardId(f"{server}/{build.uuid(server, 0)}"),),
        victims=(build.pod("batch"),),
        nominated_at=1700000000.0,
        expires_at=1700000060.0,
    )


def test_a_nomination_is_stored_beside_the_claims_and_read_back(build):
    made = nomination(build)
    body = encode_lease(
        server="gpu-a",
        namespace="rgpu-system",
        claims=[claim(build, "batch")],
        resource_version=None,
        nomination=made,
    )
    assert ANNOTATION_NOMINATION in body["metadata"]["annotations"]
    record = decode_lease(as_read(body))
    assert record.nomination == made
    assert record.problem is None


def test_a_lease_written_before_nominations_existed_reads_without_one(build):
    body = encode_lease(
        server="gpu-a", namespace="rgpu-system", claims=[claim(build, "a")], resource_version=None
    )
    assert ANNOTATION_NOMINATION not in body["metadata"]["annotations"]
    record = decode_lease(as_read(body))
    assert record.nomination is None
    assert record.problem is None


def test_an_unreadable_nomination_makes_the_lease_a_problem_naming_the_field(build):
    body = encode_lease(server="gpu-a", namespace="rgpu-system", claims=(), resource_version=None)
    body["metadata"]["annotations"][ANNOTATION_NOMINATION] = '{"priority": "high"}'
    record = decode_lease(as_read(body))
    assert record.nomination is None
    assert "rgpu.io/nomination" in record.problem
    assert "priority" in record.problem
