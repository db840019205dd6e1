"""Known fields per kind, for server-side field validation (``fieldValidation``).

kube-apiserver decodes request bodies against the kind's schema: an unknown field is refused
under ``Strict`` (400, ``strict decoding error: unknown field "spec.foo"``), dropped with a
``Warning`` header under ``Warn`` (the default) and dropped silently under ``Ignore``. The
simulator knows the fields of every kind it serves down to these depths:

* every kind: the top level and ``metadata`` (ObjectMeta);
* Pod: ``spec`` (PodSpec), containers and init containers (Container, with ``resources``,
  ``env`` and ``env[].valueFrom.fieldRef``), ``tolerations``, and the top level of ``status``;
* Node: the top level of ``spec`` and ``status``; Namespace: ``spec`` and ``status``;
* Lease: ``spec``; Event and ConfigMap: their top level;
* Mutating and ValidatingWebhookConfiguration: each webhook, its ``clientConfig`` (and
  ``service``) and ``rules``.

Below those (affinity, probes, volumes, status entries, ...) any content is accepted as is.
Duplicate fields are not detected: the JSON decoder keeps the last one, as ``Ignore`` would.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeAlias

from rgpu_kubesim.machinery import Resource
from rgpu_kubesim.machinery import status as _status

Shape: TypeAlias = "Mapping[str, Shape] | tuple[Shape] | None"
"""None: anything; a mapping: an object with exactly these fields; a 1-tuple: a list of it."""


def _object(*names: str, **nested: Shape) -> Mapping[str, Shape]:
    return MappingProxyType({**dict.fromkeys(names), **nested})


_META = _object(
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)
_ENV = _object(
    "name",
    "value",
    valueFrom=_object(
        "resourceFieldRef",
        "configMapKeyRef",
        "secretKeyRef",
        fieldRef=_object("apiVersion", "fieldPath"),
    ),
)
_CONTAINER = _object(
    "args",
    "command",
    "envFrom",
    "image",
    "imagePullPolicy",
    "lifecycle",
    "livenessProbe",
    "name",
    "ports",
    "readinessProbe",
    "resizePolicy",
    "restartPolicy",
    "securityContext",
    "startupProbe",
    "stdin",
    "stdinOnce",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "tty",
    "volumeDevices",
    "volumeMounts",
    "workingDir",
    env=(_ENV,),
    resources=_object("limits", "requests", "claims"),
)
_POD_SPEC = _object(
    "activeDeadlineSeconds",
    "affinity",
    "automountServiceAccountToken",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "ephemeralContainers",
    "hostAliases",
    "hostIPC",
    "hostNetwork",
    "hostPID",
    "hostUsers",
    "hostname",
    "imagePullSecrets",
    "nodeName",
    "nodeSelector",
    "os",
    "overhead",
    "preemptionPolicy",
    "priority",
    "priorityClassName",
    "readinessGates",
    "resourceClaims",
    "resources",
    "restartPolicy",
    "runtimeClassName",
    "schedulerName",
    "schedulingGates",
    "securityContext",
    "serviceAccount",
    "serviceAccountName",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "subdomain",
    "terminationGracePeriodSeconds",
    "topologySpreadConstraints",
    "volumes",
    containers=(_CONTAINER,),
    initContainers=(_CONTAINER,),
    tolerations=(_object("key", "operator", "value", "effect", "tolerationSeconds"),),
)
_POD_STATUS = _object(
    "conditions",
    "containerStatuses",
    "ephemeralContainerStatuses",
    "hostIP",
    "hostIPs",
    "initContainerStatuses",
    "message",
    "nominatedNodeName",
    "phase",
    "podIP",
    "podIPs",
    "qosClass",
    "reason",
    "resize",
    "resourceClaimStatuses",
    "startTime",
)
_NODE_SPEC = _object(
    "configSource", "externalID", "podCIDR", "podCIDRs", "providerID", "taints", "unschedulable"
)
_NODE_STATUS = _object(
    "addresses",
    "allocatable",
    "capacity",
    "conditions",
    "config",
    "daemonEndpoints",
    "features",
    "images",
    "nodeInfo",
    "phase",
    "runtimeHandlers",
    "volumesAttached",
    "volumesInUse",
)
_LEASE_SPEC = _object(
    "acquireTime",
    "holderIdentity",
    "leaseDurationSeconds",
    "leaseTransitions",
    "renewTime",
    "preferredHolder",
    "strategy",
)
_WEBHOOK_FIELDS = (
    "admissionReviewVersions",
    "failurePolicy",
    "matchConditions",
    "matchPolicy",
    "name",
    "namespaceSelector",
    "objectSelector",
    "sideEffects",
    "timeoutSeconds",
)
_WEBHOOK_PARTS: Mapping[str, Shape] = MappingProxyType(
    {
        "clientConfig": _object(
            "caBundle", "url", service=_object("name", "namespace", "path", "port")
        ),
        "rules": (_object("apiGroups", "apiVersions", "operations", "resources", "scope"),),
    }
)
_WEBHOOK = _object(*_WEBHOOK_FIELDS, "reinvocationPolicy", **_WEBHOOK_PARTS)
_VALIDATING_WEBHOOK = _object(*_WEBHOOK_FIELDS, **_WEBHOOK_PARTS)
_TYPE = ("apiVersion", "kind")
KINDS: Mapping[str, Mapping[str, Shape]] = MappingProxyType(
    {
        "pods": _object(*_TYPE, metadata=_META, spec=_POD_SPEC, status=_POD_STATUS),
        "nodes": _object(*_TYPE, metadata=_META, spec=_NODE_SPEC, status=_NODE_STATUS),
        "namespaces": _object(
            *_TYPE,
            metadata=_META,
            spec=_object("finalizers"),
            status=_object("phase", "conditions"),
        ),
        "leases": _object(*_TYPE, metadata=_META, spec=_LEASE_SPEC),
        "events": _object(
            *_TYPE,
            "action",
            "count",
            "eventTime",
            "firstTimestamp",
            "involvedObject",
            "lastTimestamp",
            "message",
            "reason",
            "related",
            "reportingComponent",
            "reportingInstance",
            "series",
            "source",
            "type",
            metadata=_META,
        ),
        "mutatingwebhookconfigurations": _object(*_TYPE, metadata=_META, webhooks=(_WEBHOOK,)),
        "validatingwebhookconfigurations": _object(
            *_TYPE, metadata=_META, webhooks=(_VALIDATING_WEBHOOK,)
        ),
        "configmaps": _object(*_TYPE, "data", "binaryData", "immutable", metadata=_META),
    }
)


def prune(plural: str, obj: Any) -> list[str]:
    """Remove the fields ``plural``'s schema does not know from ``obj``; return their paths."""
    shape = KINDS.get(plural)
    if shape is None or not _has_unknown(shape, obj):
        return []
    return _prune(shape, obj, "")


def may_add_unknown(plural: str, patch: Any) -> bool:
    """Whether a merge or strategic merge ``patch`` could bring a field the schema does not
    know into a stored (known-clean) object: only its own fields can, so only they are read
    (directives such as ``$patch`` and ``$setElementOrder/...`` are not fields)."""
    shape = KINDS.get(plural)
    return shape is not None and _has_unknown(shape, patch, directives=True)


def _has_unknown(shape: Shape, value: Any, *, directives: bool = False) -> bool:
    """Whether ``value`` holds a field ``shape`` does not know: every write asks, nearly every
    answer is no, so this walk builds no paths (``_prune`` does, when one is found)."""
    if isinstance(shape, Mapping) and isinstance(value, dict):
        for key, child in value.items():
            if key not in shape:
                if directives and str(key).startswith("$"):
                    continue
                return True
            inner = shape[key]
            if inner is not None and _has_unknown(inner, child, directives=directives):
                return True
        return False
    if isinstance(shape, tuple) and isinstance(value, list):
        return any(_has_unknown(shape[0], item, directives=directives) for item in value)
    return False


def _prune(shape: Shape, value: Any, path: str) -> list[str]:
    if isinstance(shape, Mapping) and isinstance(value, dict):
        found = []
        for key in list(value):
            child = f"{path}.{key}" if path else str(key)
            if key in shape:
                found += _prune(shape[key], value[key], child)
            else:
                del value[key]
                found.append(child)
        return found
    if isinstance(shape, tuple) and isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _prune(shape[0], item, f"{path}[{i}]")]
    return []


def enforce(resource: Resource, obj: Any, directive: str, *, body: bool = True) -> tuple[str, ...]:
    """Apply ``fieldValidation`` to a decoded object (in place); return the Warning texts.

    A refused request body reads as kube's decoding error (``Pod in version "v1" cannot be
    handled as a Pod: strict decoding error: ...``); a refused patch result (``body=False``)
    as the bare strict decoding error.
    """
    unknown = prune(resource.plural, obj)
    if not unknown or directive == "Ignore":
        return ()
    texts = tuple(f'unknown field "{path}"' for path in unknown)
    if directive != "Strict":
        return texts
    why = "strict decoding error: " + ", ".join(texts)
    raise _status.undecodable(resource, why) if body else _status.bad_request(why)
