"""ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): CEL rules kube-apiserver itself
enforces on writes, with no webhook to call.

A policy applies to a write when one of its bindings and the policy's own ``matchConstraints``
match it (operation, group, version, resource/subresource, ``resourceNames``, scope, namespace
and object selectors, minus ``excludeResourceRules``) and its ``matchConditions`` hold. Its
``variables`` are evaluated in order, then each ``validations`` expression must be true; the
first false one denies the write when the binding's ``validationActions`` include ``Deny``,
with kube's message and the validation's ``reason`` (422 Invalid by default). An expression
that fails follows the policy's ``failurePolicy``. Evaluated after the mutating webhooks, on
the object about to be stored, with ``object``, ``oldObject``, ``request``, ``variables`` and
``namespaceObject`` (its name and labels). Not supported: ``paramKind``/``paramRef`` (a policy
that needs params fails by its failurePolicy), the ``authorizer`` variable (likewise), and the
``Warn``/``Audit`` actions, which are accepted and report nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from rgpu_kubesim.apiserver.kinds import (
    Attributes,
    Binding,
    Matcher,
    Policy,
    Validation,
    binding_of,
    policy_of,
)
from rgpu_kubesim.apiserver.storage import Change, Storage
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import (
    EvaluationError,
    Refusal,
    Refusals,
    Resource,
    context_of,
    evaluate,
    require,
    value_of,
)
from rgpu_kubesim.machinery import status as _status

if TYPE_CHECKING:
    import cel

_POLICIES = require("validatingadmissionpolicies")
_BINDINGS = require("validatingadmissionpolicybindings")
_DECISIONS_KEPT = 4096
_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Denial:
    """What a policy decided against a write: kube's message and the validation's reason."""

    message: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pair:
    policy: Policy
    binding: Binding
    decisions: dict[bytes, _Denial | None] = field(default_factory=dict)
    """Decisions by what the policy read of the write: a Lease renewed again and again by the
    same account is judged once (CEL's conversion of the inputs costs ~0.1 ms a write)."""


class AdmissionPolicies:
    """Every ValidatingAdmissionPolicy and its bindings, compiled once per change."""

    def __init__(self, storage: Storage, refusals: Refusals | None = None) -> None:
        self._storage = storage
        self._refusals = refusals or Refusals()
        self._pairs: tuple[_Pair, ...] | None = None
        self._needed: dict[tuple[str, str, str], bool] = {}
        storage.observe(_POLICIES.plural, self._invalidate)
        storage.observe(_BINDINGS.plural, self._invalidate)

    def _invalidate(self, change: Change) -> None:
        self._pairs = None
        self._needed.clear()

    def _compiled(self) -> tuple[_Pair, ...]:
        if self._pairs is None:
            policies = {e.name: policy_of(e.decode()) for e in self._storage.entries(_POLICIES)}
            bindings = sorted(
                (binding_of(e.decode()) for e in self._storage.entries(_BINDINGS)),
                key=lambda b: b.name,
            )
            self._pairs = tuple(
                _Pair(policy=policies[b.policy_name], binding=b)
                for b in bindings
                if b.policy_name in policies
            )
        return self._pairs

    def needed(self, operation: str, resource: Resource, subresource: str) -> bool:
        """Whether any bound policy's rules could match such a write (cached per kind)."""
        key = (operation, resource.plural, subresource)
        found = self._needed.get(key)
        if found is None:
            found = self._needed[key] = any(
                p.policy.match.could_match(operation, resource, subresource)
                for p in self._compiled()
            )
        return found

    def validate(self, attrs: Attributes) -> None:
        """Raise the denial of the first bound policy that refuses ``attrs``."""
        for pair in self._compiled():
            if _applies(pair, attrs):
                denial = _decision(pair, attrs)
                if denial is not None:
                    error = _forbidden(attrs, denial)
                    self._refused(attrs, error)
                    raise error

    def _refused(self, attrs: Attributes, error: ApiError) -> None:
        resource = attrs.resource.plural
        self._refusals.add(
            Refusal(
                user=attrs.user,
                verb=attrs.operation.lower(),
                resource=f"{resource}/{attrs.subresource}" if attrs.subresource else resource,
                namespace=attrs.namespace,
                name=attrs.name,
                message=str(error),
            )
        )


def _applies(pair: _Pair, attrs: Attributes) -> bool:
    matchers: tuple[Matcher, ...] = (pair.policy.match,)
    if pair.binding.match is not None:
        matchers += (pair.binding.match,)
    return all(m.matches(attrs) for m in matchers)


def _decision(pair: _Pair, attrs: Attributes) -> _Denial | None:
    values = _inputs(pair.policy, attrs)
    key = orjson.dumps(values)
    try:
        return pair.decisions[key]
    except KeyError:
        if len(pair.decisions) >= _DECISIONS_KEPT:
            pair.decisions.clear()
        decided = pair.decisions[key] = _judge(pair, values)
        return decided


def _judge(pair: _Pair, values: dict[str, Any]) -> _Denial | None:
    """The first denial of the policy's checks over ``values``, in kube's order: match
    conditions, then each validation; an expression that fails follows the failurePolicy."""
    policy = pair.policy
    context = context_of(values | {"variables": _variables(policy, values)})
    if policy.conditions:
        verdict = evaluate(policy.conditions, context)
        if verdict.error:
            return _failed(pair, verdict.error)
        if not verdict.matches:
            return None
    if policy.needs_params:
        return _failed(
            pair, f"failed to configure policy: paramKind {policy.param_kind} is not supported"
        )
    for validation in policy.validations:
        denial = _validated(pair, validation, context)
        if denial is not None:
            return denial
    return None


def _validated(pair: _Pair, validation: Validation, context: cel.Context) -> _Denial | None:
    try:
        passed = value_of(validation.condition, context)
    except EvaluationError as exc:
        return _failed(pair, str(exc))
    if passed is True:
        return None
    if not isinstance(passed, bool):
        why = f"expected a bool, got {type(passed).__name__}"
        return _failed(
            pair, f"expression '{validation.condition.expression}' resulted in error: {why}"
        )
    return _deny(pair, _message(validation, context), validation.reason)


def _variables(policy: Policy, context: Mapping[str, Any]) -> dict[str, Any]:
    """Each variable in order, seeing the earlier ones; a failing one is left out, so the
    validations that use it fail (kube evaluates them lazily to the same effect)."""
    values: dict[str, Any] = dict(policy.constants)
    for name, condition in policy.variables:
        try:
            values[name] = value_of(condition, {**context, "variables": values})
        except EvaluationError:
            continue
    return values


def _message(validation: Validation, context: cel.Context) -> str:
    if validation.message_expression is not None:
        try:
            text = value_of(validation.message_expression, context)
        except EvaluationError:
            text = None
        if isinstance(text, str) and text.strip():
            return text.strip()
    return validation.message or f"failed expression: {validation.condition.expression}"


def _failed(pair: _Pair, why: str) -> _Denial | None:
    return _deny(pair, why, "Invalid") if pair.policy.failure_policy == "Fail" else None


def _deny(pair: _Pair, message: str, reason: str) -> _Denial | None:
    if "Deny" not in pair.binding.actions:
        return None  # Warn and Audit report nothing here (see the module docstring)
    text = (
        f"ValidatingAdmissionPolicy '{pair.policy.name}' with binding '{pair.binding.name}' "
        f"denied request: {message}"
    )
    return _Denial(message=text, reason=reason or "Invalid")


def _forbidden(attrs: Attributes, denial: _Denial) -> ApiError:
    """kube's admission.NewForbidden, re-coded by the validation's reason."""
    resource, text = attrs.resource, denial.message
    label = f'{resource.qualified} "{attrs.name}"' if attrs.name else resource.qualified
    details = _status.resource_details(resource, attrs.name, causes=[{"message": text}])
    code = _CODES.get(denial.reason, 422)
    message = f"{label} is forbidden: {text}"
    return _status.failure(code, message, reason=denial.reason, details=details)


def _inputs(policy: Policy, attrs: Attributes) -> dict[str, Any]:
    """What the policy's expressions read of this write (only that is converted to CEL)."""
    values = {k: v for k, v in _context(attrs).items() if k in policy.reads}
    fields = policy.request_fields
    if "request" in values and fields is not None:
        values["request"] = {k: v for k, v in values["request"].items() if k in fields}
    return values


def _context(attrs: Attributes) -> dict[str, Any]:
    resource = attrs.resource
    kind = {"group": resource.group, "version": resource.version, "kind": attrs.kind}
    gvr = {"group": resource.group, "version": resource.version, "resource": resource.plural}
    user = attrs.user_info or {"username": attrs.user, "groups": ["system:authenticated"]}
    request: dict[str, Any] = {
        "kind": kind,
        "resource": gvr,
        "subResource": attrs.subresource,
        "requestKind": kind,
        "requestResource": gvr,
        "requestSubResource": attrs.subresource,
        "name": attrs.name,
        "namespace": attrs.namespace,
        "operation": attrs.operation,
        "userInfo": dict(user),
        "dryRun": attrs.dry_run,
    }
    namespace = None
    if attrs.namespace:
        labels = dict(attrs.namespace_labels)
        namespace = {"metadata": {"name": attrs.namespace, "labels": labels}}
    return {
        "object": attrs.obj,
        "oldObject": attrs.old,
        "request": request,
        "params": None,
        "namespaceObject": namespace,
    }
