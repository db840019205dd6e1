"""The server-policies mode's writes, each ending in one outcome instead of an exception: a
pass runs many at once and one failing must not stop the others. Their outcomes, and the
passes, are counted here too (``PolicyMetrics``).

A write that loses a race (someone wrote or deleted the policy since we last heard) is a
failure, not an error: its watch event is on its way and wakes the next pass, which decides on
what is there then. Anything else the apiserver says is logged once, here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from rgpu_runtime.errors import KubeConflict, KubeError, KubeNotFound

from .lupine_pods import LupineApi
from .policy_objects import NODE_LABEL, PolicyRecord, read_policy

__all__ = ["ACTIONS", "PolicyMetrics", "PolicyWriter", "Write"]

logger = logging.getLogger(__name__)

ACTIONS: Final = ("create", "update", "delete", "label")

Write = Callable[[], Awaitable[tuple[str, bool]]]
"""One write of a pass; says what it was (an ``ACTIONS`` entry) and whether it went through."""


class PolicyWriter:
    """Writes policies and node labels; tells ``written`` what the apiserver stored and
    ``deleted`` what it removed."""

    def __init__(
        self,
        api: LupineApi,
        *,
        written: Callable[[PolicyRecord], None],
        deleted: Callable[[str], None],
    ) -> None:
        self._api = api
        self._written = written
        self._deleted = deleted

    async def put(
        self, name: str, body: Mapping[str, Any], known: PolicyRecord | None
    ) -> tuple[str, bool]:
        """Create the policy, or replace ``known`` (compare-and-swap on its version)."""
        action = "create" if known is None else "update"
        try:
            if known is None:
                reply = await self._api.create_policy(body)
            else:
                meta = {**body["metadata"], "resourceVersion": known.resource_version}
                reply = await self._api.replace_policy(name, {**body, "metadata": meta})
        except KubeConflict:
            return action, False
        except KubeNotFound as exc:
            if known is None:  # no policy to create it in: the namespace is missing
                logger.warning(
                    "server policy %s: cannot create it in namespace %s: %s",
                    name,
                    self._api.namespace,
                    exc,
                )
            return action, False
        except KubeError as exc:
            logger.warning("server policy %s: %s failed: %s", name, action, exc)
            return action, False
        record = read_policy(reply)
        if record is not None:
            self._written(record)
        return action, True

    async def delete(self, name: str) -> tuple[str, bool]:
        try:
            await self._api.delete_policy(name)
        except KubeError as exc:
            logger.warning("server policy %s: delete failed: %s", name, exc)
            return "delete", False
        self._deleted(name)
        return "delete", True

    async def label(self, pod: str, node_label: str) -> tuple[str, bool]:
        """Give lupine pod ``pod`` its node label; a pod gone meanwhile needs none."""
        try:
            await self._api.label_pod(pod, {NODE_LABEL: node_label})
        except KubeNotFound:
            return "label", True
        except KubeError as exc:
            logger.warning("lupine pod %s: labelling failed: %s", pod, exc)
            return "label", False
        return "label", True


class PolicyMetrics:
    """What the server-policies mode exports: its writes by action and outcome, its passes,
    and the servers whose policy the last pass could not put in place."""

    __slots__ = ("_passes", "_pending", "_writes")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._writes = Counter(
            "rgpu_allocator_server_policy_writes",
            "Writes keeping one NetworkPolicy per server (RGPU_SERVER_POLICIES=on), by action "
            "(create, update, delete, label: a lupine pod given its node label) and outcome "
            "(ok, failed).",
            ["action", "outcome"],
            registry=registry,
        )
        for action in ACTIONS:
            for outcome in ("ok", "failed"):
                self._writes.labels(action, outcome)
        self._passes = Counter(
            "rgpu_allocator_server_policy_passes",
            "Passes over every server's NetworkPolicy made by the elected replica (at least "
            "one per RECONCILE_SECONDS while it leads).",
            registry=registry,
        )
        self._pending = Gauge(
            "rgpu_allocator_server_policies_pending",
            "Servers whose NetworkPolicy did not say what it should after the last pass "
            "(writes failed); 0 when every policy is in place.",
            registry=registry,
        )

    def wrote(self, action: str, ok: bool) -> None:
        """One write of a pass ended."""
        self._writes.labels(action, "ok" if ok else "failed").inc()

    def passed(self, failures: int) -> None:
        """A pass ended with ``failures`` writes that did not go through."""
        self._pending.set(failures)
        self._passes.inc()
