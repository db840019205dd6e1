"""Watch events say *that* something about a pod's claims may need
doing (its pod was deleted, finished, got bound; its Lease vanished; it holds two claims),
but writing to the apiserver from inside a watch loop would stall every event behind one
slow call. So watches only enqueue the pod uid, and this worker brings that pod's claims in
line with the rules, one pod at a time, each decided again on fresh Lease reads.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts import Claim, ClaimState, NodeName, PodUID
from rgpu_placement import Validity, winner
from rgpu_runtime import KubeError, RgpuError

from .core import Core
from .leases import LeaseRecord
from .pods import PodInfo
from .repairing import Repairer
from .settling import drop_invalid, settle

__all__ = ["Reconciler", "mark_bound"]

logger = logging.getLogger(__name__)

QUEUED = 100_000
"""Pods waiting for reconciliation; a mass deletion beyond that is finished by the sweep."""


async def mark_bound(core: Core, server: str, uid: str, node: str) -> None:
    """Record on the Lease that ``uid`` is bound to ``node`` (for ``kubectl`` and metrics)."""

    def change(record: LeaseRecord | None) -> tuple[Claim, ...] | None:
        claim = record.claim_of(uid) if record is not None else None
        if record is None or claim is None or claim.state is ClaimState.BOUND:
            return None
        bound = dataclasses.replace(claim, state=ClaimState.BOUND, node=NodeName(node))
        return (*record.without(uid), bound)

    await core.writer.edit(server, change, op="bind")


class Reconciler:
    """A queue of pod uids whose claims need a look, and the worker that looks."""

    __slots__ = ("_core", "_pending", "_repairer", "_wake")

    def __init__(self, core: Core, repairer: Repairer) -> None:
        self._core = core
        self._repairer = repairer
        self._pending: OrderedDict[PodUID, None] = OrderedDict()
        self._wake: anyio.Event | None = None

    def enqueue(self, uid: str) -> None:
        """Ask for ``uid``'s claims to be looked at; callable from synchronous code."""
        if len(self._pending) < QUEUED:
            self._pending[PodUID(uid)] = None
        if self._wake is not None:
            self._wake.set()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """Route a pod watch change: claims to drop, mark bound, or repair; refusals to forget."""
        core = self._core
        if after is None:
            if before is not None:
                core.refused.forget(before.uid)
                if core.ledger.servers_of(before.uid):
                    self.enqueue(before.uid)
            return
        if after.bound or after.finished:
            core.refused.forget(after.uid)
        held = core.ledger.servers_of(after.uid)
        newly_bound = after.bound and not (before is not None and before.bound)
        if (held and (after.finished or newly_bound)) or (
            not held and self._repairer.needed(after)
        ):
            self.enqueue(after.uid)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Work through the queue forever."""
        task_status.started()
        while True:
            if not self._pending:
                self._wake = anyio.Event()
                await self._wake.wait()
            uid, _ = self._pending.popitem(last=False)
            try:
                await self.reconcile(uid)
            except RgpuError as exc:
                # The periodic sweep looks at every claim again; nothing is lost by moving on.
                logger.warning("could not reconcile pod uid %s: %s", uid, exc)

    async def reconcile(self, uid: str) -> None:
        """Drop ``uid``'s invalid claims, settle duplicates, mark bound, repair if missing."""
        core = self._core
        for claim in core.ledger.claims_of(uid):
            if core.validity(claim) is Validity.INVALID:
                await drop_invalid(core, claim.server)
        if core.ledger.servers_of(uid) > 1:
            await settle(core, uid)
        pod = core.pods.get(uid)
        if pod is None:
            return
        kept = winner(core.live(uid))
        if kept is not None and pod.node_name and kept.state is not ClaimState.BOUND:
            await mark_bound(core, kept.server, uid, pod.node_name)
        elif kept is None and self._repairer.needed(pod):
            await self._repair(uid)

    async def _repair(self, uid: str) -> None:
        pod = self._core.pods.get(uid)
        if pod is not None:
            try:
                await self._repairer.repair(pod)
            except KubeError as exc:
                logger.warning("could not repair the claim of %s: %s", pod.ref.key, exc)
