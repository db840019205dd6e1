"""Compiling and evaluating matchConditions: kube's matcher rules on the CEL results."""

from __future__ import annotations

import pytest

from rgpu_kubesim.machinery._cel import ConditionError, Verdict, compile_condition, evaluate

POD = {"metadata": {"name": "p", "annotations": {"rgpu.io/x": "1"}}, "spec": {"containers": []}}


def run(*expressions: str, obj: object = POD, old: object = None) -> Verdict:
    compiled = tuple(compile_condition(f"c{i}", e) for i, e in enumerate(expressions))
    variables = {"object": obj, "oldObject": old, "request": {"operation": "CREATE"}}
    return evaluate(compiled, variables)


def test_all_true_calls_the_webhook() -> None:
    assert run("true", "object.metadata.name == 'p'") == Verdict(matches=True)


def test_one_false_skips_whatever_the_others_do() -> None:
    assert run("object.nope == 1", "false", "true") == Verdict(matches=False)


def test_several_errors_are_reported_together() -> None:
    verdict = run("object.a == 1", "object.b == 1")
    assert not verdict.matches
    assert verdict.error.startswith("[expression 'object.a == 1' resulted in error: ")
    assert "expression 'object.b == 1' resulted in error: no such key: b]" in verdict.error


def test_null_old_object_on_create_is_comparable_to_null() -> None:
    expression = "[object, oldObject].exists(o, o != null && has(o.metadata.annotations))"
    assert run(expression).matches
    assert run("oldObject == null").matches


def test_field_of_a_null_object_is_an_error() -> None:
    assert run("object.metadata.name == 'p'", obj=None).error


def test_comprehension_variables_are_not_undeclared_references() -> None:
    compile_condition("c", "object.spec.containers.all(c, c.name != '')")


def test_declared_but_unprovided_authorizer_compiles_and_errs_at_evaluation() -> None:
    expression = "authorizer.group('').resource('pods').check('get').allowed()"
    compile_condition("c", expression)
    assert "authorizer" in run(expression).error


@pytest.mark.parametrize("expression", ["frobnicate(object)", "self.x == 1", "1 +"])
def test_expressions_kube_would_refuse_do_not_compile(expression: str) -> None:
    with pytest.raises(ConditionError, match=r"^compilation failed: ERROR: <input>"):
        compile_condition("c", expression)
