"""What each kind means at write time: defaults, validation and the strategies storage
applies per kind, including the models of the policy kinds it validates (RBAC rules, webhook
configurations, admission policies), namespace lifecycle, graceful deletion, priority and
disruption budgets.

The kinds whose rules storage, auth and the endpoints call by name are public modules, bound
by their importers to a private name as the machinery's are: ``strategies`` (defaults,
preparation and validation of every kind), ``namespaces``, ``graceful`` (deletion), ``priority``,
``disruption`` and ``rbac``.
"""

from __future__ import annotations

from rgpu_kubesim.apiserver.kinds._admission_policy_parse import (
    Binding,
    Matcher,
    Policy,
    Validation,
    binding_of,
    policy_of,
)
from rgpu_kubesim.apiserver.kinds._configmaps import (
    entry_count,
)
from rgpu_kubesim.apiserver.kinds._webhooks import (
    Attributes,
    Webhook,
    webhooks_of,
)
from rgpu_kubesim.apiserver.kinds.rbac import AllowedNames, Grant, PolicyRule, Request, RuleIndex

__all__ = [
    "AllowedNames",
    "Attributes",
    "Binding",
    "Grant",
    "Matcher",
    "Policy",
    "PolicyRule",
    "Request",
    "RuleIndex",
    "Validation",
    "Webhook",
    "binding_of",
    "entry_count",
    "policy_of",
    "webhooks_of",
]
