"""Kube-scheduler retries a refused pod when the holder pod is
deleted or finishes — usually before the allocator's own watch has delivered that change.
Refusing then would park the pod for a whole backoff (or minutes). So before answering
"no fit" because of claims, the blocking holders are checked against a fresh read of their
pods; a holder that is gone or finished loses its claim on the spot, and the server is used
(DESIGN §4, "validate before refusing").

Fresh reads cost apiserver calls, so they are bounded three ways: each blocked Lease is
re-read at most once per second (between re-reads the cached copy is used), only the few
best-placed blocked servers are looked at per refusal, and fresh pod reads come from a
per-replica budget. The holder check itself is deliberately not limited per Lease: the
retry that follows a holder's deletion must see the deletion even if that Lease was checked
a moment before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from opentelemetry import trace

from rgpu_contracts import Claim
from rgpu_placement import Validity, judge
from rgpu_runtime import TokenBucket

from .core import Core
from .pods import pod_info
from .settling import drop_invalid

__all__ = ["Revalidator", "confirmed_invalid"]

tracer = trace.get_tracer(__name__)

LEASE_INTERVAL = 1.0
"""Seconds between two fresh reads of the same Lease (DESIGN §4: at most once per second)."""
MAX_LEASES = 4
"""Blocked servers checked per refusal: the best-placed few; a pod needs only one."""
POD_READS_PER_SECOND = 50.0
"""Fresh holder reads per second per replica, sustained; refusals beyond that trust the cache.
kube-scheduler attempts each pending pod at most once per backoff (1-10 s), so this covers
hundreds of pending pods."""


class Revalidator:
    """Re-checks the holders of blocked servers with fresh reads, within bounds."""

    __slots__ = ("_budget", "_core", "_monotonic", "_reread")

    def __init__(self, core: Core, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._core = core
        self._monotonic = monotonic
        self._reread: dict[str, float] = {}
        self._budget = TokenBucket(POD_READS_PER_SECOND, clock=monotonic)

    async def revalidate(self, servers: Sequence[str]) -> bool:
        """Check up to ``MAX_LEASES`` of ``servers``; returns whether any of them changed."""
        checked = servers[:MAX_LEASES]
        changed = False
        with tracer.start_as_current_span("revalidate", attributes={"servers": len(checked)}):
            for server in checked:
                changed = await self._check(server) or changed
        return changed

    def _lease_due(self, server: str) -> bool:
        now = self._monotonic()
        if now - self._reread.get(server, -LEASE_INTERVAL) < LEASE_INTERVAL:
            return False
        self._reread[server] = now
        return True

    async def _check(self, server: str) -> bool:
        core = self._core
        before = core.ledger.lease(server)
        record = await core.writer.reread(server) if self._lease_due(server) else before
        if record is None:
            return before is not None
        confirmed = [c.pod.uid for c in record.claims if await self._invalid(c)]
        removed = await drop_invalid(core, server, confirmed) if confirmed else 0
        return removed > 0 or record != before

    async def _invalid(self, claim: Claim) -> bool:
        if self._core.validity(claim) is Validity.INVALID:
            return True
        return self._budget.take() and await confirmed_invalid(self._core, claim)


async def confirmed_invalid(core: Core, claim: Claim) -> bool:
    """Whether ``claim`` is invalid, checked against a fresh read of its pod when the cache
    cannot tell (or says it still holds)."""
    if core.validity(claim) is Validity.INVALID:
        return True
    raw = await core.api.get_pod(claim.pod.namespace, claim.pod.name)
    pod = pod_info(raw) if raw is not None else None
    if pod is None or pod.uid != claim.pod.uid:
        return True
    verdict = judge(claim, pod, now=core.clock(), ttl=core.policy.ttl)
    return verdict is Validity.INVALID
