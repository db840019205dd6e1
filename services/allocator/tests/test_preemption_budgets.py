"""Which pods a PodDisruptionBudget's selector covers, as the set-of-victims check reads it
(the check itself runs against kubesim in test_preemption.py)."""

from __future__ import annotations

import pytest

from rgpu_allocator.budgets import selects

LABELS = {"app": "train", "tier": "batch"}


@pytest.mark.parametrize(
    ("selector", "covered"),
    [
        pytest.param({}, True, id="empty-selects-every-pod"),
        pytest.param(None, False, id="missing-selects-none"),
        pytest.param({"matchLabels": {"app": "train"}}, True, id="matchLabels-equal"),
        pytest.param({"matchLabels": {"app": "serve"}}, False, id="matchLabels-differ"),
        pytest.param({"matchLabels": {"team": "x"}}, False, id="matchLabels-missing-key"),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["batch"]}]},
            True,
            id="In",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["batch"]}]},
            False,
            id="NotIn",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["x"]}]},
            True,
            id="NotIn-missing-key",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "app", "operator": "Exists"}]}, True, id="Exists"
        ),
        pytest.param(
            {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
            False,
            id="DoesNotExist",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "app", "operator": "Near"}]}, False, id="unknown-op"
        ),
        pytest.param(
            {
                "matchLabels": {"app": "train"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["serve"]}],
            },
            False,
            id="every-term-must-hold",
        ),
    ],
)
def test_a_budget_selector_covers_a_pod_as_kubernetes_matches_labels(selector, covered):
    assert selects(selector, LABELS) is covered
