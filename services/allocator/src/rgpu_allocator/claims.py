"""Claims are stored durably in one Lease per server, every replica (and every restart) must
read and write that storage in exactly the same shape, and every decision needs "who holds
what" in microseconds; so this module holds both the Lease format and its in-memory mirror.

A Lease is named after its server (``rgpu-<server>``, hashed past 63 characters so it stays a
valid, readable name), labelled ``app.kubernetes.io/managed-by: rgpu``, carries the server
name and the claims (JSON list of ``Claim.to_dict()``) in annotations, and names the sole
holder pod in ``spec.holderIdentity`` so ``kubectl get leases`` shows who holds what. A
server being freed for an urgent pod also carries that pod's ``Nomination`` (annotation
``rgpu.io/nomination``, DESIGN §11); Leases written before preemption existed have none and
read as such.

The ``Ledger`` mirrors the claim Leases, indexed by server and by pod, and versioned for
long-polls. It is fed by the Lease watch and by the replies to our own writes, which can arrive
in either order; a record older than the one held (by ``resourceVersion``) is ignored so the
view never steps back in time. It also remembers when cards of committed or bound claims were
released: lupine keeps reporting a finished pod's card as busy until discovery probes again,
and a busy report older than the release is stale (see ``judging.Occupancy.busy``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import orjson

from rgpu_contracts import (
    CardId,
    Claim,
    ClaimSet,
    ClaimState,
    ContractError,
    PodUID,
    ServerName,
    prefixed_name,
)
from rgpu_placement import ANNOTATION_NOMINATION, Nomination
from rgpu_runtime import Versioned

__all__ = [
    "ANNOTATION_CLAIMS",
    "ANNOTATION_NOMINATION",
    "ANNOTATION_SERVER",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_SELECTOR",
    "MANAGED_BY_VALUE",
    "Change",
    "LeaseRecord",
    "Ledger",
    "Nominee",
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


def holder_of(claims: Iterable[Claim]) -> PodUID | None:
    """The one pod holding the server, or ``None`` when free or shared (card granularity)."""
    holders = {c.pod.uid for c in claims}
    return next(iter(holders)) if len(holders) == 1 else None


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """What one update did: whether it applied, and whether capacity appeared (cards freed)."""

    applied: bool
    freed: bool = False


RELEASES_KEPT = 100_000
"""Released cards remembered (the oldest are forgotten first); far more than any fleet has."""


def _freed(before: LeaseRecord | None, after: LeaseRecord | None) -> bool:
    if before is None:
        return False
    kept = {c for claim in after.claims for c in claim.cards} if after else set()
    return any(card not in kept for claim in before.claims for card in claim.cards)


def placed(claim: Claim) -> bool:
    """Whether the claim's pod may have run on lupine (its annotations were issued)."""
    return claim.state is not ClaimState.BOOKED or claim.node is not None


def _released(before: LeaseRecord | None, after: LeaseRecord | None) -> list[CardId]:
    if before is None:
        return []
    kept = {c for claim in after.claims for c in claim.cards} if after else set()
    return [c for claim in before.claims if placed(claim) for c in claim.cards if c not in kept]


@dataclass(frozen=True, slots=True, kw_only=True)
class Nominee:
    """A pod with a live nomination, as the nudger needs it."""

    expires_at: float
    freed: bool
    """Whether no other pod's claim holds the promised cards any more: the pod can book."""


def _promised_cards_free(record: LeaseRecord, nomination: Nomination) -> bool:
    promised = set(nomination.cards)
    nominee = nomination.pod.uid
    return not any(c.pod.uid != nominee and promised.intersection(c.cards) for c in record.claims)


class Ledger:
    """The claim Leases as last seen, with a revision that moves on every change."""

    __slots__ = (
        "_by_pod",
        "_cards",
        "_changes",
        "_clock",
        "_leases",
        "_nominated",
        "_released",
        "_snapshot",
        "synced",
    )

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._released: dict[CardId, float] = {}
        # Built on demand and kept until the next change: every long-poll waiter woken by one
        # change gets the same snapshot.
        self._snapshot: ClaimSet | None = None
        self._leases: dict[ServerName, LeaseRecord] = {}
        self._by_pod: dict[PodUID, set[ServerName]] = {}
        # Cards claimed per namespace: quotas and fair share ask on every admission pass.
        self._cards: dict[str, int] = {}
        # Few Leases carry a nomination; decisions and every pod deletion ask for them.
        self._nominated: dict[ServerName, LeaseRecord] = {}
        # Only the revision moves here (the claim set is built on demand, above); Versioned
        # makes its wake-up event on first wait, so decisions and benchmarks outside any
        # event loop pay nothing.
        self._changes: Versioned[None] = Versioned(None, revision=0)
        self.synced = False
        """Whether a complete list has been loaded."""

    @property
    def revision(self) -> int:
        return self._changes.revision

    def __len__(self) -> int:
        return len(self._leases)

    def lease(self, server: str) -> LeaseRecord | None:
        return self._leases.get(ServerName(server))

    def leases(self) -> tuple[LeaseRecord, ...]:
        return tuple(self._leases.values())

    def claims_of(self, uid: str) -> tuple[Claim, ...]:
        """Every claim ``uid`` holds, ordered by server name."""
        servers = sorted(self._by_pod.get(PodUID(uid), ()))
        found = (self._leases[s].claim_of(uid) for s in servers)
        return tuple(c for c in found if c is not None)

    def nominees(self, now: float) -> dict[PodUID, Nominee]:
        """Pods with a live nomination on some server (capacity is being freed for them)."""
        return {
            r.nomination.pod.uid: Nominee(
                expires_at=r.nomination.expires_at, freed=_promised_cards_free(r, r.nomination)
            )
            for r in self._nominated.values()
            if r.nomination is not None and now < r.nomination.expires_at
        }

    def nominated(self) -> tuple[LeaseRecord, ...]:
        """The Leases that carry a nomination, live or expired."""
        return tuple(self._nominated.values())

    def cards_by_namespace(self) -> Mapping[str, int]:
        """Cards claimed per pod namespace, as stored (a claim counts until it is removed)."""
        return self._cards

    def servers_of(self, uid: str) -> int:
        """On how many servers ``uid`` holds claims."""
        return len(self._by_pod.get(PodUID(uid), ()))

    def duplicated_pods(self) -> tuple[PodUID, ...]:
        """Pods holding claims on more than one server (replicas raced on the same pod)."""
        return tuple(uid for uid, servers in self._by_pod.items() if len(servers) > 1)

    def released_after(self, card: str, moment: float) -> bool:
        """Whether ``card`` left a committed or bound claim after ``moment`` (wall clock)."""
        return self._released.get(CardId(card), float("-inf")) > moment

    def claim_set(self) -> ClaimSet:
        """Every stored claim, ordered by server, at the current revision."""
        revision = self._changes.revision
        if self._snapshot is None or self._snapshot.revision != revision:
            claims = (c for s in sorted(self._leases) for c in self._leases[s].claims)
            self._snapshot = ClaimSet(revision=revision, claims=tuple(claims))
        return self._snapshot

    def apply(self, record: LeaseRecord) -> Change:
        """Take a Lease read from the apiserver (watch event or write reply)."""
        before = self._leases.get(record.server)
        if before is not None and not newer_or_equal(
            record.resource_version, before.resource_version
        ):
            return Change(applied=False)
        if before == record:
            return Change(applied=False)
        self._unindex(before)
        self._leases[record.server] = record
        self._index(record)
        self._remember(_released(before, record))
        self._bump()
        return Change(applied=True, freed=_freed(before, record))

    def forget(self, server: str, resource_version: str = "") -> Change:
        """Drop a deleted Lease (unless we already hold a newer one)."""
        before = self._leases.get(ServerName(server))
        if before is None:
            return Change(applied=False)
        if resource_version and not newer_or_equal(resource_version, before.resource_version):
            return Change(applied=False)
        self._unindex(before)
        del self._leases[before.server]
        self._remember(_released(before, None))
        self._bump()
        return Change(applied=True, freed=_freed(before, None))

    def replace_all(self, records: Iterable[LeaseRecord]) -> Change:
        """Swap in a fresh list; freed when any card held before is not held now."""
        fresh: Mapping[ServerName, LeaseRecord] = {r.server: r for r in records}
        freed = any(_freed(old, fresh.get(s)) for s, old in self._leases.items())
        for server, old in self._leases.items():
            self._remember(_released(old, fresh.get(server)))
        self._leases = dict(fresh)
        self._by_pod, self._nominated, self._cards = {}, {}, {}
        for record in self._leases.values():
            self._index(record)
        self.synced = True
        self._bump()
        return Change(applied=True, freed=freed)

    async def wait_newer(self, since: int, timeout: float) -> int:
        """Wait until the revision differs from ``since`` or ``timeout`` passes.

        "Differs" rather than "exceeds": a reader holding a revision from before this
        process started gets the current state at once instead of sleeping out its wait.
        """
        revision, _ = await self._changes.wait_newer(since, timeout)
        return revision

    def _remember(self, cards: list[CardId]) -> None:
        now = self._clock()
        for card in cards:
            self._released.pop(card, None)
            self._released[card] = now
        while len(self._released) > RELEASES_KEPT:
            del self._released[next(iter(self._released))]

    def _bump(self) -> None:
        self._changes.publish(None)

    def _index(self, record: LeaseRecord) -> None:
        if record.nomination is not None:
            self._nominated[record.server] = record
        for claim in record.claims:
            self._by_pod.setdefault(claim.pod.uid, set()).add(record.server)
            namespace = claim.pod.namespace
            self._cards[namespace] = self._cards.get(namespace, 0) + len(claim.cards)

    def _unindex(self, record: LeaseRecord | None) -> None:
        if record is None:
            return
        self._nominated.pop(record.server, None)
        for claim in record.claims:
            namespace = claim.pod.namespace
            left = self._cards.get(namespace, 0) - len(claim.cards)
            if left > 0:
                self._cards[namespace] = left
            else:
                self._cards.pop(namespace, None)
            servers = self._by_pod.get(claim.pod.uid)
            if servers is not None:
                servers.discard(record.server)
                if not servers:
                    del self._by_pod[claim.pod.uid]
