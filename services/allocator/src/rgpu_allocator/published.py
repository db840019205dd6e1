"""Followers of ``GET /v1/claims`` (metrics, the CLI) may be answered by any allocator
replica, one after another, and must never see the claims go backwards; and one pod booked
must not cost each of them the whole claim set again.

So the claim set they read is not the ledger (which takes this replica's own writes before
the watch echoes them, so its contents are ahead of any apiserver position) but each claim
Lease exactly as the Lease watch delivered it, and its revision is the watch's position:
the resourceVersion of the last change (or of the list after a relist). Every replica
watching the same Leases reaches the same revision with the same claims, so a revision
means the same thing whichever replica answers it, and a follower that moves to a replica
behind it is held until that replica has caught up (``rgpu_runtime.feeds.Poll``).

Each snapshot (``rgpu_runtime.feeds.Published`` of ``CLAIMS_FEED``) keeps every server's claims as
JSON from the moment its Lease changed, and the servers each recent revision changed, so an
update (``rgpu_contracts.ClaimsUpdate``) is the claims of the servers changed since the
revision a follower holds, joined from cached JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import orjson

from rgpu_contracts import Claim, ServerName
from rgpu_runtime.feeds import CLAIMS_FEED, Changes, Entry, Published, Versioned
from rgpu_runtime.kube import ObjectChange

from .claims import LeaseRecord

__all__ = ["ClaimsSnapshot", "PublishedClaims", "revision_of"]

logger = logging.getLogger(__name__)

MAX_REVISION_DIGITS: Final = 19
"""etcd's revisions are int64; anything longer is not one."""


def revision_of(resource_version: str) -> int | None:
    """The claim-set revision a resourceVersion stands for; ``None`` when it is not etcd's
    integer (Kubernetes calls it opaque; every apiserver backed by etcd uses the integer)."""
    digits = resource_version.isascii() and resource_version.isdigit()
    if digits and len(resource_version) <= MAX_REVISION_DIGITS:
        return int(resource_version)
    return None


ClaimsSnapshot = Published[tuple[Claim, ...]]
"""The claim set at one revision: an entry per server holding claims, its claims' JSON
encoded once when its Lease changed (as array elements, without the brackets)."""


def _entry(server: ServerName, claims: tuple[Claim, ...]) -> Entry[tuple[Claim, ...]]:
    return Entry(name=server, value=claims, json=orjson.dumps([c.to_dict() for c in claims])[1:-1])


class PublishedClaims:
    """The claim set followers read, fed by the Lease watch only; one ``Versioned``
    snapshot per change, its revision the watch's resourceVersion."""

    __slots__ = ("_servers", "versioned")

    def __init__(self) -> None:
        self._servers: dict[str, Entry[tuple[Claim, ...]]] = {}
        empty = ClaimsSnapshot(CLAIMS_FEED, revision=0, entries=())
        self.versioned: Versioned[ClaimsSnapshot] = Versioned(empty, revision=0)

    def changed(self, change: ObjectChange[LeaseRecord]) -> None:
        """A watched Lease was added, changed or deleted at ``change.resource_version``."""
        record = change.after or change.before
        if record is None:
            return
        claims = () if change.after is None else change.after.claims
        if self._store(record.server, claims):
            self._publish(change.resource_version, Changes(changed=frozenset((record.server,))))

    def relisted(self, fresh: Mapping[str, LeaseRecord], resource_version: str) -> None:
        """The Leases were listed afresh at ``resource_version``."""
        listed = {record.server: record.claims for record in fresh.values()}
        gone = [name for name in self._servers if name not in listed]
        for name in gone:
            del self._servers[name]
        changed = [name for name, claims in listed.items() if self._store(name, claims)]
        if gone or changed or self.versioned.revision == 0:
            self._publish(
                resource_version, Changes(changed=frozenset(changed), removed=frozenset(gone))
            )

    def _store(self, server: ServerName, claims: tuple[Claim, ...]) -> bool:
        held = self._servers.get(server)
        if held is not None and held.value == claims:
            return False
        if claims:
            self._servers[server] = _entry(server, claims)
        elif held is None:
            return False
        else:
            del self._servers[server]
        return True

    def _publish(self, resource_version: str, changes: Changes) -> None:
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
        # The first list starts a fresh changelog: nothing is known of what changed before it.
        snapshot = ClaimsSnapshot(
            CLAIMS_FEED,
            revision=revision,
            entries=self._servers,
            previous=None if current.revision == 0 else current,
            changes=changes,
        )
        self.versioned.publish(snapshot, revision=revision)
