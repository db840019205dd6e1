"""kube's validation of RBAC objects: rules that can apply to something, bindings that name a
role and subjects kube knows, and a roleRef that never changes once written."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rgpu_kubesim.apiserver.kinds.rbac import RBAC_GROUP
from rgpu_kubesim.machinery import Cause, invalid_value, not_supported, required

JsonObj = Mapping[str, Any]
_SUBJECT_KINDS = ("ServiceAccount", "User", "Group")


def apply_defaults(kind: str, obj: dict[str, Any]) -> None:
    """kube's v1 defaulting: a binding's roleRef and User/Group subjects are RBAC's group."""
    if kind not in ("RoleBinding", "ClusterRoleBinding"):
        return
    ref = obj.get("roleRef")
    if isinstance(ref, dict) and not ref.get("apiGroup"):
        ref["apiGroup"] = RBAC_GROUP
    for subject in obj.get("subjects") or ():
        if isinstance(subject, dict) and subject.get("kind") in ("User", "Group"):
            subject.setdefault("apiGroup", RBAC_GROUP)


def causes(kind: str, obj: JsonObj, old: JsonObj | None) -> list[Cause]:
    """Every invalid field of a Role, ClusterRole, RoleBinding or ClusterRoleBinding."""
    if kind in ("Role", "ClusterRole"):
        return list(_rules_causes(obj.get("rules"), namespaced=kind == "Role"))
    found = list(_role_ref_causes(kind, obj.get("roleRef")))
    found += _subjects_causes(kind, obj.get("subjects"))
    if old is not None and old.get("roleRef") != obj.get("roleRef"):
        found.append(invalid_value("roleRef", str(obj.get("roleRef")), "cannot change roleRef"))
    return found


def _rules_causes(rules: object, *, namespaced: bool) -> Iterator[Cause]:
    if rules is None:
        return
    if not isinstance(rules, list):
        yield invalid_value("rules", str(rules), "must be a list of PolicyRules")
        return
    for index, rule in enumerate(rules):
        path = f"rules[{index}]"
        if not isinstance(rule, dict):
            yield invalid_value(path, str(rule), "must be a PolicyRule object")
            continue
        yield from _rule_causes(path, rule, namespaced=namespaced)


def _rule_causes(path: str, rule: JsonObj, *, namespaced: bool) -> Iterator[Cause]:
    if not rule.get("verbs"):
        yield required(f"{path}.verbs", "verbs must contain at least one value")
    urls = rule.get("nonResourceURLs")
    if urls:
        if namespaced:
            why = "namespaced rules cannot apply to non-resource URLs"
            yield invalid_value(f"{path}.nonResourceURLs", str(urls), why)
        if rule.get("apiGroups") or rule.get("resources"):
            why = "rules cannot apply to both regular resources and non-resource URLs"
            yield invalid_value(f"{path}.nonResourceURLs", str(urls), why)
        return
    if not rule.get("apiGroups"):
        yield required(f"{path}.apiGroups", "resource rules must supply at least one api group")
    if not rule.get("resources"):
        yield required(f"{path}.resources", "resource rules must supply at least one resource")


def _role_ref_causes(kind: str, ref: object) -> Iterator[Cause]:
    if not isinstance(ref, dict):
        yield required("roleRef")
        return
    kinds = ("Role", "ClusterRole") if kind == "RoleBinding" else ("ClusterRole",)
    if ref.get("kind") not in kinds:
        yield not_supported("roleRef.kind", ref.get("kind") or "", kinds)
    if ref.get("apiGroup") != RBAC_GROUP:
        yield not_supported("roleRef.apiGroup", ref.get("apiGroup") or "", (RBAC_GROUP,))
    if not ref.get("name"):
        yield required("roleRef.name")


def _subjects_causes(kind: str, subjects: object) -> list[Cause]:
    if subjects is None:
        return []
    if not isinstance(subjects, list):
        return [invalid_value("subjects", str(subjects), "must be a list of Subjects")]
    found: list[Cause] = []
    for index, subject in enumerate(subjects):
        path = f"subjects[{index}]"
        if not isinstance(subject, dict):
            found.append(invalid_value(path, str(subject), "must be a Subject object"))
            continue
        found += _subject_causes(kind, path, subject)
    return found


def _subject_causes(kind: str, path: str, subject: JsonObj) -> list[Cause]:
    found = [] if subject.get("name") else [required(f"{path}.name")]
    subject_kind = subject.get("kind")
    if subject_kind not in _SUBJECT_KINDS:
        return [*found, not_supported(f"{path}.kind", subject_kind or "", _SUBJECT_KINDS)]
    group = subject.get("apiGroup") or ""
    if subject_kind == "ServiceAccount":
        if group:
            found.append(not_supported(f"{path}.apiGroup", group, ("",)))
        if kind == "ClusterRoleBinding" and not subject.get("namespace"):
            found.append(required(f"{path}.namespace"))
    elif group != RBAC_GROUP:
        found.append(not_supported(f"{path}.apiGroup", group, (RBAC_GROUP,)))
    return found
