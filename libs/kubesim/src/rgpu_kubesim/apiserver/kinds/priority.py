"""PriorityClasses and the Priority admission plugin, as kube-apiserver has them.

Preemption (docs/design.md §11) compares ``spec.priority`` values, and a pod only carries one once
the apiserver has resolved its ``priorityClassName`` at admission. The rules and messages follow
kube's priority plugin and PriorityClass validation, so code that reads or refuses priorities
behaves here as on a real cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Cause, forbidden, invalid_value, not_supported, required
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]
PREEMPT, NEVER = "PreemptLowerPriority", "Never"
HIGHEST_USER_PRIORITY = 1_000_000_000
SYSTEM_CLASSES: tuple[JsonObj, ...] = (
    {
        "metadata": {"name": "system-cluster-critical"},
        "value": 2_000_000_000,
        "description": "Used for system critical pods that must run in the cluster, "
        "but can be moved to another node if necessary.",
    },
    {
        "metadata": {"name": "system-node-critical"},
        "value": 2_000_001_000,
        "description": "Used for system critical pods that must not be moved from their "
        "current node.",
    },
)
_SYSTEM_VALUES = {c["metadata"]["name"]: c["value"] for c in SYSTEM_CLASSES}


def default_class(obj: JsonObj) -> None:
    obj.setdefault("preemptionPolicy", PREEMPT)


def class_causes(obj: JsonObj, old: JsonObj | None) -> list[Cause]:
    """kube's ValidatePriorityClass (and its update rules)."""
    name, value = str(obj["metadata"].get("name", "")), obj.get("value")
    causes = []
    if value is None:
        causes.append(required("value"))
    elif isinstance(value, bool) or not isinstance(value, int):
        causes.append(invalid_value("value", value, "must be an integer"))
    elif name in _SYSTEM_VALUES:
        if value != _SYSTEM_VALUES[name]:
            detail = f"{name} is a system priority class with value {_SYSTEM_VALUES[name]}"
            causes.append(invalid_value("value", value, detail))
    elif name.startswith("system-"):
        detail = "priority class names with 'system-' prefix are reserved"
        causes.append(invalid_value("metadata.name", name, detail))
    elif value > HIGHEST_USER_PRIORITY:
        detail = f"maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}"
        causes.append(forbidden("value", detail))
    if obj.get("preemptionPolicy") not in (PREEMPT, NEVER):
        causes.append(
            not_supported("preemptionPolicy", obj.get("preemptionPolicy"), (NEVER, PREEMPT))
        )
    if old is not None:
        causes += _update_causes(obj, old)
    return causes


def _update_causes(obj: JsonObj, old: JsonObj) -> list[Cause]:
    causes = []
    if obj.get("value") != old.get("value"):
        causes.append(forbidden("value", "may not be changed in an update."))
    if obj.get("preemptionPolicy") != old.get("preemptionPolicy"):
        causes.append(
            invalid_value("preemptionPolicy", obj.get("preemptionPolicy"), "field is immutable")
        )
    return causes


def check_single_default(obj: JsonObj, classes: Iterable[JsonObj]) -> None:
    """Only one class may be the global default (kube's admission plugin refuses a second)."""
    if not obj.get("globalDefault"):
        return
    name = str(obj["metadata"].get("name", ""))
    for other in classes:
        other_name = other["metadata"]["name"]
        if other.get("globalDefault") and other_name != name:
            message = (
                f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: PriorityClass '
                f"{other_name} is already marked as default. Only one default can exist"
            )
            details = {"name": name, "group": "scheduling.k8s.io", "kind": "priorityclasses"}
            raise _status.failure(403, message, details=details)


def _forbidden(pod: JsonObj, why: str) -> ApiError:
    name = str(pod["metadata"].get("name") or "")
    return _status.failure(
        403, f'pods "{name}" is forbidden: {why}', details={"name": name, "kind": "pods"}
    )


def admit_pod(pod: JsonObj, classes: Mapping[str, JsonObj]) -> None:
    """Resolve ``priorityClassName`` into ``spec.priority`` and ``spec.preemptionPolicy``."""
    spec = pod.setdefault("spec", {})
    wanted = spec.get("priorityClassName") or ""
    if wanted:
        chosen = classes.get(wanted)
        if chosen is None:
            raise _forbidden(pod, f"no PriorityClass with name {wanted} was found")
    else:
        chosen = next((c for c in classes.values() if c.get("globalDefault")), None)
        if chosen is not None:
            spec["priorityClassName"] = chosen["metadata"]["name"]
    priority = int(chosen["value"]) if chosen is not None else 0
    given = spec.get("priority")
    if given is not None and given != priority:
        raise _forbidden(
            pod,
            f"the integer value of priority ({given}) must not be provided in pod spec; "
            f"priority admission controller computed {priority} from the given PriorityClass "
            "name",
        )
    spec["priority"] = priority
    policy = chosen.get("preemptionPolicy") if chosen is not None else None
    if policy is None:
        spec.setdefault("preemptionPolicy", PREEMPT)
        return
    if spec.get("preemptionPolicy") not in (None, policy):
        raise _forbidden(
            pod,
            f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) must not be "
            f"provided in pod spec; priority admission controller computed {policy} from the "
            "given PriorityClass name",
        )
    spec["preemptionPolicy"] = policy
