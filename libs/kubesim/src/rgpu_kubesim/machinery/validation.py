"""Field validation kube-apiserver performs before anything is stored.

Only the rules a client of this project can trip over are reproduced: object names and label
grammar, required pod fields, the extended-resource rules that HAMi-style scheduling depends on
(integer quantities, request equal to limit), pod spec immutability, and the shape of
Mutating and ValidatingWebhookConfigurations. Each returns field-level causes; the caller turns
them into 422s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rgpu_kubesim.machinery._names import (
    dns_label_error,
    dns_subdomain_error,
    label_value_error,
    path_segment_error,
    qualified_name_error,
)
from rgpu_kubesim.machinery._quantity import is_integer, parse_quantity
from rgpu_kubesim.machinery._resources import Resource
from rgpu_kubesim.machinery.status import Cause

_MUTABLE_POD_SPEC = (
    "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def invalid_value(field: str, value: Any, detail: str) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return Cause(
        field=field, reason="FieldValueInvalid", detail=f"Invalid value: {shown}: {detail}"
    )


def required(field: str, detail: str = "") -> Cause:
    text = f"Required value: {detail}" if detail else "Required value"
    return Cause(field=field, reason="FieldValueRequired", detail=text)


def forbidden(field: str, detail: str) -> Cause:
    return Cause(field=field, reason="FieldValueForbidden", detail=f"Forbidden: {detail}")


def duplicate(field: str, value: Any) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return Cause(field=field, reason="FieldValueDuplicate", detail=f"Duplicate value: {shown}")


def not_supported(field: str, value: Any, allowed: tuple[str, ...]) -> Cause:
    options = ", ".join(f'"{a}"' for a in allowed)
    detail = f'Unsupported value: "{value}": supported values: {options}'
    return Cause(field=field, reason="FieldValueNotSupported", detail=detail)


def metadata_causes(resource: Resource, obj: Mapping[str, Any]) -> list[Cause]:
    """Name grammar (subdomain, or label for namespaces) and label/annotation keys."""
    meta = obj.get("metadata") or {}
    causes = list(_name_causes(resource, meta))
    causes += _label_causes(meta.get("labels") or {})
    causes += _annotation_causes(meta.get("annotations") or {})
    return causes


def _name_causes(resource: Resource, meta: Mapping[str, Any]) -> Iterator[Cause]:
    name = meta.get("name") or ""
    if not name:
        yield required("metadata.name", "name or generateName is required")
        return
    check = dns_label_error if resource.plural == "namespaces" else dns_subdomain_error
    if resource.group == "rbac.authorization.k8s.io":
        check = path_segment_error
    problem = check(name)
    if problem:
        yield invalid_value("metadata.name", name, problem)


def _label_causes(labels: Mapping[str, Any]) -> Iterator[Cause]:
    for key, value in labels.items():
        problem = qualified_name_error(key)
        if problem:
            yield invalid_value("metadata.labels", key, problem)
        value_problem = label_value_error(value) if isinstance(value, str) else "must be a string"
        if value_problem:
            yield invalid_value("metadata.labels", value, value_problem)


def _annotation_causes(annotations: Mapping[str, Any]) -> Iterator[Cause]:
    for key, value in annotations.items():
        problem = qualified_name_error(key.lower())
        if problem:
            yield invalid_value("metadata.annotations", key, problem)
        if not isinstance(value, str):
            yield invalid_value("metadata.annotations", key, "annotation values must be strings")


def pod_causes(pod: Mapping[str, Any]) -> list[Cause]:
    """Required containers, names and images, the extended-resource rules, scheduling gates."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    causes = [] if containers else [required("spec.containers")]
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or ()):
            causes += _container_causes(f"spec.{group}[{index}]", container)
    causes += _scheduling_gate_causes(spec.get("schedulingGates"))
    causes += _readiness_gate_causes(spec.get("readinessGates"))
    return causes


def pod_create_causes(pod: Mapping[str, Any]) -> list[Cause]:
    """What only a new pod is refused for: a node named while scheduling gates remain."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") and spec.get("schedulingGates"):
        why = "cannot be set until all schedulingGates have been cleared"
        return [forbidden("spec.nodeName", why)]
    return []


def gate_names(gates: Any) -> list[str]:
    """The names of ``spec.schedulingGates`` (entries that are not objects count as nameless)."""
    return [str(g.get("name") or "") if isinstance(g, dict) else "" for g in gates or ()]


def _scheduling_gate_causes(gates: Any) -> list[Cause]:
    if gates is not None and not isinstance(gates, list):
        return [invalid_value("spec.schedulingGates", gates, "must be a list of {name: ...}")]
    causes: list[Cause] = []
    seen: set[str] = set()
    for index, name in enumerate(gate_names(gates)):
        path = f"spec.schedulingGates[{index}]"
        problem = qualified_name_error(name) if name else "name part must be non-empty"
        if problem:
            causes.append(invalid_value(path, name, problem))
        if name in seen:
            causes.append(duplicate(path, name))
        seen.add(name)
    return causes


def _readiness_gate_causes(gates: Any) -> list[Cause]:
    if gates is not None and not isinstance(gates, list):
        why = "must be a list of {conditionType: ...}"
        return [invalid_value("spec.readinessGates", gates, why)]
    causes: list[Cause] = []
    for index, gate in enumerate(gates or ()):
        kind = str(gate.get("conditionType") or "") if isinstance(gate, dict) else ""
        problem = qualified_name_error(kind) if kind else "name part must be non-empty"
        if problem:
            path = f"spec.readinessGates[{index}].conditionType"
            causes.append(invalid_value(path, kind, problem))
    return causes


def _container_causes(path: str, container: Mapping[str, Any]) -> list[Cause]:
    causes = [] if container.get("name") else [required(f"{path}.name")]
    if not container.get("image"):
        causes.append(required(f"{path}.image"))
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, value in values.items():
            causes += _quantity_causes(f"{path}.resources.{kind}[{name}]", name, value)
    for name, value in requests.items():
        if is_extended(name):
            causes += _request_vs_limit(f"{path}.resources", name, value, limits.get(name))
    return causes


def is_extended(name: str) -> bool:
    """Extended resources: qualified names outside kubernetes.io and not 'requests.'-prefixed."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.partition("/")[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def _quantity_causes(field: str, name: str, value: Any) -> list[Cause]:
    try:
        quantity = parse_quantity(value)
    except ValueError:
        return [invalid_value(field, value, "must be a valid quantity")]
    if quantity < 0:
        return [invalid_value(field, value, "must be greater than or equal to 0")]
    if is_extended(name) and not is_integer(quantity):
        return [invalid_value(field, value, "must be an integer")]
    return []


def _request_vs_limit(path: str, name: str, request: Any, limit: Any) -> list[Cause]:
    if limit is None:
        return [required(f"{path}.limits", "Limit must be set for non overcommitable resources")]
    try:
        equal = parse_quantity(request) == parse_quantity(limit)
    except ValueError:
        return []
    if equal:
        return []
    detail = f"must be equal to {name} limit of {limit}"
    return [invalid_value(f"{path}.requests[{name}]", str(request), detail)]


def pod_update_causes(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """kube forbids changing a pod's spec except images, deadlines, added tolerations and
    removed scheduling gates."""
    new_spec, old_spec = dict(new.get("spec") or {}), dict(old.get("spec") or {})
    causes = _only_removed_gates(new_spec.get("schedulingGates"), old_spec.get("schedulingGates"))
    return causes + _spec_change_causes(new_spec, old_spec)


def _spec_change_causes(new_spec: dict[str, Any], old_spec: dict[str, Any]) -> list[Cause]:
    for field in ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "schedulingGates"):
        new_spec.pop(field, None)
        old_spec.pop(field, None)
    if not _tolerations_only_added(
        new_spec.pop("tolerations", None), old_spec.pop("tolerations", None)
    ):
        return [
            forbidden("spec", f"pod updates may not change fields other than {_MUTABLE_POD_SPEC}")
        ]
    for group in ("containers", "initContainers"):
        new_spec[group] = _without_images(new_spec.get(group))
        old_spec[group] = _without_images(old_spec.get(group))
    if new_spec != old_spec:
        return [
            forbidden("spec", f"pod updates may not change fields other than {_MUTABLE_POD_SPEC}")
        ]
    return []


def _only_removed_gates(new: Any, old: Any) -> list[Cause]:
    """A gate may only go: any name the old pod did not carry is an addition (a renamed gate
    included), whatever its position."""
    before = set(gate_names(old))
    return [
        forbidden(
            f"spec.schedulingGates[{index}].name",
            f"only deletion is allowed, but found new scheduling gate '{name}'",
        )
        for index, name in enumerate(gate_names(new))
        if name not in before
    ]


def _tolerations_only_added(new: Any, old: Any) -> bool:
    new_list, old_list = list(new or ()), list(old or ())
    return all(t in new_list for t in old_list)


def _without_images(containers: Any) -> list[Any]:
    return [{k: v for k, v in c.items() if k != "image"} for c in containers or ()]


def webhook_configuration_causes(config: Mapping[str, Any], *, mutating: bool) -> list[Cause]:
    """The v1 rules that matter for calling a mutating webhook correctly."""
    causes: list[Cause] = []
    seen: set[str] = set()
    for index, webhook in enumerate(config.get("webhooks") or ()):
        path = f"webhooks[{index}]"
        name = webhook.get("name") or ""
        if name in seen:
            causes.append(duplicate(f"{path}.name", name))
        seen.add(name)
        causes += _webhook_causes(path, webhook)
        if mutating:
            policy = webhook.get("reinvocationPolicy")
            causes += _enum_cause(f"{path}.reinvocationPolicy", policy, ("Never", "IfNeeded"))
    return causes


def _webhook_causes(path: str, webhook: Mapping[str, Any]) -> list[Cause]:
    causes = _webhook_name_causes(path, webhook.get("name") or "")
    causes += _enum_cause(
        f"{path}.sideEffects", webhook.get("sideEffects"), ("None", "NoneOnDryRun")
    )
    causes += _enum_cause(f"{path}.failurePolicy", webhook.get("failurePolicy"), ("Fail", "Ignore"))
    if "v1" not in (webhook.get("admissionReviewVersions") or ()):
        detail = "must include v1 (the only AdmissionReview version the simulator speaks)"
        causes.append(required(f"{path}.admissionReviewVersions", detail))
    timeout = webhook.get("timeoutSeconds")
    if not isinstance(timeout, int) or not 1 <= timeout <= 30:
        causes.append(
            invalid_value(
                f"{path}.timeoutSeconds",
                timeout,
                "the timeout value must be between 1 and 30 seconds",
            )
        )
    return causes + _client_config_causes(f"{path}.clientConfig", webhook.get("clientConfig") or {})


def _webhook_name_causes(path: str, name: str) -> list[Cause]:
    if not name:
        return [required(f"{path}.name")]
    if dns_subdomain_error(name) or name.count(".") < 2:
        detail = "should be a domain with at least three segments separated by dots"
        return [invalid_value(f"{path}.name", name, detail)]
    return []


def _enum_cause(field: str, value: Any, allowed: tuple[str, ...]) -> list[Cause]:
    if value is None:
        return [required(field)]
    return [] if value in allowed else [not_supported(field, value, allowed)]


def _client_config_causes(path: str, client: Mapping[str, Any]) -> list[Cause]:
    url, service = client.get("url"), client.get("service")
    if (url is None) == (service is None):
        return [required(path, "exactly one of url or service is required")]
    if url is not None and not str(url).startswith("https://"):
        return [invalid_value(f"{path}.url", url, "'https' is the only allowed URL scheme")]
    if service is not None and not (service.get("name") and service.get("namespace")):
        return [required(f"{path}.service", "name and namespace are required")]
    return []
