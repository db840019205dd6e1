"""Per-resource behaviour on write: defaulting, what an update may change, and validation.

kube-apiserver's registry strategies decide, for each kind, which fields a client can set on
create, which part of the stored object survives an update of the main resource or of its
status subresource, and which validation runs. The functions here are that table for the kinds
the simulator serves; storage calls them and stays kind-agnostic.
"""

from __future__ import annotations

from typing import Any

from rgpu_kubesim.apiserver.kinds import (
    _admission_policy_parse,
    _configmaps,
    _network_policies,
    _rbac_validation,
)
from rgpu_kubesim.apiserver.kinds import disruption as _disruption
from rgpu_kubesim.apiserver.kinds import priority as _priority
from rgpu_kubesim.machinery import Resource, match_condition_causes, parse_quantity
from rgpu_kubesim.machinery import status as _status
from rgpu_kubesim.machinery import validation as _validation

JsonObj = dict[str, Any]

_DEFAULT_TOLERATIONS = (
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
)
_POD_SPEC_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("restartPolicy", "Always"),
    ("terminationGracePeriodSeconds", 30),
    ("dnsPolicy", "ClusterFirst"),
    ("securityContext", {}),
    ("schedulerName", "default-scheduler"),
    ("enableServiceLinks", True),
)
_CONTAINER_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("terminationMessagePath", "/dev/termination-log"),
    ("terminationMessagePolicy", "File"),
)
_RBAC = "rbac.authorization.k8s.io"
_POLICY_KINDS = frozenset({"validatingadmissionpolicies", "validatingadmissionpolicybindings"})
_WEBHOOK_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("failurePolicy", "Fail"),
    ("matchPolicy", "Equivalent"),
    ("namespaceSelector", {}),
    ("objectSelector", {}),
    ("timeoutSeconds", 10),
)
WEBHOOK_CONFIGURATIONS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


def apply_defaults(resource: Resource, obj: JsonObj) -> None:
    """Decode-time defaulting, applied to every create and update body (in place)."""
    if resource.plural == "pods":
        _default_pod_spec(obj.setdefault("spec", {}))
    elif resource.plural == "namespaces":
        _default_namespace(obj)
    elif resource.plural in WEBHOOK_CONFIGURATIONS:
        mutating = resource.plural == "mutatingwebhookconfigurations"
        for webhook in obj.get("webhooks") or ():
            _default_webhook(webhook, mutating=mutating)
    elif resource.plural == "priorityclasses":
        _priority.default_class(obj)
    elif resource.plural == "configmaps":
        _configmaps.check_decodable(resource, obj)
    elif resource.group == _RBAC:
        _rbac_validation.apply_defaults(resource.kind, obj)
    elif resource.plural in _POLICY_KINDS:
        _admission_policy_parse.apply_defaults(resource.kind, obj)
    elif resource.plural == "networkpolicies":
        _network_policies.default_policy(obj)


def _default_pod_spec(spec: JsonObj) -> None:
    for key, value in _POD_SPEC_DEFAULTS:
        spec.setdefault(key, value)
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            _default_container(container)


def _default_container(container: JsonObj) -> None:
    for key, value in _CONTAINER_DEFAULTS:
        container.setdefault(key, value)
    image = str(container.get("image", ""))
    tagged = ":" in image.rpartition("/")[2] or "@" in image
    latest = image.endswith(":latest") or not tagged
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    resources = container.get("resources")
    if isinstance(resources, dict) and resources.get("limits"):
        requests = resources.setdefault("requests", {})
        for name, value in resources["limits"].items():
            requests.setdefault(name, value)


def _default_namespace(namespace: JsonObj) -> None:
    meta = namespace.setdefault("metadata", {})
    if meta.get("name"):
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
    namespace.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    namespace.setdefault("status", {}).setdefault("phase", "Active")


def _default_webhook(webhook: JsonObj, *, mutating: bool) -> None:
    for key, value in _WEBHOOK_DEFAULTS:
        webhook.setdefault(key, value)
    if mutating:
        webhook.setdefault("reinvocationPolicy", "Never")
    for rule in webhook.get("rules") or ():
        rule.setdefault("scope", "*")
    service = (webhook.get("clientConfig") or {}).get("service")
    if isinstance(service, dict):
        service.setdefault("port", 443)


def prepare_for_create(resource: Resource, obj: JsonObj) -> None:
    """Create-only fields: what kube's create strategy and default admission plugins add."""
    if resource.plural != "pods":
        return
    spec = obj.setdefault("spec", {})
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("tolerations", [dict(t) for t in _DEFAULT_TOLERATIONS])
    status = obj.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", qos_class(spec))
    if spec.get("schedulingGates"):
        _gated_condition(status)


SCHEDULING_GATED = "SchedulingGated"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"


def _gated_condition(status: JsonObj) -> None:
    """kube's pod strategy marks a pod created with gates: PodScheduled=False, SchedulingGated
    unless a PodScheduled condition came with it (the scheduler replaces it once it tries the
    pod, the binding once it is bound)."""
    conditions = status.get("conditions") or []
    if any(c.get("type") == "PodScheduled" for c in conditions if isinstance(c, dict)):
        return
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "lastProbeTime": None,
        "lastTransitionTime": None,
        "reason": SCHEDULING_GATED,
        "message": GATED_MESSAGE,
    }
    status["conditions"] = [*conditions, condition]


def qos_class(spec: JsonObj) -> str:
    """Guaranteed, Burstable or BestEffort from cpu/memory requests and limits."""
    containers = list(spec.get("containers") or ()) + list(spec.get("initContainers") or ())
    guaranteed, any_set = True, False
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            any_set = any_set or name in requests or name in limits
            guaranteed = guaranteed and _same(requests.get(name), limits.get(name))
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _same(request: Any, limit: Any) -> bool:
    if request is None or limit is None:
        return False
    try:
        return parse_quantity(request) == parse_quantity(limit)
    except ValueError:
        return False


def prepare_for_update(resource: Resource, new: JsonObj, old: JsonObj, subresource: str) -> JsonObj:
    """Carry over what this kind of update may not change; return the object to store."""
    meta = new.setdefault("metadata", {})
    for key in (
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)
    if subresource == "status":
        return _status_update(resource, new, old)
    if resource.plural == "namespaces":
        # Only the finalize subresource changes spec.finalizers (the namespace controller's).
        source = new if subresource == "finalize" else old
        finalizers = (source.get("spec") or {}).get("finalizers")
        spec = {k: v for k, v in (new.get("spec") or {}).items() if k != "finalizers"}
        new["spec"] = {**spec, "finalizers": finalizers} if finalizers else spec
        if subresource == "finalize":
            return {**old, "spec": new["spec"]}
    if resource.status_is_subresource:
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    _bump_generation(new, old)
    return new


def _status_update(resource: Resource, new: JsonObj, old: JsonObj) -> JsonObj:
    """What a write through ``/status`` stores: the new status and the new metadata (labels,
    annotations, finalizers: kube's status strategies keep them), everything else as it was;
    a pod's ownerReferences too (kube keeps old kubelets from corrupting them)."""
    meta = new["metadata"]
    if resource.plural == "pods":
        meta.pop("ownerReferences", None)
        if "ownerReferences" in old["metadata"]:
            meta["ownerReferences"] = old["metadata"]["ownerReferences"]
    kept = {k: v for k, v in old.items() if k not in ("metadata", "status")}
    return {"metadata": meta, **kept, "status": new.get("status", {})}


def _bump_generation(new: JsonObj, old: JsonObj) -> None:
    spec_new = {k: v for k, v in new.items() if k not in {"metadata", "status"}}
    spec_old = {k: v for k, v in old.items() if k not in {"metadata", "status"}}
    if spec_new != spec_old:
        new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1


def validate(resource: Resource, obj: JsonObj, old: JsonObj | None, subresource: str = "") -> None:
    """Raise a 422 ApiError naming every invalid field of ``obj``.

    A status write is validated as kube's status strategies do: its metadata, not the spec it
    could not change (``prepare_for_update`` kept the stored one).
    """
    causes = _validation.metadata_causes(resource, obj)
    if subresource != "status":
        causes += _kind_causes(resource, obj, old)
    if causes:
        name = (obj.get("metadata") or {}).get("name") or ""
        raise _status.invalid_object(resource, name, causes)


def _kind_causes(resource: Resource, obj: JsonObj, old: JsonObj | None) -> list[_status.Cause]:
    causes: list[_status.Cause] = []
    if resource.plural == "pods":
        causes += _validation.pod_causes(obj)
        if old is None:
            causes += _validation.pod_create_causes(obj)
        else:
            causes += _validation.pod_update_causes(obj, old)
    elif resource.plural == "priorityclasses":
        causes += _priority.class_causes(obj, old)
    elif resource.plural == "poddisruptionbudgets":
        causes += _disruption.budget_causes(obj)
    elif resource.plural == "networkpolicies":
        causes += _network_policies.policy_causes(obj)
    elif resource.plural == "configmaps":
        causes += _configmaps.causes(obj, old)
    elif resource.group == _RBAC:
        causes += _rbac_validation.causes(resource.kind, obj, old)
    elif resource.plural in _POLICY_KINDS:
        causes += _admission_policy_parse.causes(resource.kind, obj)
    elif resource.plural in WEBHOOK_CONFIGURATIONS:
        mutating = resource.plural == "mutatingwebhookconfigurations"
        causes += _validation.webhook_configuration_causes(obj, mutating=mutating)
        for index, webhook in enumerate(obj.get("webhooks") or ()):
            path = f"webhooks[{index}].matchConditions"
            causes += match_condition_causes(path, webhook.get("matchConditions"))
    return causes
