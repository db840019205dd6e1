"""Every change to a claim is a read-modify-write of one server's Lease with compare-and-swap
on ``metadata.resourceVersion``, and that loop — including what to do when another replica
won — must be written once and be right.

An edit is a pure function from the Lease as last read to an ``Edited``: the claims the
Lease should hold (or ``None``: nothing to write), the value the caller wants back, and, only
when the edit is about it, the server's nomination (other writes carry it over unchanged).
The writer first trusts the cached copy (most writes then take one round trip); on ``409`` it
re-reads the Lease and asks the edit again, so the decision is always made on what the
apiserver holds.
A bounded number of attempts keeps a hot Lease from stalling a caller forever.

Reading belongs here too: a commit must find a booking even when another replica wrote it a
moment ago and the Lease watch has not delivered it yet (``Finder``). Writes to one Lease go
one at a time within a replica (``keyed_locks``); a booking in flight counts as held for the
replica's other decisions (``pending``).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry import trace

from rgpu_contracts import Claim, ServerName
from rgpu_placement import Nomination
from rgpu_runtime.errors import KubeConflict, KubeNotFound
from rgpu_runtime.pacing import KeyedLocks

from .claims import LeaseRecord, decode_lease, encode_lease, lease_name
from .clients import KubeApi
from .errors import ClaimNotFound, Contended, LeaseUnreadable, NamespaceMissing
from .instruments import Instruments
from .ledger import Ledger

__all__ = ["ATTEMPTS", "KEEP", "Edit", "Edited", "Finder", "Keep", "LeaseWriter"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

T = TypeVar("T")

ATTEMPTS = 8
"""Compare-and-swap rounds before giving up with a retryable error; with a handful of
replicas, losing eight times in a row means something is badly wrong, not merely busy."""

WATCH_GRACE = 0.5
"""Seconds to wait for the Lease watch to deliver another replica's booking before listing
the Leases: watch delivery takes milliseconds, a commit comes a whole scheduling cycle later."""
RELIST_INTERVAL = 1.0
"""At most one full Lease list per second for claims nobody has seen."""


class Keep(enum.Enum):
    """Leave the Lease's nomination as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True, slots=True)
class Edited(Generic[T]):
    """What an edit decided: the claims to write (``None``: write nothing), its result, and
    the nomination to store (``KEEP``: the one read; ``None``: none)."""

    claims: tuple[Claim, ...] | None
    value: T
    nomination: Nomination | Keep | None = KEEP


Edit = Callable[[LeaseRecord | None], Edited[T]]
"""Given the Lease as read (``None``: it does not exist), what to write and what to answer.
It may raise one of our errors to abandon the write (the caller's request fails with it)."""


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

    async def edit(self, server: str, change: Edit[T], *, op: str) -> T:
        """Apply ``change`` to ``server``'s Lease; returns the value of the edit that was
        written (or that decided nothing needed writing).

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

    async def _edit(self, server: str, change: Edit[T], op: str) -> T:
        record = self._ledger.by_server.get(server)
        for _ in range(ATTEMPTS):
            if record is not None and record.problem:
                raise LeaseUnreadable(f"Lease {record.name}: {record.problem}")
            edited = change(record)
            if edited.claims is None:
                return edited.value
            try:
                self._took(await self._write(server, record, edited))
            except (KubeConflict, KubeNotFound):
                self._instruments.cas_conflicts.labels(op).inc()
                record = await self.reread(server)
            else:
                return edited.value
        raise Contended(
            f"Lease {lease_name(server)} kept changing under {op}; another writer is busy, retry"
        )

    async def _write(
        self, server: str, record: LeaseRecord | None, edited: Edited[Any]
    ) -> dict[str, Any]:
        version = record.resource_version if record is not None else None
        kept = record.nomination if record is not None else None
        body = encode_lease(
            server=server,
            namespace=self._api.namespace,
            claims=edited.claims or (),
            resource_version=version,
            nomination=kept if edited.nomination is KEEP else edited.nomination,
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

    def _took(self, raw: dict[str, Any]) -> None:
        record = decode_lease(raw)
        # The watch will echo this write, but the ledger will have it already: capacity freed
        # by our own write is announced here or never.
        if record is not None and self._ledger.apply(record).freed:
            self._on_freed()


class Finder:
    """Finds a pod's claims, waiting briefly for the watch and then listing if need be."""

    __slots__ = ("_api", "_ledger", "_listed", "_monotonic")

    def __init__(
        self, api: KubeApi, ledger: Ledger, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._api = api
        self._ledger = ledger
        self._monotonic = monotonic
        self._listed = -RELIST_INTERVAL

    async def claims(self, uid: str) -> tuple[Claim, ...]:
        """``uid``'s claims; raises ``ClaimNotFound`` when none exist even after a fresh list."""
        ledger = self._ledger
        deadline = self._monotonic() + WATCH_GRACE
        while not ledger.claims_of(uid) and (left := deadline - self._monotonic()) > 0:
            await ledger.wait_newer(ledger.revision, left)
        if not ledger.claims_of(uid) and self._monotonic() - self._listed >= RELIST_INTERVAL:
            await self._relist()
        found = ledger.claims_of(uid)
        if not found:
            raise ClaimNotFound(f"no claim for pod uid {uid}; book it first (POST /v1/allocations)")
        return found

    async def _relist(self) -> None:
        self._listed = self._monotonic()
        listing = await self._api.list_leases()
        for raw in listing.items:
            record = decode_lease(raw)
            if record is not None:
                self._ledger.apply(record)
