"""Field numbers of the RBAC and access-review kinds kubectl sends as protobuf.

``kubectl auth can-i`` posts a SelfSubjectAccessReview (``--list``: a SelfSubjectRulesReview)
and ``kubectl create role|clusterrole|rolebinding|clusterrolebinding`` the object itself, each
in protobuf only; the numbers are those of k8s.io/api's rbac/v1 and authorization/v1
``generated.proto``. A review's ``extra`` (a map of messages) is skipped as an unknown field.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rgpu_kubesim.apiserver.endpoints._protobuf_schema import (
    LABEL_SELECTOR,
    OBJECT_META,
    Field,
    Message,
)


def _strings(name: str) -> Field:
    return Field(name, "string", repeated=True)


def _messages(name: str, message: Message) -> Field:
    return Field(name, "message", message, repeated=True)


def _metadata() -> Field:
    return Field("metadata", "message", OBJECT_META)


_POLICY_RULE = Message(
    "PolicyRule",
    {
        1: _strings("verbs"),
        2: _strings("apiGroups"),
        3: _strings("resources"),
        4: _strings("resourceNames"),
        5: _strings("nonResourceURLs"),
    },
)
_ROLE = Message("Role", {1: _metadata(), 2: _messages("rules", _POLICY_RULE)})
_CLUSTER_ROLE = Message(
    "ClusterRole",
    {
        1: _metadata(),
        2: _messages("rules", _POLICY_RULE),
        3: Field(
            "aggregationRule",
            "message",
            Message("AggregationRule", {1: _messages("clusterRoleSelectors", LABEL_SELECTOR)}),
        ),
    },
)
_SUBJECT = Message(
    "Subject",
    {
        1: Field("kind", "string"),
        2: Field("apiGroup", "string"),
        3: Field("name", "string"),
        4: Field("namespace", "string"),
    },
)
_ROLE_REF = Message(
    "RoleRef",
    {1: Field("apiGroup", "string"), 2: Field("kind", "string"), 3: Field("name", "string")},
)


def _binding(kind: str) -> Message:
    return Message(
        kind,
        {
            1: _metadata(),
            2: _messages("subjects", _SUBJECT),
            3: Field("roleRef", "message", _ROLE_REF),
        },
    )


_RESOURCE_ATTRIBUTES = Message(
    "ResourceAttributes",
    {
        1: Field("namespace", "string"),
        2: Field("verb", "string"),
        3: Field("group", "string"),
        4: Field("version", "string"),
        5: Field("resource", "string"),
        6: Field("subresource", "string"),
        7: Field("name", "string"),
    },
)
_NON_RESOURCE_ATTRIBUTES = Message(
    "NonResourceAttributes", {1: Field("path", "string"), 2: Field("verb", "string")}
)
_SELF_SPEC = Message(
    "SelfSubjectAccessReviewSpec",
    {
        1: Field("resourceAttributes", "message", _RESOURCE_ATTRIBUTES),
        2: Field("nonResourceAttributes", "message", _NON_RESOURCE_ATTRIBUTES),
    },
)
_SUBJECT_SPEC = Message(
    "SubjectAccessReviewSpec",
    {
        1: Field("resourceAttributes", "message", _RESOURCE_ATTRIBUTES),
        2: Field("nonResourceAttributes", "message", _NON_RESOURCE_ATTRIBUTES),
        3: Field("user", "string"),
        4: _strings("groups"),
        6: Field("uid", "string"),
    },
)


def _review(kind: str, spec: Message) -> Message:
    return Message(kind, {1: _metadata(), 2: Field("spec", "message", spec)})


RBAC_KINDS: Mapping[str, Message] = MappingProxyType(
    {
        "Role": _ROLE,
        "ClusterRole": _CLUSTER_ROLE,
        "RoleBinding": _binding("RoleBinding"),
        "ClusterRoleBinding": _binding("ClusterRoleBinding"),
        "SelfSubjectAccessReview": _review("SelfSubjectAccessReview", _SELF_SPEC),
        "SubjectAccessReview": _review("SubjectAccessReview", _SUBJECT_SPEC),
        "LocalSubjectAccessReview": _review("LocalSubjectAccessReview", _SUBJECT_SPEC),
        "SelfSubjectRulesReview": _review(
            "SelfSubjectRulesReview",
            Message("SelfSubjectRulesReviewSpec", {1: Field("namespace", "string")}),
        ),
    }
)
"""The kinds decoded here, by the kind their envelope names."""
