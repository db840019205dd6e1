"""CEL matchConditions of admission webhooks, compiled and evaluated for real.

kube-apiserver calls a webhook only when every one of its matchConditions is true; a false one
skips it, and an evaluation error follows the webhook's failurePolicy. rgpu's own webhook relies
on this to see exactly the pods it must judge, so the simulator evaluates the expressions with a
real CEL implementation instead of assuming "true". Anything this implementation cannot do is an
error, never a match. Expressions that do not compile, or name variables or functions kube does
not declare, are refused when the configuration is written, as kube-apiserver refuses them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rgpu_kubesim.machinery._names import qualified_name_error
from rgpu_kubesim.machinery.status import Cause
from rgpu_kubesim.machinery.validation import invalid_value, required

if TYPE_CHECKING:
    import cel

MAX_CONDITIONS = 64
DECLARED_VARIABLES = frozenset({"object", "oldObject", "request", "namespaceObject", "authorizer"})
"""What kube declares for a webhook's matchConditions (``authorizer`` is not provided here)."""
_MACRO_BINDING = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")
_DECLARED_FUNCTIONS = frozenset(
    {
        # CEL's standard definitions
        *("size", "contains", "startsWith", "endsWith", "matches", "type", "dyn"),
        *("int", "uint", "double", "string", "bytes", "bool", "duration", "timestamp"),
        *("getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear"),
        *("getHours", "getMilliseconds", "getMinutes", "getMonth", "getSeconds"),
        # kube's CEL libraries (strings, lists, regex, URLs, quantities, IPs, optionals)
        *("charAt", "indexOf", "lastIndexOf", "lowerAscii", "upperAscii", "replace", "split"),
        *("substring", "trim", "join", "format", "quote", "reverse", "find", "findAll"),
        *("isSorted", "sum", "min", "max", "slice", "flatten", "distinct", "sort"),
        *("isURL", "url", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath"),
        *("getQuery", "isQuantity", "quantity", "sign", "isGreaterThan", "isLessThan"),
        *("compareTo", "add", "sub", "asInteger", "asApproximateFloat", "isInteger"),
        *("ip", "isIP", "cidr", "isCIDR", "family", "isUnspecified", "isLoopback"),
        *("containsIP", "containsCIDR", "prefixLength", "masked", "orValue", "value", "hasValue"),
        *("of", "none", "path", "group", "resource", "namespace", "name", "subresource"),
        *("check", "allowed", "reason", "errored", "error", "serviceAccount", "fieldSelector"),
        *("labelSelector", "validate", "optMap", "optFlatMap"),
    }
)


class ConditionError(Exception):
    """An expression that does not compile, or that references what kube does not declare."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MatchCondition:
    """One compiled matchCondition."""

    name: str
    expression: str
    program: cel.Program = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Whether to call the webhook; ``error`` is set when the failurePolicy must decide."""

    matches: bool
    error: str = ""


def _operator(name: str) -> bool:
    return not name[:1].isalpha()


def compile_condition(
    name: str, expression: str, declared: frozenset[str] = DECLARED_VARIABLES
) -> MatchCondition:
    """The compiled condition; ConditionError with kube's wording if kube would refuse it
    (a reference to a variable outside ``declared`` included)."""
    # Imported on first use: the package's own import pulls in its command-line interface,
    # close to a second of start-up that only configurations with matchConditions need.
    import cel

    try:
        program = cel.compile(expression)
    except (ValueError, RuntimeError, TypeError) as exc:
        text = str(exc)
        detail = text[text.find("ERROR:") :] if "ERROR:" in text else f"ERROR: {text}"
        raise ConditionError(f"compilation failed: {detail}") from exc
    bound = set(_MACRO_BINDING.findall(expression))
    unknown = sorted(set(program.variables()) - bound - declared)
    unknown += sorted(
        f for f in program.functions() if not _operator(f) and f not in _DECLARED_FUNCTIONS
    )
    if unknown:
        why = f"undeclared reference to '{unknown[0]}' (in container '')"
        raise ConditionError(f"compilation failed: ERROR: <input>: {why}")
    return MatchCondition(name=name, expression=expression, program=program)


def compile_conditions(raw: object) -> tuple[MatchCondition, ...]:
    """Every condition of a stored webhook (validated when it was written)."""
    if not isinstance(raw, list):
        return ()
    return tuple(
        compile_condition(str(c.get("name", "")), str(c.get("expression", ""))) for c in raw
    )


class EvaluationError(Exception):
    """An expression that failed at run time; the message is kube's ("... resulted in error")."""


def context_of(variables: Mapping[str, Any]) -> cel.Context:
    """The variables converted to CEL once, for several expressions to run against (each run
    over a plain mapping converts all of it again)."""
    import cel

    return cel.Context(variables=dict(variables))


def value_of(condition: MatchCondition, variables: Mapping[str, Any] | cel.Context) -> object:
    """What the expression evaluates to, over a mapping or a ``context_of``; EvaluationError
    when it fails."""
    if isinstance(variables, Mapping):
        variables = dict(variables)
    try:
        return condition.program.execute(variables)
    except KeyError as exc:
        why = f"no such key: {exc.args[0] if exc.args else ''}"
        raise EvaluationError(_failed(condition, why)) from exc
    except (RuntimeError, TypeError, ValueError, ArithmeticError) as exc:
        raise EvaluationError(_failed(condition, str(exc))) from exc


def _outcome(condition: MatchCondition, variables: Mapping[str, Any] | cel.Context) -> bool | str:
    try:
        result = value_of(condition, variables)
    except EvaluationError as exc:
        return str(exc)
    if not isinstance(result, bool):
        return _failed(condition, f"expected a bool, got {type(result).__name__}")
    return result


def _failed(condition: MatchCondition, why: str) -> str:
    return f"expression '{condition.expression}' resulted in error: {why}"


def evaluate(
    conditions: Sequence[MatchCondition], variables: Mapping[str, Any] | cel.Context
) -> Verdict:
    """kube's matcher: any false skips; else any error is for the failurePolicy; else call."""
    errors: list[str] = []
    for condition in conditions:
        outcome = _outcome(condition, variables)
        if outcome is False:
            return Verdict(matches=False)
        if isinstance(outcome, str):
            errors.append(outcome)
    if errors:
        joined = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
        return Verdict(matches=False, error=joined)
    return Verdict(matches=True)


def match_condition_causes(path: str, raw: object) -> list[Cause]:
    """Validation of one webhook's ``matchConditions`` (names, count, expressions)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        return [invalid_value(path, raw, "must be a list of {name, expression}")]
    causes = list(_condition_causes(path, raw))
    if len(raw) > MAX_CONDITIONS:
        detail = f"Too many: {len(raw)}: must have at most {MAX_CONDITIONS} items"
        causes.append(Cause(field=path, reason="FieldValueTooMany", detail=detail))
    return causes


def _condition_causes(path: str, raw: list[Any]) -> Iterator[Cause]:
    seen: set[str] = set()
    for index, condition in enumerate(raw):
        where = f"{path}[{index}]"
        if not isinstance(condition, dict):
            yield invalid_value(where, condition, "must be an object with name and expression")
            continue
        yield from _name_causes(f"{where}.name", condition.get("name"), seen)
        yield from _expression_causes(f"{where}.expression", condition.get("expression"))


def _name_causes(where: str, name: object, seen: set[str]) -> Iterator[Cause]:
    if not isinstance(name, str) or not name:
        yield required(where)
        return
    problem = qualified_name_error(name)
    if problem:
        yield invalid_value(where, name, problem)
    if name in seen:
        yield Cause(field=where, reason="FieldValueDuplicate", detail=f'Duplicate value: "{name}"')
    seen.add(name)


def _expression_causes(where: str, expression: object) -> Iterator[Cause]:
    if not isinstance(expression, str) or not expression.strip():
        yield required(where)
        return
    try:
        compile_condition("", expression)
    except ConditionError as exc:
        yield invalid_value(where, expression, str(exc))
