"""Which mutating webhooks apply to a request, as kube-apiserver decides it.

A webhook is called when one of its rules matches the request's operation, group, version,
resource/subresource and scope, and both its namespaceSelector (labels of the request's
namespace, or of the Namespace object itself) and its objectSelector (labels of the new or the
old object) match. Configurations are visited in name order, webhooks in listed order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import (
    ConditionError,
    LabelSelector,
    MatchCondition,
    Resource,
    compile_conditions,
    labels_match,
    selector_from_object,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attributes:
    """What is being admitted: kube's admission.Attributes."""

    resource: Resource
    subresource: str
    operation: str
    namespace: str
    name: str
    obj: dict[str, Any] | None
    old: dict[str, Any] | None
    kind: str
    api_version: str
    user: str
    namespace_labels: Mapping[str, str]
    user_info: Mapping[str, Any] | None = None
    """The full UserInfo of a bearer-authenticated requester (uid, groups, extra)."""
    dry_run: bool = False
    warnings: list[str] = field(default_factory=list)
    """What the webhooks' answers warned of (``response.warnings``), in call order: kube sends
    them back to the client as ``Warning`` headers, which kubectl prints."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    operations: frozenset[str]
    groups: frozenset[str]
    versions: frozenset[str]
    resources: tuple[str, ...]
    scope: str

    def matches(self, attrs: Attributes) -> bool:
        return self.covers(attrs.operation, attrs.resource, attrs.subresource)

    def covers(self, operation: str, resource: Resource, subresource: str) -> bool:
        """Whether the rule names this operation on this (sub)resource in its scope."""
        return (
            _listed(self.operations, operation)
            and _listed(self.groups, resource.group)
            and _listed(self.versions, resource.version)
            and any(_resource_matches(p, resource.plural, subresource) for p in self.resources)
            and _scope_matches(self.scope, resource)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook:
    """One webhook of a MutatingWebhookConfiguration, with its defaults applied."""

    name: str
    configuration: str
    rules: tuple[Rule, ...]
    namespace_selector: LabelSelector
    object_selector: LabelSelector
    client_config: Mapping[str, Any]
    failure_policy: str
    timeout_seconds: int
    reinvoke: bool
    match_conditions: tuple[MatchCondition, ...] = ()

    def covers(self, operation: str, resource: Resource, subresource: str) -> bool:
        """Whether a rule names the request (selectors and conditions aside)."""
        return any(rule.covers(operation, resource, subresource) for rule in self.rules)

    def applies_to(self, attrs: Attributes) -> bool:
        if not any(rule.matches(attrs) for rule in self.rules):
            return False
        return selected(self.namespace_selector, self.object_selector, attrs)


def _listed(allowed: frozenset[str], value: str) -> bool:
    return "*" in allowed or value in allowed


def _resource_matches(pattern: str, plural: str, subresource: str) -> bool:
    """'pods' is the main resource only, 'pods/*' its subresources only, '*/*' everything."""
    wanted, slash, wanted_sub = pattern.partition("/")
    if wanted not in ("*", plural):
        return False
    if not slash:
        return subresource == ""
    if wanted_sub == "*":
        return wanted == "*" or subresource != ""
    return wanted_sub == subresource


def _scope_matches(scope: str, resource: Resource) -> bool:
    if scope == "Namespaced":
        return resource.namespaced
    if scope == "Cluster":
        return not resource.namespaced
    return True


def selected(
    namespace_selector: LabelSelector, object_selector: LabelSelector, attrs: Attributes
) -> bool:
    """Whether a request's namespace and object are in scope, as kube-apiserver scopes both its
    admission webhooks and its admission policies."""
    return _namespace_selected(namespace_selector, attrs) and _object_selected(
        object_selector, attrs
    )


def _namespace_selected(selector: LabelSelector, attrs: Attributes) -> bool:
    if attrs.resource.plural == "namespaces":
        return labels_match(selector, _labels(attrs.obj or attrs.old))
    if not attrs.resource.namespaced:
        return True
    return labels_match(selector, attrs.namespace_labels)


def _object_selected(selector: LabelSelector, attrs: Attributes) -> bool:
    candidates = [o for o in (attrs.obj, attrs.old) if o is not None]
    return any(labels_match(selector, _labels(o)) for o in candidates)


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _rule(raw: Mapping[str, Any]) -> Rule:
    return Rule(
        operations=frozenset(raw.get("operations") or ()),
        groups=frozenset(raw.get("apiGroups") or ()),
        versions=frozenset(raw.get("apiVersions") or ()),
        resources=tuple(raw.get("resources") or ()),
        scope=str(raw.get("scope", "*")),
    )


def _webhook(configuration: str, raw: Mapping[str, Any]) -> Webhook | None:
    try:
        namespace_selector = selector_from_object(raw.get("namespaceSelector"))
        object_selector = selector_from_object(raw.get("objectSelector"))
        conditions = compile_conditions(raw.get("matchConditions"))
    except (ApiError, ConditionError):
        # kube rejects such configurations at write time; the simulator skips them instead.
        return None
    return Webhook(
        name=str(raw.get("name", "")),
        configuration=configuration,
        rules=tuple(_rule(r) for r in raw.get("rules") or ()),
        namespace_selector=namespace_selector,
        object_selector=object_selector,
        client_config=raw.get("clientConfig") or {},
        failure_policy=str(raw.get("failurePolicy", "Fail")),
        timeout_seconds=int(raw.get("timeoutSeconds", 10)),
        reinvoke=raw.get("reinvocationPolicy") == "IfNeeded",
        match_conditions=conditions,
    )


def webhooks_of(configurations: Sequence[Mapping[str, Any]]) -> tuple[Webhook, ...]:
    """Every webhook of the given configurations, in kube's calling order."""
    ordered = sorted(configurations, key=lambda c: str(c["metadata"]["name"]))
    hooks = (
        _webhook(str(config["metadata"]["name"]), raw)
        for config in ordered
        for raw in config.get("webhooks") or ()
    )
    return tuple(h for h in hooks if h is not None)
