"""The claim set followers read: its revision is the Lease watch's resourceVersion, a change
that leaves the claims as they were publishes nothing, and the first list starts a fresh
changelog (nothing is known of what changed before it)."""

from __future__ import annotations

import orjson

import rgpu_testkit as testkit
from rgpu_allocator.claims import LeaseRecord
from rgpu_allocator.published import PublishedClaims, revision_of
from rgpu_contracts import ClaimSet, ClaimsUpdate, ServerName, UpdateKind
from rgpu_runtime.kube import ObjectChange


def lease(server: str, *pods: str, version: str = "1") -> LeaseRecord:
    claims = tuple(
        testkit.claim(server=server, pod=testkit.pod_ref(name=pod, uid=f"uid-{pod}"))
        for pod in pods
    )
    return LeaseRecord(
        name=f"rgpu-{server}", server=ServerName(server), resource_version=version, claims=claims
    )


def modified(record: LeaseRecord, version: str) -> ObjectChange[LeaseRecord]:
    return ObjectChange(type="MODIFIED", before=None, after=record, resource_version=version)


def test_the_revision_is_the_resource_version_of_the_last_change() -> None:
    published = PublishedClaims()
    published.relisted({"u1": lease("gpu-a", "p")}, "40")
    assert published.versioned.revision == 40
    published.changed(modified(lease("gpu-b", "q"), "57"))
    snapshot = published.versioned.value
    assert snapshot.revision == 57
    assert [c.pod.name for c in ClaimSet.from_dict(orjson.loads(snapshot.body())).claims] == [
        "p",
        "q",
    ]


def test_a_change_that_leaves_the_claims_alone_publishes_nothing() -> None:
    published = PublishedClaims()
    published.relisted({"u1": lease("gpu-a", "p")}, "40")
    published.changed(modified(lease("gpu-a", "p"), "41"))
    assert published.versioned.revision == 40


def test_a_deleted_lease_is_named_in_the_next_update_without_claims() -> None:
    published = PublishedClaims()
    published.relisted({"u1": lease("gpu-a", "p"), "u2": lease("gpu-b", "q")}, "40")
    gone = ObjectChange(
        type="DELETED", before=lease("gpu-a", "p"), after=None, resource_version="44"
    )
    published.changed(gone)
    update = ClaimsUpdate.from_dict(orjson.loads(published.versioned.value.update(40)))
    assert (update.kind, update.servers, update.claims) == (UpdateKind.DELTA, ("gpu-a",), ())


def test_the_first_list_has_no_history_so_an_older_revision_gets_everything() -> None:
    published = PublishedClaims()
    published.relisted({"u1": lease("gpu-a", "p")}, "40")
    update = ClaimsUpdate.from_dict(orjson.loads(published.versioned.value.update(12)))
    assert update.kind is UpdateKind.FULL


def test_a_resource_version_that_is_not_a_counter_still_moves_the_revision_forward() -> None:
    published = PublishedClaims()
    published.relisted({}, "40")
    published.changed(modified(lease("gpu-a", "p"), "opaque"))
    published.changed(modified(lease("gpu-a", "p", "q"), "39"))
    assert published.versioned.revision == 42
    assert (revision_of("123"), revision_of("x1"), revision_of("9" * 20)) == (123, None, None)
