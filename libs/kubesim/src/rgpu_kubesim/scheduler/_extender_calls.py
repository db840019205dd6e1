"""kube-scheduler's side of the extender protocol: the pod as it serialises it, and the
ExtenderFilterResult and HostPriorityList read as strictly as it reads them, so an extender
answer kube-scheduler would refuse is refused here too. Pure functions, tested without a
server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ExtenderError", "extender_pod", "parse_filter", "parse_scores"]

Json = Mapping[str, Any]

_EXTENDER_SCORE_SCALE = 10
"""MaxNodeScore (100) / MaxExtenderPriority (10): how kube-scheduler scales extender scores."""


def extender_pod(pod: Json) -> dict[str, Any]:
    """The pod as kube-scheduler serialises it for an extender.

    The informer cache holds typed objects without TypeMeta, so ``kind``/``apiVersion`` are
    absent, and kube-scheduler's informer transform strips ``metadata.managedFields``.
    """
    shaped = {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}
    metadata = dict(shaped.get("metadata") or {})
    metadata.pop("managedFields", None)
    shaped["metadata"] = metadata
    return shaped


class ExtenderError(Exception):
    """An extender call failed the way kube-scheduler counts it (transport, timeout, non-200,
    ``Error``): the pod goes to backoffQ."""


def parse_filter(result: Any, sent: list[str]) -> tuple[list[str], dict[str, str]]:
    """Read an ExtenderFilterResult as kube-scheduler does: the kept names and every failed
    node's reason (FailedAndUnresolvableNodes win over FailedNodes); raises ``ExtenderError``
    for ``Error``, a malformed answer, or a kept node that was not sent."""
    if not isinstance(result, dict):
        raise ExtenderError(f"filter answered {type(result).__name__}, not an ExtenderFilterResult")
    if result.get("Error"):
        raise ExtenderError(str(result["Error"]))
    names = result.get("NodeNames") or []
    if not isinstance(names, list):
        raise ExtenderError(f"filter answered NodeNames as {type(names).__name__}, not a list")
    known = set(sent)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ExtenderError(f"extender claims filtered nodes {unknown} not in the input node list")
    failed = {**_reasons(result, "FailedNodes"), **_reasons(result, "FailedAndUnresolvableNodes")}
    return [str(n) for n in names], failed


def _reasons(result: Mapping[str, Any], key: str) -> dict[str, str]:
    value = result.get(key) or {}
    if not isinstance(value, dict):
        raise ExtenderError(f"filter answered {key} as {type(value).__name__}, not a map")
    return {str(k): str(v) for k, v in value.items()}


def parse_scores(result: Any, weight: int) -> dict[str, int]:
    """Read a HostPriorityList into scores scaled as kube-scheduler scales them; raises
    ``ExtenderError`` for a malformed answer."""
    if not isinstance(result, list):
        raise ExtenderError(f"prioritize answered {type(result).__name__}, not a HostPriorityList")
    try:
        return {str(p["Host"]): int(p["Score"]) * weight * _EXTENDER_SCORE_SCALE for p in result}
    except (KeyError, TypeError, ValueError) as exc:
        raise ExtenderError(f"prioritize answered a malformed HostPriority: {exc!r}") from exc
