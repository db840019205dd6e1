"""Replicas that divide work among themselves (discovery's probing) must agree on who is alive
and who owns what, without a leader and without talking to each other: the apiserver is the
only thing they all see.

Each member holds one Lease in the system namespace, labelled with its group, and renews it
every ``renew_seconds``. Every member watches the group's Leases; a Lease not renewed for
``lease_seconds`` (judged on this process's own clock, from when the renewal was *seen*, so
clock skew between hosts does not matter) belongs to a dead member — but only if this member
saw its own renewals come back meanwhile: one that hears nothing (a starved loop, a broken
watch) cannot tell a death from its own deafness, and keeps the ring as it is. A member that
stops cleanly deletes its Lease, so the others take its work over at once instead of after the
Lease runs out.

Work is assigned with a consistent-hash ring over the live members (``HashRing``): every
member computes the same ring from the same member set, so each key has exactly one owner,
and a member joining or leaving moves only about ``1/members`` of the keys. Leases of members
dead for a long time (a Deployment's pods get new names on every rollout) are deleted by the
first live member in name order, with a resourceVersion precondition so a Lease renewed
meanwhile survives.

A member that cannot write its Lease (no system namespace, no RBAC) does not take part: it
blocks the service's readiness while joining fails, and while renewals fail for longer than
the lease (by then the others count it dead, and its ring is no longer theirs).
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts import prefixed_name
from rgpu_runtime.errors import KubeConflict, KubeError, KubeNotFound
from rgpu_runtime.feeds import Versioned
from rgpu_runtime.kube import (
    KubeClient,
    Listing,
    ObjectChange,
    Reflector,
    ReflectorTiming,
    WatchEvent,
    kube_pages,
)
from rgpu_runtime.serving import Readiness, Standing

__all__ = ["HashRing", "Membership", "MembershipTiming", "member_lease_name"]

logger = logging.getLogger(__name__)

GROUP_LABEL = "rgpu.io/membership"
"""The label naming a Lease's group; its value is the group (``discovery``)."""
_POINTS = 64
"""Points per member on the ring: enough that three members split keys within a few
percent of a third each, few enough that building a ring costs microseconds."""


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring over ``members``: each key maps to one member.

    Every process that builds a ring from the same member names gets the same owners; adding
    or removing a member moves only the keys on its arcs.
    """

    __slots__ = ("_owners", "_points", "members")

    def __init__(self, members: Iterable[str], *, points: int = _POINTS) -> None:
        self.members = frozenset(members)
        ring = sorted((_point(f"{m}#{i}"), m) for m in self.members for i in range(points))
        self._points = tuple(p for p, _ in ring)
        self._owners = tuple(m for _, m in ring)

    def owner(self, key: str) -> str | None:
        """The member owning ``key``; ``None`` when the ring is empty."""
        if not self._points:
            return None
        index = bisect.bisect(self._points, _point(key)) % len(self._points)
        return self._owners[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashRing) and other.members == self.members

    def __hash__(self) -> int:
        return hash(self.members)

    def __repr__(self) -> str:
        return f"HashRing({sorted(self.members)!r})"


def member_lease_name(group: str, identity: str) -> str:
    """The Lease of member ``identity`` of ``group``: ``<group>-member-<identity>``, or a
    readable prefix plus a hash of the identity when that would exceed 63 characters."""
    return prefixed_name(f"{group}-member-", identity)


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipTiming:
    """How often a member renews its Lease and how long silence means death."""

    lease_seconds: float = 10.0
    """A member whose Lease was not renewed for this long is dead, and its work moves."""
    renew_seconds: float = 3.0
    """How often a member renews; a third of the lease, so two missed renewals are survived."""
    forget_after: float = 10.0
    """A dead member's Lease is deleted once dead for this many lease periods."""

    def __post_init__(self) -> None:
        if not 0 < self.renew_seconds < self.lease_seconds or self.forget_after < 1:
            raise ValueError(
                f"MembershipTiming needs 0 < renew_seconds < lease_seconds, got {self}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Member:
    identity: str
    name: str
    version: str
    seen_at: float
    """``clock()`` when this version was first seen (its age estimated on a list)."""


def _missing(exc: KubeError) -> bool:
    return isinstance(exc, KubeNotFound)


def _micro_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Membership:
    """This process's membership of ``group``, and the ring of the live members.

    ``ring`` is republished whenever the live member set changes; ``owns(key)`` says whether
    this member owns ``key`` now. This member counts itself alive from the moment ``run``
    has written its Lease until ``run`` stops.
    """

    def __init__(
        self,
        *,
        kube: KubeClient,
        namespace: str,
        group: str,
        identity: str,
        timing: MembershipTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        readiness: Readiness | None = None,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._group = group
        self.identity = identity
        self.lease = member_lease_name(group, identity)
        self._timing = timing or MembershipTiming()
        self._clock = clock
        self._wall = wall_clock
        self._standing = Standing(readiness, f"membership {namespace}/{self.lease}", clock)
        self._members: dict[str, _Member] = {}
        self._own_version = ""
        # When our own renewals came back through the watch: the clock others are judged by.
        self._own_seen: deque[float] = deque(maxlen=self._witnesses() + 1)
        self.ring: Versioned[HashRing] = Versioned(HashRing((identity,)))
        """The ring over the live members; this member alone until the first list is in."""
        self.reflector = Reflector[_Member](
            name=f"{group} members",
            list_pages=self._pages,
            watch=self._watch,
            transform=self._member,
            on_change=self._changed,
            key=lambda obj: str((obj.get("metadata") or {}).get("name") or ""),
            timing=ReflectorTiming(stall_seconds=max(60.0, self._timing.lease_seconds)),
        )

    def owns(self, key: str) -> bool:
        """Whether this member owns ``key`` on the current ring."""
        return self.ring.value.owner(key) == self.identity

    def live(self) -> frozenset[str]:
        """The members alive now (this one included)."""
        now = self._clock()
        alive = {m.identity for m in self._members.values() if not self._dead(m, now)}
        return frozenset({*alive, self.identity})

    def _dead(self, member: _Member, now: float) -> bool:
        """Silent for the lease time, while our own renewals kept coming back meanwhile: a
        member that hears nothing (a starved loop, a broken watch, an apiserver refusing
        writes) cannot tell a death from its own deafness, and judges nobody dead."""
        if now - member.seen_at <= self._timing.lease_seconds:
            return False
        heard = sum(1 for at in self._own_seen if at > member.seen_at)
        return heard >= self._witnesses()

    def _witnesses(self) -> int:
        """Own renewals that must be seen after a member's last one before it counts as dead:
        half of those a lease period holds, at least one."""
        return max(1, int(self._timing.lease_seconds / self._timing.renew_seconds / 2))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the Lease and follow the group until cancelled; then delete the Lease.

        Started once the Lease is written and the group's Leases are listed; until then
        this member is alone on its ring, so it owns everything (work done twice, never
        left undone).
        """
        try:
            await self._join()
            async with anyio.create_task_group() as tg:
                await tg.start(self.reflector.run)
                self._judge()
                tg.start_soon(self._renewing)
                tg.start_soon(self._judging)
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._kube.timeout):
                await self._leave()

    async def _join(self) -> None:
        while True:
            try:
                await self._renew()
                self._written()
                return
            except KubeError as exc:
                logger.warning("joining %s: Lease %s not written: %s", self._group, self.lease, exc)
                self._unwritten(exc, patience=0.0)
                await anyio.sleep(self._timing.renew_seconds)

    async def _renewing(self) -> None:
        while True:
            await anyio.sleep(self._timing.renew_seconds)
            try:
                await self._renew()
                self._written()
            except KubeError as exc:
                # The others will count us dead if this lasts; nothing else to do but retry.
                logger.warning("renewing membership Lease %s failed: %s", self.lease, exc)
                self._unwritten(exc, patience=self._timing.lease_seconds)

    def _written(self) -> None:
        self._standing.succeeded()

    def _unwritten(self, exc: KubeError, *, patience: float) -> None:
        hint = f" (does the namespace {self._namespace} exist?)" if _missing(exc) else ""
        self._standing.failed(
            f"not a member of {self._group}: its Lease {self._namespace}/{self.lease} cannot be "
            f"written: {exc}{hint}",
            patience=patience,
        )

    async def _judging(self) -> None:
        while True:
            await anyio.sleep(self._timing.renew_seconds / 3)
            self._judge()
            await self._forget_dead()

    def _judge(self) -> None:
        ring = HashRing(self.live())
        if ring != self.ring.value:
            logger.info("%s members now %s", self._group, sorted(ring.members))
            self.ring.publish(ring)

    async def _renew(self) -> None:
        body = self._body()
        api = self._kube.coordination
        try:
            if self._own_version:
                body["metadata"]["resourceVersion"] = self._own_version
                raw = await self._kube.call_raw(
                    api.replace_namespaced_lease, self.lease, self._namespace, body
                )
            else:
                raw = await self._kube.call_raw(api.create_namespaced_lease, self._namespace, body)
        except (KubeConflict, KubeNotFound):
            raw = await self._take_over(body)
        self._own_version = str(raw["metadata"]["resourceVersion"])

    async def _take_over(self, body: dict[str, Any]) -> dict[str, Any]:
        """Our Lease exists with an unknown version (a restart under the same name), or
        vanished: write it unconditionally, it is ours."""
        api = self._kube.coordination
        body["metadata"].pop("resourceVersion", None)
        try:
            current = await self._kube.call_raw(
                api.read_namespaced_lease, self.lease, self._namespace
            )
        except KubeNotFound:
            return await self._kube.call_raw(api.create_namespaced_lease, self._namespace, body)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return await self._kube.call_raw(
            api.replace_namespaced_lease, self.lease, self._namespace, body
        )

    def _body(self) -> dict[str, Any]:
        now = _micro_time(self._wall())
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.lease,
                "namespace": self._namespace,
                "labels": {
                    GROUP_LABEL: self._group,
                    "app.kubernetes.io/managed-by": f"rgpu-{self._group}",
                },
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(self._timing.lease_seconds)),
                "renewTime": now,
            },
        }

    async def _leave(self) -> None:
        api = self._kube.coordination
        try:
            await self._kube.call_raw(api.delete_namespaced_lease, self.lease, self._namespace)
        except KubeError as exc:
            logger.info("leaving %s: Lease %s not deleted: %s", self._group, self.lease, exc)

    async def _forget_dead(self) -> None:
        if min(self.live()) != self.identity:
            return
        limit = self._timing.lease_seconds * self._timing.forget_after
        now = self._clock()
        gone = [
            m
            for m in self._members.values()
            if m.identity != self.identity and now - m.seen_at > limit and self._dead(m, now)
        ]
        for member in gone:
            await self._delete(member)

    async def _delete(self, member: _Member) -> None:
        api = self._kube.coordination
        body = {"preconditions": {"resourceVersion": member.version}}
        try:
            await self._kube.call_raw(
                api.delete_namespaced_lease, member.name, self._namespace, body=body
            )
            logger.info("deleted the Lease of %s, dead for long", member.identity)
        except KubeError as exc:
            logger.info("dead member %s's Lease not deleted: %s", member.identity, exc)

    def _pages(self) -> AsyncIterator[Listing]:
        api = self._kube.coordination
        selector = f"{GROUP_LABEL}={self._group}"
        return kube_pages(
            self._kube, api.list_namespaced_lease, self._namespace, label_selector=selector
        )

    def _watch(self, version: str) -> AsyncIterator[WatchEvent]:
        api = self._kube.coordination
        return self._kube.watch(
            api.list_namespaced_lease,
            self._namespace,
            resource_version=version,
            label_selector=f"{GROUP_LABEL}={self._group}",
        )

    def _member(self, obj: dict[str, Any]) -> _Member | None:
        metadata: Mapping[str, Any] = obj.get("metadata") or {}
        spec: Mapping[str, Any] = obj.get("spec") or {}
        identity = spec.get("holderIdentity")
        if not isinstance(identity, str) or not identity:
            return None
        version = str(metadata.get("resourceVersion") or "")
        known = self._members.get(str(metadata.get("name") or ""))
        if known is not None and known.version == version:
            return known
        renewed = _parse_time(spec.get("renewTime"))
        # A Lease seen for the first time may be old: date it by its renewTime, never later
        # than now; a renewal seen live is dated now, whatever the writer's clock says.
        age = 0.0 if known is not None or renewed is None else max(0.0, self._wall() - renewed)
        return _Member(
            identity=identity,
            name=str(metadata.get("name") or ""),
            version=version,
            seen_at=self._clock() - age,
        )

    def _changed(self, change: ObjectChange[_Member]) -> None:
        if change.after is None:
            if change.before is not None:
                self._members.pop(change.before.name, None)
        else:
            self._members[change.after.name] = change.after
            if change.after.identity == self.identity:
                self._own_seen.append(self._clock())
        self._judge()
