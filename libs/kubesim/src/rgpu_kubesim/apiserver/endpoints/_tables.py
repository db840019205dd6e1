"""meta.k8s.io/v1 Table output, which ``kubectl get`` asks for.

kubectl requests ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the
server's columns as they come. These are the columns kube-apiserver's printers produce for the
kinds served here (Priority 1 columns appear with ``-o wide``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Any

from rgpu_kubesim.apiserver.kinds import entry_count
from rgpu_kubesim.machinery import Entry, Resource

JsonObj = dict[str, Any]
Column = tuple[str, str, int]
"""(name, type, priority)."""

_WEBHOOK_COLUMNS: tuple[Column, ...] = (
    ("Name", "string", 0),
    ("Webhooks", "integer", 0),
    ("Age", "string", 0),
)
_COLUMNS: dict[str, tuple[Column, ...]] = {
    "pods": (
        ("Name", "string", 0),
        ("Ready", "string", 0),
        ("Status", "string", 0),
        ("Restarts", "string", 0),
        ("Age", "string", 0),
        ("IP", "string", 1),
        ("Node", "string", 1),
        ("Nominated Node", "string", 1),
        ("Readiness Gates", "string", 1),
    ),
    "nodes": (
        ("Name", "string", 0),
        ("Status", "string", 0),
        ("Roles", "string", 0),
        ("Age", "string", 0),
        ("Version", "string", 0),
        ("Internal-IP", "string", 1),
        ("External-IP", "string", 1),
        ("OS-Image", "string", 1),
        ("Kernel-Version", "string", 1),
        ("Container-Runtime", "string", 1),
    ),
    "namespaces": (("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)),
    "events": (
        ("Last Seen", "string", 0),
        ("Type", "string", 0),
        ("Reason", "string", 0),
        ("Object", "string", 0),
        ("Message", "string", 0),
    ),
    "leases": (("Name", "string", 0), ("Holder", "string", 0), ("Age", "string", 0)),
    "mutatingwebhookconfigurations": _WEBHOOK_COLUMNS,
    "validatingwebhookconfigurations": _WEBHOOK_COLUMNS,
    "serviceaccounts": (("Name", "string", 0), ("Secrets", "integer", 0), ("Age", "string", 0)),
    "configmaps": (("Name", "string", 0), ("Data", "integer", 0), ("Age", "string", 0)),
    "priorityclasses": (
        ("Name", "string", 0),
        ("Value", "integer", 0),
        ("Global-Default", "boolean", 0),
        ("Age", "string", 0),
        ("PreemptionPolicy", "string", 0),
    ),
    "networkpolicies": (
        ("Name", "string", 0),
        ("Pod-Selector", "string", 0),
        ("Age", "string", 0),
    ),
    "poddisruptionbudgets": (
        ("Name", "string", 0),
        ("Min Available", "string", 0),
        ("Max Unavailable", "string", 0),
        ("Allowed Disruptions", "integer", 0),
        ("Age", "string", 0),
    ),
    "rolebindings": (("Name", "string", 0), ("Role", "string", 0), ("Age", "string", 0)),
    "clusterrolebindings": (("Name", "string", 0), ("Role", "string", 0), ("Age", "string", 0)),
    "validatingadmissionpolicies": (
        ("Name", "string", 0),
        ("Validations", "integer", 0),
        ("Age", "string", 0),
    ),
    "validatingadmissionpolicybindings": (
        ("Name", "string", 0),
        ("PolicyName", "string", 0),
        ("Age", "string", 0),
    ),
}
_NAME_AND_AGE_COLUMNS: tuple[Column, ...] = (("Name", "string", 0), ("Age", "string", 0))
"""Roles, ClusterRoles and any kind without printer columns of its own."""


def human_age(seconds: float) -> str:
    """kube's duration.HumanDuration."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


def _age(timestamp: str | None, now: float) -> str:
    if not timestamp:
        return "<unknown>"
    moment = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.UTC
    )
    return human_age(now - moment.timestamp())


def _pod_status(pod: JsonObj) -> str:
    status = pod.get("status") or {}
    if (pod["metadata"]).get("deletionTimestamp"):
        return "Terminating"
    for container in status.get("containerStatuses") or ():
        state = container.get("state") or {}
        for phase in ("waiting", "terminated"):
            reason = (state.get(phase) or {}).get("reason")
            if reason:
                return str(reason)
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "SchedulingGated":
            return "SchedulingGated"
    return str(status.get("reason") or status.get("phase") or "Unknown")


def _readiness_gates(pod: JsonObj) -> str:
    """kubectl's READINESS GATES: how many of the gates' conditions are True, of how many."""
    gates = (pod.get("spec") or {}).get("readinessGates") or ()
    if not gates:
        return "<none>"
    conditions = (pod.get("status") or {}).get("conditions") or ()
    true = {c.get("type") for c in conditions if c.get("status") == "True"}
    met = sum(1 for g in gates if g.get("conditionType") in true)
    return f"{met}/{len(gates)}"


def _pod_row(pod: JsonObj, now: float) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or ()
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or ())}",
        _pod_status(pod),
        str(restarts),
        _age(pod["metadata"].get("creationTimestamp"), now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        _readiness_gates(pod),
    ]


def _node_status(node: JsonObj) -> str:
    conditions = (node.get("status") or {}).get("conditions") or ()
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    text = {"True": "Ready", "False": "NotReady"}.get(str(ready), "Unknown")
    return text + (",SchedulingDisabled" if (node.get("spec") or {}).get("unschedulable") else "")


def _node_roles(labels: dict[str, str]) -> str:
    roles = sorted(k.partition("/")[2] for k in labels if k.startswith("node-role.kubernetes.io/"))
    if labels.get("kubernetes.io/role"):
        roles.append(labels["kubernetes.io/role"])
    return ",".join(r for r in roles if r) or "<none>"


def _address(node: JsonObj, kind: str) -> str:
    addresses = (node.get("status") or {}).get("addresses") or ()
    return next((str(a.get("address")) for a in addresses if a.get("type") == kind), "<none>")


def _node_row(node: JsonObj, now: float) -> list[Any]:
    info = (node.get("status") or {}).get("nodeInfo") or {}
    return [
        node["metadata"]["name"],
        _node_status(node),
        _node_roles(node["metadata"].get("labels") or {}),
        _age(node["metadata"].get("creationTimestamp"), now),
        info.get("kubeletVersion", ""),
        _address(node, "InternalIP"),
        _address(node, "ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _event_row(event: JsonObj, now: float) -> list[Any]:
    involved = event.get("involvedObject") or {}
    seen = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event["metadata"].get("creationTimestamp")
    )
    return [
        _age(str(seen)[:19] + "Z" if seen else None, now),
        event.get("type", ""),
        event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        event.get("message", ""),
    ]


def _simple_row(extra: Callable[[JsonObj], list[Any]]) -> Callable[[JsonObj, float], list[Any]]:
    def row(obj: JsonObj, now: float) -> list[Any]:
        return [
            obj["metadata"]["name"],
            *extra(obj),
            _age(obj["metadata"].get("creationTimestamp"), now),
        ]

    return row


def _priority_class_row(pc: JsonObj, now: float) -> list[Any]:
    return [
        pc["metadata"]["name"],
        pc.get("value", 0),
        bool(pc.get("globalDefault")),
        _age(pc["metadata"].get("creationTimestamp"), now),
        pc.get("preemptionPolicy", ""),
    ]


def _budget_row(pdb: JsonObj, now: float) -> list[Any]:
    spec = pdb.get("spec") or {}
    return [
        pdb["metadata"]["name"],
        *(str(spec[k]) if spec.get(k) is not None else "N/A" for k in _BUDGET_BOUNDS),
        (pdb.get("status") or {}).get("disruptionsAllowed", 0),
        _age(pdb["metadata"].get("creationTimestamp"), now),
    ]


def _role_ref(binding: JsonObj) -> list[Any]:
    ref = binding.get("roleRef") or {}
    return [f"{ref.get('kind', '')}/{ref.get('name', '')}"]


def _selector_text(policy: JsonObj) -> str:
    """kubectl's column (``FormatLabelSelector``): ``k=v,k in (a,b),!k``; ``<none>`` if empty."""
    selector = (policy.get("spec") or {}).get("podSelector") or {}
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    terms.extend(_expression_text(e) for e in selector.get("matchExpressions") or ())
    return ",".join(terms) or "<none>"


def _expression_text(expression: JsonObj) -> str:
    key, operator = expression.get("key", ""), expression.get("operator")
    values = ",".join(sorted(expression.get("values") or ()))
    if operator == "Exists":
        return str(key)
    if operator == "DoesNotExist":
        return f"!{key}"
    return f"{key} {str(operator).lower()} ({values})"


_BUDGET_BOUNDS = ("minAvailable", "maxUnavailable")
_NAME_AND_AGE = _simple_row(lambda o: [])
_ROWS: dict[str, Callable[[JsonObj, float], list[Any]]] = {
    "priorityclasses": _priority_class_row,
    "poddisruptionbudgets": _budget_row,
    "networkpolicies": _simple_row(lambda o: [_selector_text(o)]),
    "pods": _pod_row,
    "nodes": _node_row,
    "events": _event_row,
    "namespaces": _simple_row(lambda o: [(o.get("status") or {}).get("phase", "")]),
    "leases": _simple_row(lambda o: [(o.get("spec") or {}).get("holderIdentity", "")]),
    "mutatingwebhookconfigurations": _simple_row(lambda o: [len(o.get("webhooks") or ())]),
    "validatingwebhookconfigurations": _simple_row(lambda o: [len(o.get("webhooks") or ())]),
    "serviceaccounts": _simple_row(lambda o: [len(o.get("secrets") or ())]),
    "configmaps": _simple_row(lambda o: [entry_count(o)]),
    "rolebindings": _simple_row(_role_ref),
    "clusterrolebindings": _simple_row(_role_ref),
    "validatingadmissionpolicies": _simple_row(
        lambda o: [len((o.get("spec") or {}).get("validations") or ())]
    ),
    "validatingadmissionpolicybindings": _simple_row(
        lambda o: [(o.get("spec") or {}).get("policyName", "")]
    ),
}


def _column(name: str, kind: str, priority: int) -> JsonObj:
    fmt = "name" if name == "Name" else ""
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


def table(
    resource: Resource, entries: Iterable[Entry], *, rv: int, now: float, continue_token: str = ""
) -> JsonObj:
    """A Table of ``entries`` with PartialObjectMetadata row objects (includeObject=Metadata)."""
    meta: JsonObj = {"resourceVersion": str(rv)}
    if continue_token:
        meta["continue"] = continue_token
    rows = []
    for entry in entries:
        obj = entry.decode()
        partial = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
        row = _ROWS.get(resource.plural, _NAME_AND_AGE)
        rows.append({"cells": row(obj, now), "object": partial})
    columns = [_column(*c) for c in _COLUMNS.get(resource.plural, _NAME_AND_AGE_COLUMNS)]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    }
