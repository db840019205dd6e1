"""Each verb's trace must say which pod it served and open that pod's creation, so a trace
store finds a pod's whole scheduling story (``rgpu_runtime``'s pod-story helpers).

kube-scheduler sends no trace context, so each ``/filter``, ``/prioritize`` and ``/bind``
starts a trace of its own; its first span (the request's) is named after the pod by
OpenTelemetry's Kubernetes conventions and linked to the creation the webhook recorded in the
pod's ``rgpu.io/trace``. ``/bind`` carries no pod object, only its uid, so the creation
``/filter`` saw is remembered by uid (``PodCreations``) for the bind that follows.

These read the raw request before the verb validates it and must never fail on it: a body
that is not what it should be simply names no pod here, and the verb answers as it does.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from rgpu_runtime.telemetry import PodCreations, creation_of, link_creation, pod_attributes

from .objects import mapping

__all__ = ["note_binding", "note_pod"]

NAME_LIMIT = 253
"""Characters kept of a name or uid read from an unvalidated body (a DNS subdomain's most)."""


def note_pod(raw: object, creations: PodCreations) -> None:
    """Name the pod of an ExtenderArgs body on the current span and link its creation."""
    pod = mapping(_field(raw, "Pod"))
    meta = mapping(pod.get("metadata"))
    uid = _text(meta.get("uid"))
    span = trace.get_current_span()
    span.set_attributes(
        pod_attributes(
            namespace=_text(meta.get("namespace")), name=_text(meta.get("name")), uid=uid
        )
    )
    creation = creation_of(pod)
    link_creation(span, creation)
    creations.remember(uid, creation)


def note_binding(raw: object, creations: PodCreations) -> None:
    """Name the pod of an ExtenderBindingArgs body on the current span and link the creation
    its ``/filter`` saw."""
    uid = _text(_field(raw, "PodUID"))
    namespace, name = _text(_field(raw, "PodNamespace")), _text(_field(raw, "PodName"))
    span = trace.get_current_span()
    span.set_attributes(pod_attributes(namespace=namespace, name=name, uid=uid))
    link_creation(span, creations.get(uid))


def _field(raw: object, name: str) -> Any:
    # kube-scheduler's JSON decoding matches field names without regard to case, and the
    # contracts accept what it accepts.
    for key, value in mapping(raw).items():
        if isinstance(key, str) and key.lower() == name.lower():
            return value
    return None


def _text(value: object) -> str:
    return value[:NAME_LIMIT] if isinstance(value, str) else ""
