"""The Eviction API judges one eviction at a time, against what a PodDisruptionBudget allows at that
moment; each real eviction then spends one of the budget's disruptions. A server's victims under one
budget are evicted one after another, so every dry run can be allowed while the set as a whole is
not: the first victims would go, a later one would be refused, and the first would have been evicted
for nothing (docs/design.md §11: no pod is evicted for a preemptor that then does not get the
server). So a set of victims is judged whole before anyone is evicted: per budget, the victims that
would spend a disruption must not outnumber the disruptions it allows now
(``status.disruptionsAllowed``).

A victim spends a disruption only while it is healthy (Ready and not already terminating);
the Eviction API lets an unhealthy one go without spending any, or refuses it outright, and
its own dry run tells which.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from rgpu_contracts import PodRef

from .clients import KubeApi
from .errors import EvictionRefused

__all__ = ["afford", "selects"]


def _mapping(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _matches(expression: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    key, operator = str(expression.get("key", "")), expression.get("operator")
    values = expression.get("values") or ()
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False


def selects(selector: object, labels: Mapping[str, Any]) -> bool:
    """Whether a policy/v1 label ``selector`` selects a pod with ``labels`` (an empty selector
    selects every pod of the namespace, a missing one none)."""
    if not isinstance(selector, Mapping):
        return False
    wanted = _mapping(selector.get("matchLabels"))
    if any(labels.get(key) != value for key, value in wanted.items()):
        return False
    expressions = selector.get("matchExpressions") or ()
    return all(_matches(_mapping(e), labels) for e in expressions)


def _spender(pod: Mapping[str, Any] | None, ref: PodRef) -> Mapping[str, Any] | None:
    """The labels of ``pod`` when evicting it spends a disruption (it is healthy), else None."""
    meta = _mapping(pod.get("metadata")) if pod is not None else {}
    if pod is None or meta.get("uid") != ref.uid or meta.get("deletionTimestamp"):
        return None
    conditions = _mapping(pod.get("status")).get("conditions") or ()
    ready = any(
        _mapping(c).get("type") == "Ready" and _mapping(c).get("status") == "True"
        for c in conditions
    )
    return _mapping(meta.get("labels")) if ready else None


def _allowed(budget: Mapping[str, Any]) -> int:
    allowed = _mapping(budget.get("status")).get("disruptionsAllowed")
    return allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0


async def _afford_in(api: KubeApi, namespace: str, victims: Sequence[PodRef]) -> None:
    budgets = await api.list_budgets(namespace)
    if not budgets:
        return
    spending = []
    for ref in victims:
        labels = _spender(await api.get_pod(namespace, ref.name), ref)
        if labels is not None:
            spending.append(labels)
    for budget in budgets:
        selector = _mapping(budget.get("spec")).get("selector")
        needed = sum(1 for labels in spending if selects(selector, labels))
        if needed > 1 and needed > _allowed(budget):
            name = _mapping(budget.get("metadata")).get("name", "")
            raise EvictionRefused(
                f"PodDisruptionBudget {namespace}/{name} allows {_allowed(budget)} "
                f"disruption(s) now, and {needed} of the victims would need one each"
            )


async def afford(api: KubeApi, victims: Sequence[PodRef]) -> None:
    """Raises ``EvictionRefused`` when some budget cannot let all of ``victims`` go now.

    Only namespaces with two victims or more are read: a lone victim's dry run decides it.
    """
    by_namespace: defaultdict[str, list[PodRef]] = defaultdict(list)
    for ref in victims:
        by_namespace[ref.namespace].append(ref)
    for namespace, refs in sorted(by_namespace.items()):
        if len(refs) > 1:
            await _afford_in(api, namespace, refs)
