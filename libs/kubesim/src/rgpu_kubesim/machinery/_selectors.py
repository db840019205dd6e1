"""Label and field selectors: parsing kube's selector grammar and matching objects against it.

Lists, watches and admission webhooks all filter by labels; lists and watches also filter by a
small per-resource set of fields. The grammar and the edge cases (``!=``/``notin`` match objects
without the key; unknown field labels are a 400) follow k8s.io/apimachinery.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import status as _status
from rgpu_kubesim.machinery._names import label_value_error, qualified_name_error
from rgpu_kubesim.machinery._resources import Resource

_TOKEN = re.compile(r"\s*(!=|==|=|!|,|\(|\)|<|>|[^\s,=!()<>]+)")
_SET_OPS = {"in": "in", "notin": "notin"}
_BINARY_OPS = {"=": "in", "==": "in", "!=": "notin"}
_EXPRESSION_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement; ``op`` is in, notin, exists, ! (absent), gt or lt."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "in":
            return value is not None and value in self.values
        if self.op == "notin":
            return value is None or value not in self.values
        if self.op == "exists":
            return value is not None
        if self.op == "!":
            return value is None
        return _compare(self.op, value, self.values)


LabelSelector = tuple[Requirement, ...]


@dataclass(frozen=True, slots=True)
class FieldTerm:
    field: str
    value: str
    negated: bool

    def matches(self, fields: Mapping[str, str]) -> bool:
        return (fields.get(self.field, "") == self.value) != self.negated


FieldSelector = tuple[FieldTerm, ...]


def _compare(op: str, value: str | None, bounds: frozenset[str]) -> bool:
    if value is None or not value.lstrip("-").isdigit():
        return False
    bound = int(next(iter(bounds)))
    return int(value) > bound if op == "gt" else int(value) < bound


@dataclass(frozen=True, slots=True)
class Filter:
    """What a list or watch asks for: a namespace (None is every one), labels and fields."""

    namespace: str | None = None
    labels: LabelSelector = ()
    fields: FieldSelector = ()

    def admits(self, namespace: str, labels: Mapping[str, str], fields: Mapping[str, str]) -> bool:
        if self.namespace is not None and namespace != self.namespace:
            return False
        return labels_match(self.labels, labels) and fields_match(self.fields, fields)


def parse_filter(resource: Resource, namespace: str | None, labels: str, fields: str) -> Filter:
    """A Filter from query text; the namespace is dropped for cluster-scoped resources."""
    return Filter(
        namespace if resource.namespaced else None,
        parse_label_selector(labels),
        parse_field_selector(fields, resource),
    )


def labels_match(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    return all(req.matches(labels) for req in selector)


def fields_match(selector: FieldSelector, fields: Mapping[str, str]) -> bool:
    return all(term.matches(fields) for term in selector)


def _parse_error(detail: str) -> ApiError:
    return _status.bad_request(f"unable to parse requirement: {detail}")


class _Tokens:
    """A cursor over selector tokens."""

    def __init__(self, text: str) -> None:
        self.items: list[str] = []
        pos = 0
        while pos < len(text.rstrip()):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise _parse_error(f"unexpected character at {pos} in {text!r}")
            self.items.append(match.group(1))
            pos = match.end()
        self.pos = 0

    def peek(self) -> str | None:
        return self.items[self.pos] if self.pos < len(self.items) else None

    def take(self) -> str | None:
        token = self.peek()
        self.pos += token is not None
        return token

    def expect(self, wanted: str) -> None:
        token = self.take()
        if token != wanted:
            raise _parse_error(f"found '{token or ''}', expected: '{wanted}'")


def _key(token: str | None) -> str:
    if token is None or token in {",", "(", ")", "=", "==", "!=", "!", "<", ">"}:
        raise _parse_error(f"found '{token or ''}', expected: identifier")
    problem = qualified_name_error(token)
    if problem:
        raise _parse_error(f'key: Invalid value: "{token}": {problem}')
    return token


def _value(tokens: _Tokens) -> str:
    token = tokens.peek()
    if token is None or token in {",", ")"}:
        return ""
    tokens.take()
    problem = label_value_error(token)
    if problem:
        raise _parse_error(f'values[0]: Invalid value: "{token}": {problem}')
    return token


def _value_set(tokens: _Tokens) -> frozenset[str]:
    tokens.expect("(")
    values = {_value(tokens)}
    while tokens.peek() == ",":
        tokens.take()
        values.add(_value(tokens))
    tokens.expect(")")
    return frozenset(values)


def _requirement(tokens: _Tokens) -> Requirement:
    if tokens.peek() == "!":
        tokens.take()
        return Requirement(_key(tokens.take()), "!")
    key = _key(tokens.take())
    op = tokens.peek()
    if op is None or op == ",":
        return Requirement(key, "exists")
    tokens.take()
    if op in _BINARY_OPS:
        return Requirement(key, _BINARY_OPS[op], frozenset({_value(tokens)}))
    if op in _SET_OPS:
        return Requirement(key, _SET_OPS[op], _value_set(tokens))
    if op in {">", "<"}:
        return _numeric(key, "gt" if op == ">" else "lt", tokens.take())
    raise _parse_error(f"found '{op}', expected: in, notin, =, ==, !=, gt, lt")


def _numeric(key: str, op: str, token: str | None) -> Requirement:
    if token is None or not token.lstrip("-").isdigit():
        raise _parse_error(f"for 'Gt', 'Lt' operators, the value must be an integer: {token}")
    return Requirement(key, op, frozenset({token}))


def parse_label_selector(text: str) -> LabelSelector:
    """Parse ``labelSelector`` query syntax; raises a 400 ApiError on bad syntax."""
    tokens = _Tokens(text)
    requirements: list[Requirement] = []
    while tokens.peek() is not None:
        requirements.append(_requirement(tokens))
        if tokens.peek() is not None:
            tokens.expect(",")
            if tokens.peek() is None:
                raise _parse_error("found '', expected: identifier")
    return tuple(requirements)


def selector_from_object(raw: Mapping[str, Any] | None) -> LabelSelector:
    """Convert a metav1.LabelSelector (matchLabels + matchExpressions); None/{} matches all."""
    raw = raw or {}
    requirements = [
        Requirement(k, "in", frozenset({str(v)})) for k, v in (raw.get("matchLabels") or {}).items()
    ]
    for expression in raw.get("matchExpressions") or ():
        op = _EXPRESSION_OPS.get(str(expression.get("operator")))
        if op is None:
            raise _parse_error(f"{expression.get('operator')!r} is not a valid label operator")
        values = frozenset(str(v) for v in expression.get("values") or ())
        requirements.append(Requirement(str(expression.get("key", "")), op, values))
    return tuple(requirements)


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append("\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current) + ("\\" if escaped else ""))
    return parts


def _unescape(value: str) -> str:
    out, chars = [], iter(value)
    for char in chars:
        if char != "\\":
            out.append(char)
            continue
        escaped = next(chars, "")
        if escaped not in {"\\", ",", "="}:
            raise _status.bad_request(
                f"invalid field selector: invalid escape sequence: \\{escaped}"
            )
        out.append(escaped)
    return "".join(out)


def _term(text: str, allowed: tuple[str, ...]) -> FieldTerm:
    for op in ("!=", "==", "="):
        field, sep, value = text.partition(op)
        if sep and "\\" not in field:
            if field not in allowed:
                raise _status.bad_request(f"field label not supported: {field}")
            return FieldTerm(field, _unescape(value), op == "!=")
    raise _status.bad_request(f"invalid selector: '{text}'; can't understand '{text}'")


def parse_field_selector(text: str, resource: Resource) -> FieldSelector:
    """Parse ``fieldSelector``; unknown field labels are a 400 as in kube."""
    if not text.strip():
        return ()
    allowed = resource.selectable_fields()
    return tuple(_term(part.strip(), allowed) for part in _split_unescaped(text, ","))


def _field_path(label: str) -> tuple[str, ...]:
    return ("source", "component") if label == "source" else tuple(label.split("."))


def _render(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_values(resource: Resource, obj: Mapping[str, Any]) -> dict[str, str]:
    """The value of every selectable field of ``obj`` (missing fields read as "")."""
    values: dict[str, str] = {}
    for label in resource.selectable_fields():
        node: Any = obj
        for part in _field_path(label):
            node = node.get(part) if isinstance(node, dict) else None
        values[label] = _render(node)
    return values
