"""Followers of ``GET /v1/claims`` (metrics, the CLI) may be answered by any allocator
replica, one after another, and must never see the claims go backwards; and one pod booked
must not cost each of them the whole claim set again.

So the claim set they read is not the ledger (which takes this replica's own writes before
the watch echoes them, so its contents are ahead of any apiserver position) but each claim
Lease exactly as the Lease watch delivered it, and its revision is the watch's position:
the resourceVersion of the last change (or of the list after a relist). Every replica
watching the same Leases reaches the same revision with the same claims, so a revision
means the same thing whichever replica answers it, and a follower that moves to a replica
behind it is held until that replica has caught up (``rgpu_runtime.Poll``).

Each snapshot keeps every server's claims as JSON from the moment its Lease changed, and a
``Changelog`` of the servers each recent revision changed, so an update
(``rgpu_contracts.ClaimsUpdate``) is the claims of the servers changed since the revision a
follower holds, joined from cached JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import orjson

from rgpu_contracts import Claim, ServerName
from rgpu_runtime import Changelog, Changes, ObjectChange, Versioned

from .claims import LeaseRecord

__all__ = ["ClaimsSnapshot", "PublishedClaims", "revision_of"]

logger = logging.getLogger(__name__)

UPDATES_KEPT: Final = 16
"""Update bodies kept per snapshot, one per ``since`` asked: followers hold one of a few
recent revisions."""
MAX_REVISION_DIGITS: Final = 19
"""etcd's revisions are int64; anything longer is not one."""


def revision_of(resource_version: str) -> int | None:
    """The claim-set revision a resourceVersion stands for; ``None`` when it is not etcd's
    integer (Kubernetes calls it opaque; every apiserver backed by etcd uses the integer)."""
    digits = resource_version.isascii() and resource_version.isdigit()
    if digits and len(resource_version) <= MAX_REVISION_DIGITS:
        return int(resource_version)
    return None


@dataclass(frozen=True, slots=True)
class _Server:
    claims: tuple[Claim, ...]
    json: bytes
    """The claims as JSON array elements, without the brackets (empty when none)."""

    @classmethod
    def of(cls, claims: tuple[Claim, ...]) -> _Server:
        return cls(claims=claims, json=orjson.dumps([c.to_dict() for c in claims])[1:-1])


class ClaimsSnapshot:
    """Every server's claims at one revision; immutable, bodies built once on demand."""

    __slots__ = ("_body", "_servers", "_updates", "changelog", "revision")

    def __init__(
        self, revision: int, servers: Mapping[ServerName, _Server], changelog: Changelog
    ) -> None:
        self.revision = revision
        self._servers = servers
        self.changelog = changelog
        self._body: bytes | None = None
        self._updates: dict[int | None, bytes] = {}

    def claims(self) -> tuple[Claim, ...]:
        """Every claim, ordered by server."""
        return tuple(c for name in sorted(self._servers) for c in self._servers[name].claims)

    def body(self) -> bytes:
        """The ``ClaimSet`` contract's JSON, as clients without updates read it."""
        if self._body is None:
            self._body = b'{"revision":%d,"claims":[%s]}' % (self.revision, self._joined(None))
        return self._body

    def update(self, since: int | None) -> bytes:
        """The ``ClaimsUpdate`` for a reader holding ``since`` (not above ``revision``):
        the servers changed since then, or everything (``full``) when the changelog does not
        reach back that far."""
        changes = None if since is None else self.changelog.since(since)
        key = None if changes is None else since
        body = self._updates.get(key)
        if body is None:
            body = self._full() if since is None or changes is None else self._delta(since, changes)
            if len(self._updates) >= UPDATES_KEPT:
                del self._updates[next(iter(self._updates))]
            self._updates[key] = body
        return body

    def behind(self, since: int) -> bytes:
        """The update telling a reader holding ``since`` that this replica is still below it."""
        return orjson.dumps({"kind": "behind", "revision": self.revision, "since": since})

    def _full(self) -> bytes:
        return b'{"kind":"full",' + self.body()[1:]

    def _delta(self, since: int, changes: Changes) -> bytes:
        names = sorted(changes.changed | changes.removed)
        head = orjson.dumps({"kind": "delta", "revision": self.revision, "since": since})[:-1]
        return b'%s,"servers":%s,"claims":[%s]}' % (
            head,
            orjson.dumps(names),
            self._joined(names),
        )

    def _joined(self, names: list[str] | None) -> bytes:
        chosen = sorted(self._servers) if names is None else names
        parts = (self._servers[ServerName(n)].json for n in chosen if n in self._servers)
        return b",".join(part for part in parts if part)


class PublishedClaims:
    """The claim set followers read, fed by the Lease watch only; one ``Versioned``
    snapshot per change, its revision the watch's resourceVersion."""

    __slots__ = ("_servers", "versioned")

    def __init__(self) -> None:
        self._servers: dict[ServerName, _Server] = {}
        empty = ClaimsSnapshot(0, {}, Changelog(0))
        self.versioned: Versioned[ClaimsSnapshot] = Versioned(empty, revision=0)

    def changed(self, change: ObjectChange[LeaseRecord]) -> None:
        """A watched Lease was added, changed or deleted at ``change.resource_version``."""
        record = change.after or change.before
        if record is None:
            return
        claims = () if change.after is None else change.after.claims
        if self._store(record.server, claims):
            self._publish(change.resource_version, changed=(record.server,))

    def relisted(self, fresh: Mapping[str, LeaseRecord], resource_version: str) -> None:
        """The Leases were listed afresh at ``resource_version``."""
        listed = {record.server: record.claims for record in fresh.values()}
        gone = [name for name in self._servers if name not in listed]
        for name in gone:
            del self._servers[name]
        changed = [name for name, claims in listed.items() if self._store(name, claims)]
        if gone or changed or self.versioned.revision == 0:
            self._publish(resource_version, changed=changed, removed=gone)

    def _store(self, server: ServerName, claims: tuple[Claim, ...]) -> bool:
        held = self._servers.get(server)
        if held is not None and held.claims == claims:
            return False
        if claims:
            self._servers[server] = _Server.of(claims)
        elif held is None:
            return False
        else:
            del self._servers[server]
        return True

    def _publish(
        self, resource_version: str, *, changed: Iterable[str], removed: Iterable[str] = ()
    ) -> None:
        current = self.versioned.value
        revision = revision_of(resource_version)
        if revision is None or revision <= current.revision:
            # Not comparable across replicas any more, but never backwards, never reused.
            logger.info(
                "lease resourceVersion %r does not follow %d; counting on from it",
                resource_version,
                current.revision,
            )
            revision = current.revision + 1
        if current.revision == 0:
            # The first list: nothing is known of what changed before it.
            log = Changelog(revision)
        else:
            log = current.changelog.then(revision, changed, removed)
        snapshot = ClaimsSnapshot(revision, dict(self._servers), log)
        self.versioned.publish(snapshot, revision=revision)
