"""The ``pods/eviction`` subresource: a deletion that asks the pod's disruption budget first.

rgpu's allocator preempts through it (docs/design.md §11), and must see exactly what kube answers:
201 and a graceful deletion when no budget forbids it, 429 with the DisruptionBudget cause when one
does, 500 when several budgets cover the pod. Pods that are pending, finished or already terminating
are deleted without asking, as kube's eviction REST handler does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rgpu_kubesim.apiserver.kinds import disruption as _disruption
from rgpu_kubesim.apiserver.kinds import graceful as _graceful
from rgpu_kubesim.apiserver.storage import Storage
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Entry, parse_filter, require, timestamp
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]
_PODS = require("pods")
_BUDGETS = require("poddisruptionbudgets")
_VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
_SEVERAL = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
    "support."
)


def _ignores_budgets(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(
        pod["metadata"].get("deletionTimestamp")
    )


def _options(eviction: object, name: str) -> Mapping[str, Any]:
    if not isinstance(eviction, dict):
        raise _status.bad_request("the Eviction body must be a JSON object")
    given = (eviction.get("metadata") or {}).get("name")
    if given and given != name:
        raise _status.bad_request("name in URL does not match name in Eviction object")
    options = eviction.get("deleteOptions") or {}
    if not isinstance(options, dict):
        raise _status.bad_request("deleteOptions: expected a DeleteOptions object")
    return options


def _budgets_of(storage: Storage, pod: Entry) -> list[Entry]:
    wanted = parse_filter(_BUDGETS, pod.namespace, "", "")
    listed = storage.list_entries(_BUDGETS, wanted).entries
    return [b for b in listed if _disruption.matches(b.decode(), pod.labels)]


def _too_many(budget: JsonObj) -> ApiError:
    status = budget.get("status") or {}
    why = (
        f"The disruption budget {budget['metadata']['name']} needs "
        f"{status.get('desiredHealthy', 0)} healthy pods and has "
        f"{status.get('currentHealthy', 0)} currently"
    )
    cause = {"reason": "DisruptionBudget", "message": why}
    return _status.failure(429, _VIOLATION, details={"causes": [cause]})


def _spend(storage: Storage, budget: JsonObj, pod: JsonObj, now: float, dry_run: bool) -> bool:
    """Take one disruption from ``budget`` for ``pod``; False when the pod need not count."""
    status = budget.get("status") or {}
    desired, healthy = status.get("desiredHealthy", 0), status.get("currentHealthy", 0)
    if not _disruption.is_healthy(pod):
        policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy")
        # IfHealthyBudget (the default): an unready pod may go while the budget is met.
        if policy == "AlwaysAllow" or (desired > 0 and healthy >= desired):
            return False
    if int(status.get("disruptionsAllowed") or 0) <= 0:
        raise _too_many(budget)
    if dry_run:
        return True
    disrupted = dict(status.get("disruptedPods") or {})
    disrupted[pod["metadata"]["name"]] = timestamp(now)
    spent = {**status, "disruptionsAllowed": status["disruptionsAllowed"] - 1}
    spent["disruptedPods"] = disrupted
    name = budget["metadata"]["name"]
    namespace = budget["metadata"]["namespace"]
    storage.update(_BUDGETS, namespace, name, {**budget, "status": spent}, subresource="status")
    return True


def evict(storage: Storage, namespace: str, name: str, eviction: object, now: float) -> None:
    """Evict the pod or raise the ApiError kube answers with."""
    options = _options(eviction, name)
    entry = storage.get(_PODS, namespace, name)
    preconditions = options.get("preconditions") or {}
    grace = _graceful.requested_grace({}, options)
    dry_run = bool(options.get("dryRun"))
    # Preconditions are judged before any budget is spent.
    storage.delete(_PODS, namespace, name, preconditions, dry_run=True)
    pod = entry.decode()
    if not _ignores_budgets(pod):
        budgets = _budgets_of(storage, entry)
        if len(budgets) > 1:
            raise _status.internal(_SEVERAL)
        if budgets:
            _spend(storage, budgets[0].decode(), pod, now, dry_run)
    storage.delete(
        _PODS, namespace, name, preconditions, dry_run=dry_run, grace_period_seconds=grace
    )
