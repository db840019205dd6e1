"""Claims are stored durably in one Lease per server, and every replica
(and every restart) must read and write that storage in exactly the same shape.

A Lease is named after its server (``rgpu-<server>``, hashed past 63 characters so it stays a
valid, readable name), labelled ``app.kubernetes.io/managed-by: rgpu``, carries the server
name and the claims (JSON list of ``Claim.to_dict()``) in annotations, and names the sole
holder pod in ``spec.holderIdentity`` so ``kubectl get leases`` shows who holds what.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson

from rgpu_contracts import Claim, ContractError, PodUID, ServerName

__all__ = [
    "ANNOTATION_CLAIMS",
    "ANNOTATION_SERVER",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_SELECTOR",
    "MANAGED_BY_VALUE",
    "LeaseRecord",
    "decode_lease",
    "encode_lease",
    "holder_of",
    "lease_name",
]

ANNOTATION_CLAIMS = "rgpu.io/claims"
ANNOTATION_SERVER = "rgpu.io/server"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "rgpu"
MANAGED_BY_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"

_PREFIX = "rgpu-"
_MAX_NAME = 63
_HASH_CHARS = 10


def lease_name(server: str) -> str:
    """The Lease that stores ``server``'s claims: ``rgpu-<server>``, or a readable prefix plus a
    hash of the full name when that would exceed 63 characters."""
    name = _PREFIX + server
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(server.encode()).hexdigest()[:_HASH_CHARS]
    keep = _MAX_NAME - len(_PREFIX) - len(digest) - 1
    return f"{_PREFIX}{server[:keep].rstrip('.-')}-{digest}"


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


def decode_lease(raw: Mapping[str, object]) -> LeaseRecord | None:
    """Read a Lease written by ``encode_lease``; ``None`` when it names no server (not ours)."""
    meta = _mapping(raw.get("metadata"))
    annotations = _mapping(meta.get("annotations"))
    server = annotations.get(ANNOTATION_SERVER)
    if not isinstance(server, str) or not server:
        return None
    text = annotations.get(ANNOTATION_CLAIMS, "[]")
    claims, problem = _decode_claims(text if isinstance(text, str) else "", server)
    version = meta.get("resourceVersion")
    return LeaseRecord(
        name=str(meta.get("name", "")),
        server=ServerName(server),
        resource_version=version if isinstance(version, str) else "",
        claims=claims,
        problem=problem,
    )


def holder_of(claims: Iterable[Claim]) -> PodUID | None:
    """The one pod holding the server, or ``None`` when free or shared (card granularity)."""
    holders = {c.pod.uid for c in claims}
    return next(iter(holders)) if len(holders) == 1 else None


def encode_lease(
    *, server: str, namespace: str, claims: Iterable[Claim], resource_version: str | None
) -> dict[str, object]:
    """The Lease body that stores ``claims`` for ``server``.

    With ``resource_version`` the body is a compare-and-swap replace; without it, a create.
    Claims are sorted by pod uid so equal states give byte-equal Leases.
    """
    ordered = sorted(claims, key=lambda c: c.pod.uid)
    metadata: dict[str, object] = {
        "name": lease_name(server),
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        "annotations": {
            ANNOTATION_SERVER: server,
            ANNOTATION_CLAIMS: orjson.dumps([c.to_dict() for c in ordered]).decode(),
        },
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {"holderIdentity": holder_of(ordered)},
    }
