"""Why this module exists: kube-scheduler retries a refused pod when the holder pod is
deleted — often before the allocator's own watch has delivered that deletion. Refusing then
would send the pod back to wait for minutes. So before answering "no fit" because of claims,
the blocking Leases are read fresh and every holder is checked against a fresh read of its
pod; a holder that is gone or finished loses its claim on the spot (DESIGN §4, "validate
before refusing").

Fresh reads cost apiserver calls, so each Lease is re-checked at most once per second and
only the few best-placed blocked servers are looked at per decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from opentelemetry import trace

from rgpu_contracts import Claim

from .core import Core
from .pods import pod_info
from .settling import drop_invalid
from .validity import Validity, judge

__all__ = ["Revalidator", "confirmed_invalid"]

tracer = trace.get_tracer(__name__)

MIN_INTERVAL = 1.0
"""Seconds between two fresh checks of the same Lease (DESIGN §4: at most once per second)."""
MAX_LEASES = 4
"""Blocked servers checked per refusal: the best-placed few; a pod needs only one."""


class Revalidator:
    """Re-checks the holders of blocked servers with fresh reads, rate-limited per Lease."""

    __slots__ = ("_checked", "_core", "_monotonic")

    def __init__(self, core: Core, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._core = core
        self._monotonic = monotonic
        self._checked: dict[str, float] = {}

    async def revalidate(self, servers: Sequence[str]) -> bool:
        """Check up to ``MAX_LEASES`` of ``servers``; returns whether any of them changed."""
        due = [s for s in servers if self._due(s)][:MAX_LEASES]
        changed = False
        with tracer.start_as_current_span("revalidate", attributes={"servers": len(due)}):
            for server in due:
                changed = await self._check(server) or changed
        return changed

    def _due(self, server: str) -> bool:
        now = self._monotonic()
        if now - self._checked.get(server, -MIN_INTERVAL) < MIN_INTERVAL:
            return False
        self._checked[server] = now
        return True

    async def _check(self, server: str) -> bool:
        before = self._core.ledger.lease(server)
        record = await self._core.writer.reread(server)
        if record is None:
            return before is not None
        confirmed = [c.pod.uid for c in record.claims if await confirmed_invalid(self._core, c)]
        removed = await drop_invalid(self._core, server, confirmed) if confirmed else 0
        return removed > 0 or record != before


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
