"""Why this module exists: the scheduler emulator must judge node feasibility the way
kube-scheduler's default plugins do for the cases rgpu meets (readiness, cordons, taints,
nodeSelector) and must shape extender calls byte-for-byte like kube-scheduler."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["extender_pod", "feasible", "requests_any", "tolerates"]


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _toleration_matches(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return bool(
        toleration.get("key") == taint.get("key")
        and toleration.get("value", "") == taint.get("value", "")
    )


def tolerates(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """True when every NoSchedule/NoExecute taint of ``node`` is tolerated by ``pod``."""
    tolerations = pod.get("spec", {}).get("tolerations") or []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_toleration_matches(t, taint) for t in tolerations):
            return False
    return True


def _selector_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    labels = node.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def feasible(pod: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of nodes the default plugins would keep, sorted for determinism."""
    return sorted(
        n["metadata"]["name"]
        for n in nodes
        if _ready(n)
        and not n.get("spec", {}).get("unschedulable")
        and tolerates(pod, n)
        and _selector_matches(pod, n)
    )


def requests_any(pod: Mapping[str, Any], resources: Iterable[str]) -> bool:
    """Extender interest as kube-scheduler sees it: any container (init too) names a resource."""
    wanted = set(resources)
    spec = pod.get("spec", {})
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        res = container.get("resources") or {}
        asked = set(res.get("limits") or {}) | set(res.get("requests") or {})
        if asked & wanted:
            return True
    return False


def extender_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as kube-scheduler serialises it for an extender: no kind/apiVersion/managedFields."""
    shaped = {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}
    metadata = dict(shaped.get("metadata") or {})
    metadata.pop("managedFields", None)
    shaped["metadata"] = metadata
    return shaped
