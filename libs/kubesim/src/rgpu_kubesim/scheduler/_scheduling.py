"""The scheduler emulator must judge nodes the way kube-scheduler's default
filter plugins do for the cases rgpu meets (readiness, cordons, taints, node selection), explain a
refusal with kube-scheduler's own words, decide which cluster changes wake unschedulable pods,
and pick a host from the scores (``_extender_calls`` shapes the extender calls and reads them).
These are pure functions over the JSON objects the apiserver serves, tested without a server.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

__all__ = [
    "NodeCheck",
    "NodeVerdicts",
    "constraints",
    "filter_inputs",
    "filter_node",
    "find_feasible",
    "fit_error",
    "is_interested",
    "node_changed",
    "num_nodes_to_find",
    "pod_updated",
    "select_host",
    "tolerates",
]

Json = Mapping[str, Any]

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_SELECTOR = "node(s) didn't match Pod's node affinity/selector"
_FILTERED_EFFECTS = ("NoSchedule", "NoExecute")
_MIN_NODES_TO_FIND = 100
_MIN_PERCENTAGE_TO_FIND = 5
_KEPT_CONSTRAINTS = 256
"""Distinct pod constraints whose verdicts are kept; past it they start over (bounded)."""


def _toleration_matches(toleration: Json, taint: Json) -> bool:
    # k8s.io/api core/v1 Toleration.ToleratesTaint, including "empty key + Exists matches all".
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("operator", "Equal") == "Equal") and toleration.get(
        "value", ""
    ) == taint.get("value", "")


def tolerates(pod: Json, taint: Json) -> bool:
    """True when one of the pod's tolerations tolerates ``taint``."""
    tolerations = pod.get("spec", {}).get("tolerations") or []
    return any(_toleration_matches(t, taint) for t in tolerations)


def _ready_status(node: Json) -> str:
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("status", "Unknown"))
    return "False"


def _effective_taints(node: Json) -> list[Json]:
    # The node lifecycle controller turns Ready!=True into NoSchedule taints
    # (TaintNodesByCondition); kube-scheduler only sees the taints, so a pod tolerating them may
    # still land there.
    taints: list[Json] = list(node.get("spec", {}).get("taints") or [])
    status = _ready_status(node)
    if status == "False":
        taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
    elif status != "True":
        taints.append({"key": UNREACHABLE_TAINT, "effect": "NoSchedule"})
    return taints


def _unschedulable_reason(pod: Json, node: Json) -> str | None:
    if not node.get("spec", {}).get("unschedulable"):
        return None
    cordon = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    return None if tolerates(pod, cordon) else REASON_UNSCHEDULABLE


def _taint_reason(pod: Json, node: Json) -> str | None:
    for taint in _effective_taints(node):
        if taint.get("effect") in _FILTERED_EFFECTS and not tolerates(pod, taint):
            key, value = taint.get("key", ""), taint.get("value", "")
            return f"node(s) had untolerated taint {{{key}: {value}}}"
    return None


def _expression_matches(expression: Json, values: Mapping[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator", "")
    wanted = [str(v) for v in expression.get("values") or []]
    value = values.get(key)
    if operator == "In":
        return value is not None and value in wanted
    if operator == "NotIn":
        return value is None or value not in wanted
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    return _numeric_matches(operator, value, wanted)


def _numeric_matches(operator: str, value: str | None, wanted: list[str]) -> bool:
    if operator not in ("Gt", "Lt") or value is None or len(wanted) != 1:
        return False
    try:
        have, bound = int(value), int(wanted[0])
    except ValueError:
        return False
    return have > bound if operator == "Gt" else have < bound


def _term_matches(term: Json, labels: Mapping[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    by_field = {"metadata.name": name}
    return all(_expression_matches(e, labels) for e in expressions) and all(
        _expression_matches(f, by_field) for f in fields
    )


def _affinity_terms(pod: Json) -> list[Json] | None:
    affinity = pod.get("spec", {}).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return None if required is None else list(required.get("nodeSelectorTerms") or [])


def _selector_reason(pod: Json, node: Json) -> str | None:
    metadata = node.get("metadata", {})
    labels: Mapping[str, str] = metadata.get("labels") or {}
    selector: Mapping[str, str] = pod.get("spec", {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return REASON_SELECTOR
    terms = _affinity_terms(pod)
    name = str(metadata.get("name", ""))
    if terms is not None and not any(_term_matches(t, labels, name) for t in terms):
        return REASON_SELECTOR
    return None


def filter_node(pod: Json, node: Json) -> str | None:
    """Why the default filter plugins reject ``node`` for ``pod``, or ``None`` when it fits.

    Plugins run in kube-scheduler's order (NodeUnschedulable, TaintToleration, NodeAffinity) and
    the first rejection is the node's reason, as in the framework's filter loop.
    """
    return (
        _unschedulable_reason(pod, node) or _taint_reason(pod, node) or _selector_reason(pod, node)
    )


NodeCheck = Callable[[Json, Json], str | None]
"""``filter_node`` or a remembering stand-in for it: (pod, node) -> reason or ``None``."""


def constraints(pod: Json) -> bytes:
    """What of ``pod`` the filter plugins read (node selector, required node affinity,
    tolerations): pods alike in these get the same verdict on every node."""
    spec = pod.get("spec", {})
    read = (spec.get("nodeSelector"), _affinity_terms(pod), spec.get("tolerations"))
    return orjson.dumps(read, option=orjson.OPT_SORT_KEYS)


class NodeVerdicts:
    """``filter_node``'s verdicts remembered per pod constraints until the nodes change.

    kube-scheduler runs its filters in parallel, in Go, well under a millisecond per node; a
    Python loop over thousands of nodes per attempt would make this emulator the bottleneck it
    stands in for. A burst of alike pods costs one pass over the nodes instead of one per pod.
    """

    __slots__ = ("_by_constraints",)

    def __init__(self) -> None:
        self._by_constraints: dict[bytes, dict[str, str | None]] = {}

    def clear(self) -> None:
        """Forget every verdict (a node was added, changed or removed)."""
        self._by_constraints.clear()

    def check(self, pod: Json, node: Json) -> str | None:
        """``filter_node(pod, node)``, computed once per pod constraints and node."""
        return self.for_pod(pod)(pod, node)

    def for_pod(self, pod: Json) -> NodeCheck:
        """``check`` for the nodes of one attempt: the pod's constraints are read once."""
        key = constraints(pod)
        verdicts = self._by_constraints.get(key)
        if verdicts is None:
            if len(self._by_constraints) >= _KEPT_CONSTRAINTS:
                self._by_constraints.clear()
            verdicts = self._by_constraints[key] = {}

        def check(pod: Json, node: Json) -> str | None:
            name = str(node.get("metadata", {}).get("name", ""))
            if name in verdicts:
                return verdicts[name]
            found = verdicts[name] = filter_node(pod, node)
            return found

        return check


def filter_inputs(node: Json) -> tuple[Any, ...]:
    """What of ``node`` ``filter_node`` reads: a change elsewhere (a heartbeat, an
    annotation) leaves every verdict on it as it was."""
    spec = node.get("spec", {})
    return (
        bool(spec.get("unschedulable")),
        spec.get("taints") or [],
        _metadata(node, "labels"),
        _ready_status(node),
    )


def find_feasible(
    pod: Json, nodes: Sequence[Json], wanted: int, start: int, check: NodeCheck = filter_node
) -> tuple[list[str], dict[str, str], int]:
    """Filter ``nodes`` with ``check`` from index ``start`` round-robin until ``wanted`` fit.

    Returns the fitting names (in visiting order), the reason of every rejected node, and the
    start index of the next cycle, which kube-scheduler advances by the nodes it visited.
    """
    feasible: list[str] = []
    reasons: dict[str, str] = {}
    count = len(nodes)
    start = start % count if count else 0
    for offset in range(count):
        if len(feasible) >= wanted:
            break
        node = nodes[(start + offset) % count]
        name = str(node.get("metadata", {}).get("name", ""))
        reason = check(pod, node)
        if reason is None:
            feasible.append(name)
        else:
            reasons[name] = reason
    visited = len(feasible) + len(reasons)
    return feasible, reasons, (start + visited) % count if count else 0


def num_nodes_to_find(total: int, percentage: int) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind``: stop filtering after this many fit.

    ``percentage`` 0 means adaptive (50 % minus 1 % per 125 nodes, at least 5 %); clusters under
    100 nodes are always searched completely.
    """
    if total < _MIN_NODES_TO_FIND:
        return total
    if percentage == 0:
        percentage = max(50 - total // 125, _MIN_PERCENTAGE_TO_FIND)
    return max(total * percentage // 100, _MIN_NODES_TO_FIND)


def fit_error(total_nodes: int, reasons: Mapping[str, str]) -> str:
    """kube-scheduler's FitError text: ``0/N nodes are available: <count> <reason>, ….``."""
    histogram = Counter(reasons.values())
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    return f"0/{total_nodes} nodes are available: {', '.join(parts)}."


def is_interested(pod: Json, managed: Sequence[str]) -> bool:
    """An extender's ``IsInterested``: no managed resources means every pod; otherwise any
    container or init container names one of them in its requests or limits."""
    if not managed:
        return True
    wanted = set(managed)
    spec = pod.get("spec", {})
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        resources = container.get("resources") or {}
        asked = set(resources.get("limits") or {}) | set(resources.get("requests") or {})
        if asked & wanted:
            return True
    return False


def select_host(nodes: Sequence[str], scores: Mapping[str, int], rng: random.Random) -> str:
    """The highest-scoring node; ties broken by ``rng`` (kube-scheduler picks uniformly)."""
    best = max(scores.get(n, 0) for n in nodes)
    return rng.choice([n for n in nodes if scores.get(n, 0) == best])


def _conditions(node: Json) -> list[tuple[Any, ...]]:
    # Heartbeats change every few seconds and must not wake the whole queue.
    return sorted(
        tuple(sorted((k, str(v)) for k, v in c.items() if k != "lastHeartbeatTime"))
        for c in node.get("status", {}).get("conditions") or []
    )


def node_changed(old: Json, new: Json) -> bool:
    """kube-scheduler's ``nodeSchedulingPropertiesChange``: does this update deserve a retry?

    Uncordoning, allocatable, labels, taints, conditions (heartbeats aside) and annotations
    count; cordoning a node cannot make a pod fit, so it does not.
    """
    old_spec, new_spec = old.get("spec", {}), new.get("spec", {})
    uncordoned = bool(old_spec.get("unschedulable")) and not new_spec.get("unschedulable")
    return (
        uncordoned
        or old.get("status", {}).get("allocatable") != new.get("status", {}).get("allocatable")
        or _metadata(old, "labels") != _metadata(new, "labels")
        or (old_spec.get("taints") or []) != (new_spec.get("taints") or [])
        or _conditions(old) != _conditions(new)
        or _metadata(old, "annotations") != _metadata(new, "annotations")
    )


def _metadata(obj: Json, key: str) -> Mapping[str, Any]:
    value: Mapping[str, Any] = obj.get("metadata", {}).get(key) or {}
    return value


_POD_VOLATILE_METADATA = ("resourceVersion", "generation", "managedFields", "finalizers")


def _scheduling_view(pod: Json) -> dict[str, Any]:
    metadata = {
        k: v for k, v in (pod.get("metadata") or {}).items() if k not in _POD_VOLATILE_METADATA
    }
    rest = {k: v for k, v in pod.items() if k not in ("metadata", "status", "kind", "apiVersion")}
    return {**rest, "metadata": metadata}


def pod_updated(old: Json, new: Json) -> bool:
    """kube-scheduler's ``isPodUpdated``: a change beyond resourceVersion, generation, status,
    managedFields and finalizers (so an annotation counts, a status write does not)."""
    return _scheduling_view(old) != _scheduling_view(new)
