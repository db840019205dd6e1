"""Field numbers of the Kubernetes kinds the simulator decodes from protobuf.

Taken from each kind's ``generated.proto`` in k8s.io/api and k8s.io/apimachinery (numbers
never change once released) and checked against what kubectl 1.32 sends. Only kinds that a
client sends as protobuf and the simulator serves are here: the objects of kubectl's ``create``
generators, TokenRequest, Eviction and DeleteOptions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Message:
    """A protobuf message type: field number -> field."""

    name: str
    fields: Mapping[int, Field]


@dataclass(frozen=True, slots=True)
class Field:
    """One field: its JSON name and kind.

    ``kind`` is ``string``, ``bytes`` (base64 in JSON), ``int``, ``bool``, ``message``,
    ``map`` (``map<string, value>``, ``value`` naming the value's kind), ``time``
    (metav1.Time) or ``intstr`` (IntOrString). ``keep_zero`` marks pointer fields and fields
    without ``omitempty``: a zero value there is a value, not "unset".
    """

    name: str
    kind: str
    message: Message | None = None
    repeated: bool = False
    keep_zero: bool = False
    value: str = "string"

    def entry(self) -> Message:
        """A map field's entry message (key = 1, value = 2)."""
        return Message("MapEntry", {1: Field("key", "string"), 2: Field("value", self.value)})


def _strings(name: str) -> Field:
    return Field(name, "string", repeated=True)


def _messages(name: str, message: Message) -> Field:
    return Field(name, "message", message, repeated=True)


def _optional(name: str, kind: str, message: Message | None = None) -> Field:
    return Field(name, kind, message, keep_zero=True)


_OWNER_REFERENCE = Message(
    "OwnerReference",
    {
        1: Field("kind", "string"),
        3: Field("name", "string"),
        4: Field("uid", "string"),
        5: Field("apiVersion", "string"),
        6: _optional("controller", "bool"),
        7: _optional("blockOwnerDeletion", "bool"),
    },
)
OBJECT_META = Message(
    "ObjectMeta",
    {
        1: Field("name", "string"),
        2: Field("generateName", "string"),
        3: Field("namespace", "string"),
        4: Field("selfLink", "string"),
        5: Field("uid", "string"),
        6: Field("resourceVersion", "string"),
        7: Field("generation", "int"),
        8: Field("creationTimestamp", "time"),
        9: Field("deletionTimestamp", "time"),
        10: _optional("deletionGracePeriodSeconds", "int"),
        11: Field("labels", "map"),
        12: Field("annotations", "map"),
        13: _messages("ownerReferences", _OWNER_REFERENCE),
        14: _strings("finalizers"),
    },
)
_PRECONDITIONS = Message(
    "Preconditions", {1: _optional("uid", "string"), 2: _optional("resourceVersion", "string")}
)
DELETE_OPTIONS = Message(
    "DeleteOptions",
    {
        1: _optional("gracePeriodSeconds", "int"),
        2: _optional("preconditions", "message", _PRECONDITIONS),
        3: _optional("orphanDependents", "bool"),
        4: _optional("propagationPolicy", "string"),
        5: _strings("dryRun"),
    },
)
LABEL_SELECTOR = Message(
    "LabelSelector",
    {
        1: Field("matchLabels", "map"),
        2: _messages(
            "matchExpressions",
            Message(
                "LabelSelectorRequirement",
                {1: Field("key", "string"), 2: Field("operator", "string"), 3: _strings("values")},
            ),
        ),
    },
)
_NAMESPACE = Message(
    "Namespace",
    {
        1: Field("metadata", "message", OBJECT_META),
        2: Field("spec", "message", Message("NamespaceSpec", {1: _strings("finalizers")})),
    },
)
_CONFIG_MAP = Message(
    "ConfigMap",
    {
        1: Field("metadata", "message", OBJECT_META),
        2: Field("data", "map"),
        3: Field("binaryData", "map", value="bytes"),
        4: _optional("immutable", "bool"),
    },
)
_OBJECT_REFERENCE = Message(
    "ObjectReference",
    {
        1: Field("kind", "string"),
        2: Field("namespace", "string"),
        3: Field("name", "string"),
        4: Field("uid", "string"),
        5: Field("apiVersion", "string"),
        6: Field("resourceVersion", "string"),
        7: Field("fieldPath", "string"),
    },
)
_SERVICE_ACCOUNT = Message(
    "ServiceAccount",
    {
        1: Field("metadata", "message", OBJECT_META),
        2: _messages("secrets", _OBJECT_REFERENCE),
        3: _messages(
            "imagePullSecrets", Message("LocalObjectReference", {1: Field("name", "string")})
        ),
        4: _optional("automountServiceAccountToken", "bool"),
    },
)
_TOKEN_REQUEST = Message(
    "TokenRequest",
    {
        1: Field("metadata", "message", OBJECT_META),
        2: Field(
            "spec",
            "message",
            Message(
                "TokenRequestSpec",
                {
                    1: _strings("audiences"),
                    3: _optional(
                        "boundObjectRef",
                        "message",
                        Message(
                            "BoundObjectReference",
                            {
                                1: Field("kind", "string"),
                                2: Field("apiVersion", "string"),
                                3: Field("name", "string"),
                                4: Field("uid", "string"),
                            },
                        ),
                    ),
                    4: _optional("expirationSeconds", "int"),
                },
            ),
        ),
    },
)
_PRIORITY_CLASS = Message(
    "PriorityClass",
    {
        1: Field("metadata", "message", OBJECT_META),
        2: _optional("value", "int"),
        3: Field("globalDefault", "bool"),
        4: Field("description", "string"),
        5: _optional("preemptionPolicy", "string"),
    },
)
_DISRUPTION_BUDGET = Message(
    "PodDisruptionBudget",
    {
        1: Field("metadata", "message", OBJECT_META),
        2: Field(
            "spec",
            "message",
            Message(
                "PodDisruptionBudgetSpec",
                {
                    1: _optional("minAvailable", "intstr"),
                    2: _optional("selector", "message", LABEL_SELECTOR),
                    3: _optional("maxUnavailable", "intstr"),
                    4: _optional("unhealthyPodEvictionPolicy", "string"),
                },
            ),
        ),
    },
)
_EVICTION = Message(
    "Eviction",
    {
        1: Field("metadata", "message", OBJECT_META),
        2: _optional("deleteOptions", "message", DELETE_OPTIONS),
    },
)

KINDS: Mapping[str, Message] = MappingProxyType(
    {
        "Namespace": _NAMESPACE,
        "ConfigMap": _CONFIG_MAP,
        "ServiceAccount": _SERVICE_ACCOUNT,
        "TokenRequest": _TOKEN_REQUEST,
        "PriorityClass": _PRIORITY_CLASS,
        "PodDisruptionBudget": _DISRUPTION_BUDGET,
        "Eviction": _EVICTION,
        "DeleteOptions": DELETE_OPTIONS,
    }
)
"""The kinds decoded, by the kind their envelope names."""
