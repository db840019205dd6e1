"""The requests the simulated apiserver refused as Forbidden, kept for whoever judges a run.

A client usually survives a 403 (logs it, retries, degrades), so a grant missing from a
deployment's RBAC shows nowhere unless someone looks: tests, the demo and the soak read
``SimApiServer.refusals`` to prove that every request of rgpu's own accounts was allowed.
Bounded: the newest ``limit`` are kept, and ``total`` counts them all.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """One refused request: who asked for what, and kube's message."""

    user: str
    verb: str
    resource: str
    """``pods``, ``pods/status``, ``leases.coordination.k8s.io``, or a non-resource path."""
    namespace: str
    name: str
    message: str

    def describe(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        named = f" {self.name}" if self.name else ""
        return f"{self.user} {self.verb} {self.resource}{named}{where}"


class Refusals:
    """The newest refusals, oldest first."""

    def __init__(self, limit: int = 10_000) -> None:
        self._items: deque[Refusal] = deque(maxlen=limit)
        self.total = 0

    def add(self, refusal: Refusal) -> None:
        self._items.append(refusal)
        self.total += 1

    def snapshot(self) -> tuple[Refusal, ...]:
        return tuple(self._items)

    def of(self, user_prefix: str) -> tuple[Refusal, ...]:
        """The kept refusals of users whose name starts with ``user_prefix``."""
        return tuple(r for r in self._items if r.user.startswith(user_prefix))
