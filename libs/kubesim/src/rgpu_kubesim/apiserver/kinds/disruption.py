"""PodDisruptionBudgets: validation and the status kube's disruption controller keeps.

The Eviction API refuses an eviction by reading a budget's ``status.disruptionsAllowed``, so
that status must follow the pods it covers. The simulator recomputes it synchronously after
every pod or budget write in the namespace (no lag, so ``observedGeneration`` is always
current). Without workload controllers the expected pod count is the number of matching pods
that have not finished; kube takes it from their controllers' scale.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping
from typing import Any

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import (
    Cause,
    LabelSelector,
    invalid_value,
    labels_match,
    selector_from_object,
    timestamp,
)

JsonObj = dict[str, Any]
DISRUPTED_POD_TIMEOUT_SECONDS = 120
"""An eviction's entry in ``disruptedPods`` lapses after this (kube's DeletionTimeout)."""
TERMINAL = frozenset({"Succeeded", "Failed"})
"""Phases of pods that count toward no budget."""


def budget_causes(pdb: JsonObj) -> list[Cause]:
    """kube's ValidatePodDisruptionBudgetSpec, for the fields the simulator uses."""
    spec = pdb.get("spec") or {}
    causes = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        causes.append(
            invalid_value("spec", spec, "minAvailable and maxUnavailable cannot be both set")
        )
    for field in ("minAvailable", "maxUnavailable"):
        value = spec.get(field)
        if value is not None and _parse(value) is None:
            detail = "must be a non-negative integer or a percentage from 0% to 100%"
            causes.append(invalid_value(f"spec.{field}", value, detail))
    try:
        selector_from_object(spec.get("selector"))
    except ApiError as exc:
        causes.append(invalid_value("spec.selector", spec.get("selector"), str(exc)))
    return causes


def _parse(value: object) -> tuple[int, bool] | None:
    """(amount, is_percent) of an IntOrString, None when invalid."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (value, False) if value >= 0 else None
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        amount = int(value[:-1])
        return (amount, True) if amount <= 100 else None
    return None


def _scaled(value: object, total: int) -> int:
    amount, percent = _parse(value) or (0, False)
    return math.ceil(amount * total / 100) if percent else amount


def selector(pdb: Mapping[str, Any]) -> LabelSelector | None:
    """The pods ``pdb`` covers; policy/v1: a null selector matches no pod (``None``), an
    empty one every pod of the namespace."""
    raw = (pdb.get("spec") or {}).get("selector")
    return None if raw is None else selector_from_object(raw)


def covers(chosen: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether a budget with the ``selector`` ``chosen`` covers a pod with ``labels``."""
    return chosen is not None and labels_match(chosen, labels)


def matches(pdb: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ``pdb`` covers a pod with ``labels``."""
    return covers(selector(pdb), labels)


def is_healthy(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not being deleted (kube's countHealthyPods)."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _seconds(stamp: str) -> float:
    moment = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
    return moment.replace(tzinfo=datetime.UTC).timestamp()


def _disrupted(pdb: JsonObj, pods: Mapping[str, JsonObj], now: float) -> dict[str, str]:
    """Evictions not yet visible on their pod: still counted as disruptions."""
    kept = {}
    for name, stamp in ((pdb.get("status") or {}).get("disruptedPods") or {}).items():
        pod = pods.get(name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            continue
        if _seconds(stamp) + DISRUPTED_POD_TIMEOUT_SECONDS > now:
            kept[name] = stamp
    return kept


def status(pdb: JsonObj, pods: Iterable[JsonObj], now: float) -> JsonObj:
    """The budget's status from the pods of its namespace."""
    spec = pdb.get("spec") or {}
    chosen = selector(pdb)
    covered = {
        p["metadata"]["name"]: p
        for p in pods
        if covers(chosen, p["metadata"].get("labels") or {})
        and (p.get("status") or {}).get("phase") not in TERMINAL
    }
    disrupted = _disrupted(pdb, covered, now)
    expected = len(covered)
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = _scaled(spec.get("minAvailable", 0), expected)
    healthy = sum(1 for n, p in covered.items() if is_healthy(p) and n not in disrupted)
    allowed = max(0, healthy - desired)
    generation = int(pdb["metadata"].get("generation") or 1)
    result: JsonObj = {"observedGeneration": generation}
    if disrupted:
        result["disruptedPods"] = disrupted
    result.update(
        disruptionsAllowed=allowed,
        currentHealthy=healthy,
        desiredHealthy=desired,
        expectedPods=expected,
        conditions=[_condition(pdb, allowed > 0, generation, now)],
    )
    return result


def _condition(pdb: JsonObj, allowed: bool, generation: int, now: float) -> JsonObj:
    state = "True" if allowed else "False"
    previous = next(
        (
            c
            for c in (pdb.get("status") or {}).get("conditions") or ()
            if c.get("type") == "DisruptionAllowed"
        ),
        None,
    )
    since = timestamp(now)
    if previous is not None and previous.get("status") == state:
        since = previous.get("lastTransitionTime", since)
    return {
        "type": "DisruptionAllowed",
        "status": state,
        "reason": "SufficientPods" if allowed else "InsufficientPods",
        "message": "",
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }
