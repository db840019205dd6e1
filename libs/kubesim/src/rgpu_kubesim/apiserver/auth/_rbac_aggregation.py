"""ClusterRole aggregation, as kube-controller-manager's clusterrole-aggregation controller does it.

A ClusterRole with an ``aggregationRule`` keeps no rules of its own: its ``rules`` are the union,
in role-name order and without repeats, of the rules of every other ClusterRole one of its
selectors matches, rewritten whenever a ClusterRole changes. kube's ``admin``, ``edit`` and
``view`` are built so (``view`` carries the label ``edit`` selects, ``edit`` the one ``admin``
selects), and a cluster extends them by labelling a ClusterRole
``rbac.authorization.k8s.io/aggregate-to-edit: "true"``. The simulator rewrites them as the
write that changes a role commits, so an aggregated grant is in force with that write.
"""

from __future__ import annotations

from typing import Any

from rgpu_kubesim.apiserver.storage import Change, Storage
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Entry, LabelSelector, labels_match, require, selector_from_object

_CLUSTER_ROLES = require("clusterroles")
_MAX_PASSES = 8
"""Aggregated roles may select aggregated roles (admin selects edit, which selects view): each
pass settles one more level, and kube's own nesting is two deep."""


class Aggregator:
    """Keeps every aggregated ClusterRole's rules equal to those of the roles it selects."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._busy = False
        storage.observe(_CLUSTER_ROLES.plural, self._changed)

    def _changed(self, change: Change) -> None:
        if self._busy:
            return  # the rewrites below: the pass that made them goes on
        self._busy = True
        try:
            self.reconcile()
        finally:
            self._busy = False

    def reconcile(self) -> None:
        for _ in range(_MAX_PASSES):
            entries = sorted(self._storage.entries(_CLUSTER_ROLES), key=lambda e: e.name)
            if not any(self._rewrite(entry, entries) for entry in entries):
                return

    def _rewrite(self, entry: Entry, entries: list[Entry]) -> bool:
        role = entry.decode()
        selectors = _selectors(role.get("aggregationRule"))
        if selectors is None:
            return False
        rules: list[Any] = []
        for other in entries:
            if other.name != entry.name and any(labels_match(s, other.labels) for s in selectors):
                rules += [r for r in other.decode().get("rules") or () if r not in rules]
        if role.get("rules") == rules:
            return False
        role["rules"] = rules
        self._storage.update(_CLUSTER_ROLES, "", entry.name, role)
        return True


def _selectors(rule: object) -> list[LabelSelector] | None:
    if not isinstance(rule, dict):
        return None
    raw = rule.get("clusterRoleSelectors") or []
    try:
        return [selector_from_object(s) for s in raw if isinstance(s, dict)]
    except ApiError:
        return []  # refused when written; nothing selected if one slipped in
