"""Claims are stored durably in one Lease per server, and every replica (and every restart)
must read and write that storage in exactly the same shape: this module is the Lease format
(the in-memory mirror of the Leases is ``ledger``).

A Lease is named after its server (``rgpu-<server>``, hashed past 63 characters so it stays a
valid, readable name), labelled ``app.kubernetes.io/managed-by: rgpu``, carries the server
name and the claims (JSON list of ``Claim.to_dict()``) in annotations, and names the sole
holder in ``spec.holderIdentity`` so ``kubectl get leases`` shows who holds what: the pod as
``namespace/name`` when one pod holds the server, ``<n> pods`` when several share it (card
granularity), empty when it is free. A server being freed for an urgent pod also carries that
pod's ``Nomination`` (annotation ``rgpu.io/nomination``, docs/design.md §11); Leases written
before preemption existed have none and read as such.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson

from rgpu_contracts import (
    Claim,
    ClaimState,
    ContractError,
    ServerName,
    prefixed_name,
)
from rgpu_placement import ANNOTATION_NOMINATION, Nomination

__all__ = [
    "ANNOTATION_CLAIMS",
    "ANNOTATION_NOMINATION",
    "ANNOTATION_SERVER",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_SELECTOR",
    "MANAGED_BY_VALUE",
    "LeaseRecord",
    "decode_lease",
    "encode_lease",
    "holder_of",
    "lease_name",
    "newer_or_equal",
    "placed",
]

ANNOTATION_CLAIMS = "rgpu.io/claims"
ANNOTATION_SERVER = "rgpu.io/server"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "rgpu"
MANAGED_BY_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"

_PREFIX = "rgpu-"


def lease_name(server: str) -> str:
    """The Lease that stores ``server``'s claims: ``rgpu-<server>``, or a readable prefix plus a
    hash of the full name when that would exceed 63 characters."""
    return prefixed_name(_PREFIX, server)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """One server's Lease as last read: its claims and the version to compare-and-swap on.

    ``problem`` is set when the claims annotation could not be read; such a server is treated
    as fully held (never overwritten blindly) until a human fixes or deletes the Lease.
    """

    name: str
    server: ServerName
    resource_version: str
    claims: tuple[Claim, ...]
    problem: str | None = None
    nomination: Nomination | None = None
    """The urgent pod this server is being freed for, if any (expired ones included)."""

    def without(self, uid: str) -> tuple[Claim, ...]:
        """The claims of every pod except ``uid``."""
        return tuple(c for c in self.claims if c.pod.uid != uid)

    def claim_of(self, uid: str) -> Claim | None:
        return next((c for c in self.claims if c.pod.uid == uid), None)


def _mapping(raw: object) -> Mapping[str, object]:
    return raw if isinstance(raw, Mapping) else {}


def _decode_claims(text: str, server: str) -> tuple[tuple[Claim, ...], str | None]:
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return (), f"{ANNOTATION_CLAIMS} is not JSON ({exc})"
    if not isinstance(raw, list):
        return (), f"{ANNOTATION_CLAIMS} must be a JSON list of claims"
    try:
        claims = tuple(Claim.from_dict(item, f"[{i}]") for i, item in enumerate(raw))
    except ContractError as exc:
        return (), f"{ANNOTATION_CLAIMS}{exc.path}: {exc.reason}"
    stray = next((c for c in claims if c.server != server), None)
    if stray is not None:
        return (), f"{ANNOTATION_CLAIMS} holds a claim for server {stray.server!r}"
    return claims, None


def _decode_nomination(text: object) -> tuple[Nomination | None, str | None]:
    if text is None:
        return None, None
    try:
        return Nomination.from_dict(orjson.loads(text if isinstance(text, str) else "")), None
    except orjson.JSONDecodeError as exc:
        return None, f"{ANNOTATION_NOMINATION} is not JSON ({exc})"
    except ContractError as exc:
        return None, f"{ANNOTATION_NOMINATION}: {exc}"


def decode_lease(raw: Mapping[str, object]) -> LeaseRecord | None:
    """Read a Lease written by ``encode_lease``; ``None`` when it names no server (not ours)."""
    meta = _mapping(raw.get("metadata"))
    annotations = _mapping(meta.get("annotations"))
    server = annotations.get(ANNOTATION_SERVER)
    if not isinstance(server, str) or not server:
        return None
    text = annotations.get(ANNOTATION_CLAIMS, "[]")
    claims, problem = _decode_claims(text if isinstance(text, str) else "", server)
    nomination, unreadable = _decode_nomination(annotations.get(ANNOTATION_NOMINATION))
    version = meta.get("resourceVersion")
    return LeaseRecord(
        name=str(meta.get("name", "")),
        server=ServerName(server),
        resource_version=version if isinstance(version, str) else "",
        claims=claims,
        problem=problem or unreadable,
        nomination=nomination,
    )


def holder_of(claims: Iterable[Claim]) -> str | None:
    """Who holds the server, for people: ``namespace/name`` of the one holder, ``<n> pods``
    when several share it (card granularity), ``None`` when it is free."""
    holders = {c.pod.uid: c.pod.key for c in claims}
    if len(holders) > 1:
        return f"{len(holders)} pods"
    return next(iter(holders.values()), None)


def encode_lease(
    *,
    server: str,
    namespace: str,
    claims: Iterable[Claim],
    resource_version: str | None,
    nomination: Nomination | None = None,
) -> dict[str, object]:
    """The Lease body that stores ``claims`` (and ``nomination``) for ``server``.

    With ``resource_version`` the body is a compare-and-swap replace; without it, a create.
    Claims are sorted by pod uid so equal states give byte-equal Leases.
    """
    ordered = sorted(claims, key=lambda c: c.pod.uid)
    annotations = {
        ANNOTATION_SERVER: server,
        ANNOTATION_CLAIMS: orjson.dumps([c.to_dict() for c in ordered]).decode(),
    }
    if nomination is not None:
        annotations[ANNOTATION_NOMINATION] = orjson.dumps(nomination.to_dict()).decode()
    metadata: dict[str, object] = {
        "name": lease_name(server),
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        "annotations": annotations,
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {"holderIdentity": holder_of(ordered)},
    }


def newer_or_equal(candidate: str, held: str) -> bool:
    """Whether ``candidate`` is not older than ``held``; opaque versions always win."""
    if candidate.isdigit() and held.isdigit():
        return int(candidate) >= int(held)
    return True


def placed(claim: Claim) -> bool:
    """Whether the claim's pod may have run on lupine (its annotations were issued)."""
    return claim.state is not ClaimState.BOOKED or claim.node is not None
