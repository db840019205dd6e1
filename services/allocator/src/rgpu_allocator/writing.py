"""Every change to a claim is a read-modify-write of one server's
Lease with compare-and-swap on ``metadata.resourceVersion``, and that loop — including what to
do when another replica won — must be written once and be right.

An edit is a pure function from the Lease as last read to the claims it should hold (or
``None``: nothing to write). The writer first trusts the cached copy (most writes then take one
round trip); on ``409`` it re-reads the Lease and asks the edit again, so the decision is
always made on what the apiserver holds. A bounded number of attempts keeps a hot Lease from
stalling a caller forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from rgpu_contracts import Claim, ServerName
from rgpu_runtime import KubeConflict, KubeNotFound

from .errors import Contended, LeaseUnreadable, NamespaceMissing
from .inflight import KeyedLocks
from .instruments import Instruments
from .kube_api import KubeApi
from .leases import LeaseRecord, decode_lease, encode_lease, lease_name
from .ledger import Ledger

__all__ = ["ATTEMPTS", "Edit", "LeaseWriter"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

ATTEMPTS = 8
"""Compare-and-swap rounds before giving up with a retryable error; with a handful of
replicas, losing eight times in a row means something is badly wrong, not merely busy."""

Edit = Callable[[LeaseRecord | None], tuple[Claim, ...] | None]
"""Given the Lease as read (``None``: it does not exist), the claims it must hold, or ``None``
when no write is needed. It may raise to abandon the write."""


def _foreign(server: str, raw: dict[str, Any]) -> LeaseRecord:
    meta = raw.get("metadata") or {}
    return LeaseRecord(
        name=lease_name(server),
        server=ServerName(server),
        resource_version=str(meta.get("resourceVersion", "")),
        claims=(),
        problem=f"Lease {lease_name(server)} exists but was not written by rgpu",
    )


class LeaseWriter:
    """Writes claims to Leases with compare-and-swap and keeps the ledger up to date."""

    __slots__ = ("_api", "_instruments", "_ledger", "_locks", "_on_freed")

    def __init__(
        self,
        api: KubeApi,
        ledger: Ledger,
        instruments: Instruments,
        *,
        on_freed: Callable[[], None],
    ) -> None:
        self._api = api
        self._ledger = ledger
        self._instruments = instruments
        self._on_freed = on_freed
        self._locks = KeyedLocks()

    async def reread(self, server: str) -> LeaseRecord | None:
        """Read ``server``'s Lease from the apiserver and bring the ledger up to date."""
        raw = await self._api.get_lease(lease_name(server))
        if raw is None:
            self._ledger.forget(server)
            return None
        record = decode_lease(raw) or _foreign(server, raw)
        self._ledger.apply(record)
        return record

    async def edit(self, server: str, change: Edit, *, op: str) -> LeaseRecord | None:
        """Apply ``change`` to ``server``'s Lease; returns the Lease as written (or as read
        when nothing needed writing).

        Raises ``LeaseUnreadable`` when the Lease holds claims we cannot read, ``Contended``
        after ``ATTEMPTS`` lost races, ``KubeUnavailable`` when the apiserver is away, and
        whatever ``change`` raises.
        """
        # Writes of one replica to one Lease go one at a time: racing ourselves only adds 409s.
        async with self._locks.hold(server):
            with tracer.start_as_current_span(
                "lease.write", attributes={"op": op, "server": server}
            ):
                return await self._edit(server, change, op)

    async def _edit(self, server: str, change: Edit, op: str) -> LeaseRecord | None:
        record = self._ledger.lease(server)
        for _ in range(ATTEMPTS):
            if record is not None and record.problem:
                raise LeaseUnreadable(f"Lease {record.name}: {record.problem}")
            claims = change(record)
            if claims is None:
                return record
            try:
                return self._took(await self._write(server, record, claims))
            except (KubeConflict, KubeNotFound):
                self._instruments.cas_conflicts.labels(op).inc()
                record = await self.reread(server)
        raise Contended(
            f"Lease {lease_name(server)} kept changing under {op}; another writer is busy, retry"
        )

    async def _write(
        self, server: str, record: LeaseRecord | None, claims: tuple[Claim, ...]
    ) -> dict[str, Any]:
        version = record.resource_version if record is not None else None
        body = encode_lease(
            server=server, namespace=self._api.namespace, claims=claims, resource_version=version
        )
        if record is None:
            try:
                return await self._api.create_lease(body)
            except KubeNotFound as exc:
                raise NamespaceMissing(
                    f"cannot store claims: namespace {self._api.namespace!r} does not exist; "
                    "create it or point RGPU_NAMESPACE at rgpu's namespace"
                ) from exc
        return await self._api.replace_lease(record.name, body)

    def _took(self, raw: dict[str, Any]) -> LeaseRecord | None:
        record = decode_lease(raw)
        # The watch will echo this write, but the ledger will have it already: capacity freed
        # by our own write is announced here or never.
        if record is not None and self._ledger.apply(record).freed:
            self._on_freed()
        return record
