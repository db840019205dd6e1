"""Some work must be done by one replica of a service, not by each: the allocator's sweeps and
nudges are apiserver writes that would grow with the replica count, and the metrics service's
card series would reach Prometheus once per replica. So replicas elect one of them through a
``coordination.k8s.io/v1`` Lease in the system namespace, the way Kubernetes' own controllers
do (client-go's ``leaderelection``):

* The holder renews ``spec.renewTime`` every ``retry_seconds`` with a compare-and-swap on the
  Lease's ``resourceVersion``; a write that loses the race (``409``) changes nothing.
* The others read the Lease every ``retry_seconds``. A holder is presumed alive while its
  record keeps changing: the others time ``leaseDurationSeconds`` from the moment *they* last
  saw the record change, on their own clock, never from the holder's ``renewTime`` (clocks
  of two nodes need not agree). Once that passes without a change, any of them may take the
  Lease (again by compare-and-swap, so one wins) and ``leaseTransitions`` counts the handover.
* A holder that cannot renew for ``renew_deadline_seconds`` (shorter than the lease) steps
  down on its own clock before anyone else may take over, so two replicas never both believe
  they lead for longer than the clocks' drift.
* A holder that stops (shutdown) releases the Lease: an empty ``holderIdentity`` with a
  one-second duration, which the next reader takes at once instead of waiting out the lease.

``Election.step`` is one try, driven by the injected clock, so tests move time by hand;
``Election.run`` repeats it in the lifespan's task group and releases on the way out.

A replica that cannot even ask (every try fails: no system namespace, no RBAC, no apiserver)
blocks the service's readiness while it fails — at once before its first success, after the
renew deadline later — so ``/readyz`` says why instead of reporting ready while the work it
would lead goes undone.
"""

from __future__ import annotations

import logging
import math
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Counter, Gauge

from rgpu_runtime.errors import KubeConflict, KubeError, KubeNotFound, SettingsError
from rgpu_runtime.kube import KubeClient
from rgpu_runtime.serving import Readiness, Standing

__all__ = ["Election", "ElectionTiming", "LeaseRecord", "replica_identity"]

logger = logging.getLogger(__name__)

RELEASE_SECONDS = 5.0
"""How long a stopping holder tries to release; past that the lease simply expires."""


def replica_identity() -> str:
    """A name unique to this process: the pod's hostname plus a random suffix, so a
    restarted container (same hostname) never mistakes the old holder's record for its own."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ElectionTiming:
    """How long a lease lasts and how often it is tried; client-go's defaults."""

    lease_seconds: float = 15.0
    """How long the others wait, after the record last changed, before taking the lease."""
    renew_deadline_seconds: float = 10.0
    """How long a holder keeps leading without a successful renewal; below the lease."""
    retry_seconds: float = 2.0
    """How often every replica tries (the holder renews, the others read)."""

    def __post_init__(self) -> None:
        if not self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise SettingsError(
                f"election timing needs retry ({self.retry_seconds}s) < renew deadline "
                f"({self.renew_deadline_seconds}s) < lease ({self.lease_seconds}s), so a "
                "holder steps down before anyone may take over"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """What an election reads from the Lease's spec, plus the version it was read at."""

    holder: str
    duration: float
    transitions: int
    acquired: str
    version: str

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration=float(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            acquired=str(spec.get("acquireTime") or ""),
            version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )


def _micro_time(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Instruments:
    """This replica's view of the election, for its own self-metrics."""

    __slots__ = ("leading", "transitions")

    def __init__(self, registry: CollectorRegistry | None, lease: str) -> None:
        self.leading: Gauge | None = None
        self.transitions: Counter | None = None
        if registry is not None:
            self.leading = Gauge(
                "rgpu_leader",
                "1 while this replica holds the election lease, else 0.",
                ("lease",),
                registry=registry,
            )
            self.transitions = Counter(
                "rgpu_leader_transitions",
                "Times this replica started or stopped leading.",
                ("lease",),
                registry=registry,
            )
            self.leading.labels(lease).set(0)

    def changed(self, lease: str, leading: bool) -> None:
        if self.leading is not None and self.transitions is not None:
            self.leading.labels(lease).set(1 if leading else 0)
            self.transitions.labels(lease).inc()


class Election:
    """One replica's part in electing the holder of the Lease ``name``."""

    __slots__ = (
        "_changed",
        "_clock",
        "_instruments",
        "_kube",
        "_leading",
        "_listeners",
        "_observed",
        "_observed_at",
        "_renewed_at",
        "_standing",
        "_succeeded",
        "identity",
        "name",
        "namespace",
        "timing",
    )

    def __init__(
        self,
        kube: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self._kube = kube
        self._succeeded = False
        self.name = name
        self.namespace = namespace
        self.identity = identity or replica_identity()
        self.timing = timing or ElectionTiming()
        self._clock = clock
        self._standing = Standing(readiness, f"election {namespace}/{name}", clock)
        self._instruments = _Instruments(registry, name)
        self._leading = False
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._changed: anyio.Event | None = None
        self._listeners: list[Callable[[bool], None]] = []

    @property
    def is_leader(self) -> bool:
        """Whether this replica holds the Lease as of its last try."""
        return self._leading

    @property
    def holder(self) -> str:
        """The holder last seen on the Lease (empty when none or unknown)."""
        return self._observed.holder if self._observed is not None else ""

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(leading)`` (synchronously) whenever this replica starts or stops
        leading."""
        self._listeners.append(listener)

    async def until_leading(self) -> None:
        """Return once this replica leads (at once if it does)."""
        while not self._leading:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    async def step(self) -> bool:
        """One try to take or renew the Lease; returns whether this replica leads now.

        Raises ``KubeError`` when the apiserver could not be asked; a holder that has not
        renewed for the renew deadline has stepped down by then.
        """
        now = self._clock()
        try:
            leading = await self._try(now)
        except KubeConflict:
            # Lost a compare-and-swap race: a holder keeps leading until its renew deadline.
            leading = self._leading and now - self._renewed_at < self.timing.renew_deadline_seconds
        except KubeError:
            if self._leading and now - self._renewed_at >= self.timing.renew_deadline_seconds:
                self._set(False)
            raise
        self._set(leading)
        return leading

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Try every ``retry_seconds`` until cancelled, then release the Lease if held.

        The first try happens before ``started``, so a lone replica leads by the time its
        lifespan reports ready.
        """
        try:
            await self._attempt()
            task_status.started()
            while True:
                await anyio.sleep(self.timing.retry_seconds)
                await self._attempt()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_SECONDS):
                await self.release()

    async def release(self) -> None:
        """Give the Lease up (if held) so another replica takes it at once."""
        observed, was_leading = self._observed, self._leading
        self._set(False)
        if not was_leading or observed is None or observed.holder != self.identity:
            return
        now = self._clock()
        spec = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": observed.transitions,
        }
        try:
            await self._replace(spec, observed.version)
        except KubeError as exc:
            logger.warning("could not release the %s lease (it will expire): %s", self.name, exc)

    async def _attempt(self) -> None:
        try:
            await self.step()
        except KubeError as exc:
            logger.warning("election for the %s lease: %s", self.name, exc)
            self._failed(exc)
        else:
            self._succeeded = True
            self._standing.succeeded()

    def _failed(self, exc: KubeError) -> None:
        missing = isinstance(exc, KubeNotFound)
        hint = f" (does the namespace {self.namespace} exist?)" if missing else ""
        # Before its first success a replica has not taken part at all: no patience then.
        patience = self.timing.renew_deadline_seconds if self._succeeded else 0.0
        self._standing.failed(
            f"cannot take part in the election of Lease {self.namespace}/{self.name}: {exc}{hint}",
            patience=patience,
        )

    async def _try(self, now: float) -> bool:
        try:
            lease = await self._kube.call_raw(
                self._kube.coordination.read_namespaced_lease, self.name, self.namespace
            )
        except KubeNotFound:
            return await self._create(now)
        record = LeaseRecord.from_lease(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        held = bool(record.holder) and record.holder != self.identity
        # Held by another: it is alive while its record keeps changing under our eyes.
        if held and now < self._observed_at + record.duration:
            return False
        return await self._take(record, now)

    async def _take(self, record: LeaseRecord, now: float) -> bool:
        ours = record.holder == self.identity
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.timing.lease_seconds),
            "acquireTime": record.acquired if ours and record.acquired else _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": record.transitions + (0 if ours or not record.holder else 1),
        }
        self._remember(await self._replace(spec, record.version), now)
        return True

    async def _create(self, now: float) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": math.ceil(self.timing.lease_seconds),
                "acquireTime": _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": 0,
            },
        }
        # A 409 here means another replica created it first: read it on the next try.
        written = await self._kube.call_raw(
            self._kube.coordination.create_namespaced_lease, self.namespace, body
        )
        self._remember(written, now)
        return True

    async def _replace(self, spec: Mapping[str, Any], version: str) -> dict[str, Any]:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": version,
            },
            "spec": dict(spec),
        }
        return await self._kube.call_raw(
            self._kube.coordination.replace_namespaced_lease, self.name, self.namespace, body
        )

    def _remember(self, written: Mapping[str, Any], now: float) -> None:
        self._observed, self._observed_at = LeaseRecord.from_lease(written), now
        self._renewed_at = now

    def _set(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        logger.info(
            "%s the %s lease as %s",
            "holding" if leading else "no longer holding",
            self.name,
            self.identity,
        )
        self._instruments.changed(self.name, leading)
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        for listener in tuple(self._listeners):
            listener(leading)
