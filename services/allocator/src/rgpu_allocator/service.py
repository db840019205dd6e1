"""The HTTP handlers need one object that offers the allocator's
operations (allocate, commit, release, look up, follow claims, report status) without
knowing which activity module implements each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rgpu_contracts import Allocation, AllocationRequest, ClaimSet, NoFit

from .allocating import allocate
from .committing import Finder, commit, lookup
from .core import Core
from .reprobing import Reprober
from .revalidating import Revalidator
from .settling import release

__all__ = ["AllocatorService"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorService:
    """The allocator's operations, as the routes call them."""

    core: Core
    revalidator: Revalidator
    reprober: Reprober
    finder: Finder

    async def allocate(self, request: AllocationRequest) -> Allocation | NoFit:
        """Choose and book a server (see ``allocating.allocate``)."""
        return await allocate(self.core, request, self.revalidator, self.reprober)

    async def commit(self, uid: str, node: str) -> Allocation:
        """Commit a booking for ``node`` (see ``committing.commit``)."""
        return await commit(self.core, self.finder, uid, node)

    async def release(self, uid: str) -> None:
        """Remove every claim of ``uid``; releasing nothing is fine (idempotent)."""
        await release(self.core, uid)

    def get(self, uid: str) -> Allocation:
        """The pod's valid allocation; raises ``ClaimNotFound``."""
        return lookup(self.core, uid)

    async def claims(self, since: int | None, wait: float) -> ClaimSet:
        """Every stored claim, once the revision differs from ``since`` (or after ``wait``)."""
        if since is not None:
            await self.core.ledger.wait_newer(since, wait)
        return self.core.ledger.claim_set()

    def status(self) -> dict[str, Any]:
        """What an operator asks first: is the input fresh, how much is held."""
        core = self.core
        view = core.inputs.view
        age = core.inputs.fleet_age()
        return {
            "granularity": core.policy.granularity,
            "fleetRevision": view.fleet.revision if view is not None else None,
            "fleetAgeSeconds": None if age is None else round(age, 3),
            "discoveryError": core.inputs.discovery_error,
            "servers": len(view.facts) if view is not None else 0,
            "leases": len(core.ledger),
            "claims": sum(len(r.claims) for r in core.ledger.leases()),
            "pods": len(core.pods),
            "refusedWaiting": len(core.refused),
            "synced": core.pods.synced and core.ledger.synced,
        }
