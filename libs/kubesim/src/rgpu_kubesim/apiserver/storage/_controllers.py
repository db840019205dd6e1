"""The controllers kube runs beside its apiserver that the simulator runs inside storage.

A namespace's deletion (empty it, finalize it, release it) and a PodDisruptionBudget's status
(how many of its pods are healthy, how many may be disrupted) are the namespace and disruption
controllers' work in kube. Here they run at once, inside the write that calls for them, so a
client never sees the cluster between a write and its consequence; they write back through the
storage's own commit, as any other writer does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rgpu_kubesim.apiserver.kinds import disruption as _disruption
from rgpu_kubesim.apiserver.kinds import namespaces as _namespaces
from rgpu_kubesim.apiserver.storage._tables import Tables
from rgpu_kubesim.apiserver.storage._watching import DELETED, MODIFIED
from rgpu_kubesim.machinery import RESOURCES, Entry, LabelSelector, Resource, require, timestamp
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]

_UNDELETABLE_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
_NAMESPACES = require("namespaces")
_PODS = require("pods")
_BUDGETS = require("poddisruptionbudgets")


class Commit(Protocol):
    """The storage's commit: store ``obj`` as ``kind`` of change (with ``dry_run``: do not)."""

    def __call__(
        self,
        resource: Resource,
        kind: str,
        obj: JsonObj,
        prev: Entry | None,
        *,
        dry_run: bool = False,
    ) -> Entry: ...


class NamespaceController:
    """Terminates deleted namespaces: empties them at once, releases them when finalized."""

    def __init__(self, tables: Tables, commit: Commit, clock: Callable[[], float]) -> None:
        self._tables = tables
        self._commit = commit
        self._clock = clock
        self._terminating: set[str] = set()

    def terminate(self, current: Entry, *, dry_run: bool) -> Entry:
        name = current.name
        if name in _UNDELETABLE_NAMESPACES:
            message = f'namespaces "{name}" is forbidden: this namespace may not be deleted'
            raise _status.failure(403, message, details={"name": name, "kind": "namespaces"})
        if _namespaces.is_terminating(current):
            raise _namespaces.already_terminating(_NAMESPACES, name)
        body = _namespaces.terminating(current.decode(), timestamp(self._clock()))
        entry = self._commit(_NAMESPACES, MODIFIED, body, current, dry_run=dry_run)
        if not dry_run:
            self._delete_contents(name)
            self._terminating.add(name)
        return entry

    def finalize(self) -> None:
        """The namespace controller's pass: empty, finalize and release terminating namespaces."""
        for name in sorted(self._terminating):
            self._terminating.discard(name)
            current = self._tables.find(_NAMESPACES, "", name)
            if current is None:
                continue
            self._delete_contents(name)
            body = _namespaces.finalized(current.decode())
            if body != current.decode():
                current = self._commit(_NAMESPACES, MODIFIED, body, current)
            if _namespaces.releasable(body):
                self._commit(_NAMESPACES, DELETED, current.decode(), current)

    def _delete_contents(self, namespace: str) -> None:
        for resource in RESOURCES:
            if resource.namespaced:
                # Each entry is read as the deletes before it left it (a budget's status moves).
                for key in self._tables.keys_in(resource, namespace):
                    entry = self._tables.at(resource, key)
                    self._commit(resource, DELETED, entry.decode(), entry)


class DisruptionController:
    """Keeps every PodDisruptionBudget's status true to the pods it covers, write by write."""

    def __init__(self, tables: Tables, commit: Commit, clock: Callable[[], float]) -> None:
        self._tables = tables
        self._commit = commit
        self._clock = clock
        self._syncing = False

    def written(self, resource: Resource, entry: Entry, prev: Entry | None) -> None:
        """After a write of ``entry``: resync the budgets it may change."""
        if resource in (_PODS, _BUDGETS) and self._tables.has_any(_BUDGETS):
            self._sync(entry.namespace, None if resource is _BUDGETS else (entry, prev))

    def _sync(self, namespace: str, pod: tuple[Entry, Entry | None] | None) -> None:
        """The disruption controller's pass, done at once after a write: over the budgets of
        the namespace that cover ``pod`` (before or after the write), or all of them after a
        budget's write. Like kube's controller it reads only the pods a budget selects, so a
        write costs the budget's live pods, not every pod the namespace ever had."""
        if self._syncing:
            return
        self._syncing = True
        try:
            for current in self._tables.in_namespace(_BUDGETS, namespace):
                budget = current.decode()
                chosen = _disruption.selector(budget)
                if pod is None or any(_disruption.covers(chosen, e.labels) for e in pod if e):
                    self._sync_budget(budget, chosen, current)
        finally:
            self._syncing = False

    def _sync_budget(self, budget: JsonObj, chosen: LabelSelector | None, current: Entry) -> None:
        entries = self._tables.in_namespace(_PODS, current.namespace)
        pods = [e.decode() for e in entries if _disruption.covers(chosen, e.labels) and _live(e)]
        status = _disruption.status(budget, pods, self._clock())
        if status != budget.get("status"):
            self._commit(_BUDGETS, MODIFIED, {**budget, "status": status}, current)


def _live(pod: Entry) -> bool:
    """Not finished: a finished pod counts toward no budget."""
    return pod.fields.get("status.phase") not in _disruption.TERMINAL
