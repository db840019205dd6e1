"""ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding objects: their defaults, kube's
validation when they are written (every CEL expression must compile against the variables kube
declares), and the compiled form the evaluator runs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rgpu_kubesim.apiserver.kinds._webhooks import Attributes, Rule, selected
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import (
    Cause,
    ConditionError,
    EvaluationError,
    LabelSelector,
    MatchCondition,
    Resource,
    compile_condition,
    duplicate,
    invalid_value,
    not_supported,
    required,
    selector_from_object,
    value_of,
)

JsonObj = dict[str, Any]
VARIABLES = frozenset(
    {"object", "oldObject", "request", "params", "namespaceObject", "authorizer", "variables"}
)
"""What kube declares for a policy's expressions."""
FAILURE_POLICIES = ("Fail", "Ignore")
REASONS = ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge")
ACTIONS = ("Deny", "Warn", "Audit")
_RULE_FIELDS = ("operations", "apiGroups", "apiVersions", "resources")
_REQUEST_FIELD = re.compile(r"\brequest\s*\.\s*(\w+)")
_WHOLE_REQUEST = re.compile(r"\brequest\b(?!\s*\.\s*\w)")


@dataclass(frozen=True, slots=True, kw_only=True)
class NamedRule:
    """A resource rule of matchConstraints, with its optional ``resourceNames``."""

    rule: Rule
    names: frozenset[str]

    def matches(self, attrs: Attributes) -> bool:
        return self.rule.matches(attrs) and (not self.names or attrs.name in self.names)

    def could_match(self, operation: str, resource: Resource, subresource: str) -> bool:
        probe = Attributes(
            resource=resource,
            subresource=subresource,
            operation=operation,
            namespace="",
            name="",
            obj=None,
            old=None,
            kind="",
            api_version="",
            user="",
            namespace_labels={},
        )
        return self.rule.matches(probe)


@dataclass(frozen=True, slots=True, kw_only=True)
class Matcher:
    """matchConstraints of a policy or matchResources of a binding (no rules: any)."""

    rules: tuple[NamedRule, ...]
    excluded: tuple[NamedRule, ...]
    namespace_selector: LabelSelector
    object_selector: LabelSelector

    def could_match(self, operation: str, resource: Resource, subresource: str) -> bool:
        return not self.rules or any(
            r.could_match(operation, resource, subresource) for r in self.rules
        )

    def matches(self, attrs: Attributes) -> bool:
        if self.rules and not any(r.matches(attrs) for r in self.rules):
            return False
        if any(r.matches(attrs) for r in self.excluded):
            return False
        return selected(self.namespace_selector, self.object_selector, attrs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    condition: MatchCondition
    message: str
    message_expression: MatchCondition | None
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    name: str
    failure_policy: str
    match: Matcher
    conditions: tuple[MatchCondition, ...]
    variables: tuple[tuple[str, MatchCondition], ...]
    """The variables that depend on the request, in order."""
    constants: Mapping[str, Any]
    """Variables that read nothing of the request (tables, lists), evaluated once."""
    validations: tuple[Validation, ...]
    param_kind: str
    reads: frozenset[str]
    """The request's variables any expression reads (``request``, ``object``, ...): only those
    are converted to CEL for a write, the costliest step of judging one."""
    request_fields: frozenset[str] | None
    """The fields of ``request`` the expressions name, or None when one reads it whole."""

    @property
    def needs_params(self) -> bool:
        return bool(self.param_kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    name: str
    policy_name: str
    match: Matcher | None
    actions: frozenset[str]


def _compile(expression: object) -> MatchCondition:
    return compile_condition("", str(expression or ""), VARIABLES)


def _named_rules(raw: object) -> tuple[NamedRule, ...]:
    rules = []
    for item in raw if isinstance(raw, list) else ():
        rule = Rule(
            operations=frozenset(item.get("operations") or ()),
            groups=frozenset(item.get("apiGroups") or ()),
            versions=frozenset(item.get("apiVersions") or ()),
            resources=tuple(item.get("resources") or ()),
            scope=str(item.get("scope", "*")),
        )
        rules.append(NamedRule(rule=rule, names=frozenset(item.get("resourceNames") or ())))
    return tuple(rules)


def _matcher(raw: Mapping[str, Any]) -> Matcher:
    return Matcher(
        rules=_named_rules(raw.get("resourceRules")),
        excluded=_named_rules(raw.get("excludeResourceRules")),
        namespace_selector=selector_from_object(raw.get("namespaceSelector")),
        object_selector=selector_from_object(raw.get("objectSelector")),
    )


def _reads(condition: MatchCondition) -> set[str]:
    return set(condition.program.variables()) & VARIABLES


def _split_variables(
    raw: object,
) -> tuple[tuple[tuple[str, MatchCondition], ...], dict[str, Any]]:
    """(request-dependent variables, constants): a variable is constant while it and every
    variable before it read nothing but other variables."""
    dynamic: list[tuple[str, MatchCondition]] = []
    constants: dict[str, Any] = {}
    for variable in raw if isinstance(raw, list) else ():
        name, condition = str(variable.get("name")), _compile(variable.get("expression"))
        if not dynamic and _reads(condition) <= {"variables"}:
            try:
                constants[name] = value_of(condition, {"variables": constants})
                continue
            except EvaluationError:
                pass  # left to fail, as kube would, where it is used
        dynamic.append((name, condition))
    return tuple(dynamic), constants


def policy_of(obj: Mapping[str, Any]) -> Policy:
    """The compiled policy (validated when written)."""
    spec = obj.get("spec") or {}
    variables, constants = _split_variables(spec.get("variables"))
    conditions = tuple(
        compile_condition(str(c.get("name")), str(c.get("expression")), VARIABLES)
        for c in spec.get("matchConditions") or ()
    )
    validations = tuple(
        Validation(
            condition=_compile(v.get("expression")),
            message=str(v.get("message") or ""),
            message_expression=_compile(v["messageExpression"])
            if v.get("messageExpression")
            else None,
            reason=str(v.get("reason") or "Invalid"),
        )
        for v in spec.get("validations") or ()
    )
    programs = [*conditions, *(c for _, c in variables)]
    programs += [p for v in validations for p in (v.condition, v.message_expression) if p]
    return Policy(
        name=str(obj["metadata"]["name"]),
        failure_policy=str(spec.get("failurePolicy") or "Fail"),
        match=_matcher(spec.get("matchConstraints") or {}),
        conditions=conditions,
        variables=variables,
        constants=constants,
        validations=validations,
        param_kind=str((spec.get("paramKind") or {}).get("kind") or ""),
        reads=frozenset(name for p in programs for name in _reads(p)),
        request_fields=_request_fields(p.expression for p in programs),
    )


def _request_fields(expressions: Iterable[str]) -> frozenset[str] | None:
    fields: set[str] = set()
    for expression in expressions:
        if _WHOLE_REQUEST.search(expression):
            return None
        fields |= set(_REQUEST_FIELD.findall(expression))
    return frozenset(fields)


def binding_of(obj: Mapping[str, Any]) -> Binding:
    spec = obj.get("spec") or {}
    raw_match = spec.get("matchResources")
    return Binding(
        name=str(obj["metadata"]["name"]),
        policy_name=str(spec.get("policyName") or ""),
        match=_matcher(raw_match) if isinstance(raw_match, dict) else None,
        actions=frozenset(spec.get("validationActions") or ()),
    )


# -- defaults and validation when written ------------------------------------------------------


def apply_defaults(kind: str, obj: JsonObj) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind == "ValidatingAdmissionPolicy":
        spec.setdefault("failurePolicy", "Fail")
        _default_match(spec.get("matchConstraints"))
    else:
        _default_match(spec.get("matchResources"))


def _default_match(match: object) -> None:
    if not isinstance(match, dict):
        return
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for key in ("resourceRules", "excludeResourceRules"):
        for rule in match.get(key) or ():
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


def causes(kind: str, obj: Mapping[str, Any]) -> list[Cause]:
    """Every invalid field of a policy or a binding (kube's wording)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    if kind == "ValidatingAdmissionPolicy":
        return list(_policy_causes(spec))
    return list(_binding_causes(spec))


def _policy_causes(spec: Mapping[str, Any]) -> Iterator[Cause]:
    if spec.get("failurePolicy") not in FAILURE_POLICIES:
        yield not_supported("spec.failurePolicy", spec.get("failurePolicy"), FAILURE_POLICIES)
    match = spec.get("matchConstraints")
    if not isinstance(match, dict):
        yield required("spec.matchConstraints")
    else:
        yield from _match_causes("spec.matchConstraints", match, rules_required=True)
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        why = "validations or auditAnnotations must contain at least one item"
        yield required("spec.validations", why)
    for index, validation in enumerate(spec.get("validations") or ()):
        yield from _validation_causes(f"spec.validations[{index}]", validation)
    for index, variable in enumerate(spec.get("variables") or ()):
        path = f"spec.variables[{index}]"
        if not (variable or {}).get("name"):
            yield required(f"{path}.name")
        yield from _expression_causes(f"{path}.expression", (variable or {}).get("expression"))
    for index, condition in enumerate(spec.get("matchConditions") or ()):
        path = f"spec.matchConditions[{index}]"
        if not (condition or {}).get("name"):
            yield required(f"{path}.name")
        yield from _expression_causes(f"{path}.expression", (condition or {}).get("expression"))


def _match_causes(path: str, match: Mapping[str, Any], *, rules_required: bool) -> Iterator[Cause]:
    rules = match.get("resourceRules")
    if rules_required and not rules:
        yield required(f"{path}.resourceRules")
    for key in ("resourceRules", "excludeResourceRules"):
        for index, rule in enumerate(match.get(key) or ()):
            for field in _RULE_FIELDS:
                if not (rule or {}).get(field):
                    yield required(f"{path}.{key}[{index}].{field}")
    for key in ("namespaceSelector", "objectSelector"):
        try:
            selector_from_object(match.get(key))
        except ApiError as exc:
            yield invalid_value(f"{path}.{key}", str(match.get(key)), str(exc))


def _validation_causes(path: str, validation: Any) -> Iterator[Cause]:
    if not isinstance(validation, dict):
        yield invalid_value(path, str(validation), "must be an object with an expression")
        return
    yield from _expression_causes(f"{path}.expression", validation.get("expression"))
    if validation.get("messageExpression"):
        where = f"{path}.messageExpression"
        yield from _expression_causes(where, validation["messageExpression"])
    reason = validation.get("reason")
    if reason is not None and reason not in REASONS:
        yield not_supported(f"{path}.reason", reason, REASONS)


def _expression_causes(path: str, expression: object) -> Iterator[Cause]:
    if not isinstance(expression, str) or not expression.strip():
        yield required(path)
        return
    try:
        _compile(expression)
    except ConditionError as exc:
        yield invalid_value(path, expression, str(exc))


def _binding_causes(spec: Mapping[str, Any]) -> Iterator[Cause]:
    if not spec.get("policyName"):
        yield required("spec.policyName")
    actions = spec.get("validationActions")
    if not actions or not isinstance(actions, list):
        yield required("spec.validationActions")
        actions = []
    seen: set[str] = set()
    for index, action in enumerate(actions):
        where = f"spec.validationActions[{index}]"
        if action not in ACTIONS:
            yield not_supported(where, action, ACTIONS)
        elif action in seen:
            yield duplicate(where, action)
        seen.add(str(action))
    if {"Deny", "Warn"} <= seen:
        why = "must not contain both Deny and Warn (repeating the same validation failure "
        yield invalid_value(
            "spec.validationActions", str(actions), why + "information is redundant)"
        )
    match = spec.get("matchResources")
    if isinstance(match, dict):
        yield from _match_causes("spec.matchResources", match, rules_required=False)
