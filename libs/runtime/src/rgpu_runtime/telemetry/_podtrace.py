"""A GPU pod's scheduling is one story: created, admitted, filtered, bound, committed.

Those steps happen in different services, at different times, mostly in requests that carry
no trace context of the pod (kube-scheduler sends none), so they cannot share one trace.
They are joined the way OpenTelemetry joins causally related traces: by span links. The
webhook writes its span's context into the pod at CREATE, as a W3C ``traceparent`` in the
annotation ``rgpu.io/trace``; every later step that handles the pod links its span to that
creation (``link_creation``), and every span about a pod names it with OpenTelemetry's
Kubernetes conventions (``k8s.namespace.name``, ``k8s.pod.name``, ``k8s.pod.uid``). A trace
store then finds the whole story by the pod's uid, and each step opens the creation.

The annotation is only ever turned into a link, never into a parent, so a value a pod's
author supplied cannot put spans into someone else's trace; an unreadable value is ignored.

Work done for a pod outside any request (the admitter's booking) starts its own trace with
``pod_span``, linked to the creation: such a trace is sampled as request work, not as
background (``_sampling``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rgpu_contracts import PodRef

__all__ = [
    "CREATION_LINK",
    "TRACE_ANNOTATION",
    "PodCreations",
    "creation_context",
    "creation_of",
    "link_creation",
    "pod_attributes",
    "pod_span",
    "traceparent_of",
]

TRACE_ANNOTATION = "rgpu.io/trace"
"""The pod annotation holding its creation's span context (a W3C ``traceparent``)."""
CREATION_LINK = {"rgpu.link": "pod.creation"}
"""The attributes of a link to the creation, so tools tell it from other links."""
TRACEPARENT = "traceparent"
CREATIONS_KEPT = 10_000
"""Creations remembered by uid (``PodCreations``): more than the pods any one scheduler has
between a filter and its bind, at about 150 bytes each."""

_PROPAGATOR = TraceContextTextMapPropagator()


def pod_attributes(*, namespace: str, name: str, uid: str = "") -> dict[str, str]:
    """The span attributes naming a pod, by OpenTelemetry's Kubernetes conventions; empty
    parts are left out (a pod has no uid yet at admission)."""
    found = {"k8s.namespace.name": namespace, "k8s.pod.name": name, "k8s.pod.uid": uid}
    return {key: value for key, value in found.items() if value}


def traceparent_of(span: Span) -> str | None:
    """``span``'s context as a W3C ``traceparent``, or ``None`` when it has none."""
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def creation_context(value: object) -> SpanContext | None:
    """The span context in a ``traceparent`` value, or ``None`` when it is not one."""
    if not isinstance(value, str) or len(value) > 256:
        return None
    context = trace.get_current_span(_PROPAGATOR.extract({TRACEPARENT: value.strip()}))
    found = context.get_span_context()
    return found if found.is_valid else None


def creation_of(pod: Mapping[str, object]) -> SpanContext | None:
    """The creation recorded on a pod object (``metadata.annotations['rgpu.io/trace']``)."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None
    return creation_context(annotations.get(TRACE_ANNOTATION))


def link_creation(span: Span, creation: SpanContext | None) -> None:
    """Link ``span`` to the pod's creation, when it is known."""
    if creation is not None and span.is_recording():
        span.add_link(creation, CREATION_LINK)


@contextmanager
def pod_span(
    tracer: trace.Tracer,
    name: str,
    pod: PodRef,
    *,
    creation: SpanContext | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """Start ``name`` as the current span of a new trace about ``pod``, linked to its creation.

    For work done for a pod outside any request, such as admitting it: the span starts a
    trace of its own (whatever span is current), named by the pod's attributes; pass the
    pod's ``creation_of(pod)`` so the story joins up. Apiserver and peer calls inside it
    become its children.
    """
    links = [] if creation is None else [Link(creation, CREATION_LINK)]
    attributes = pod_attributes(namespace=pod.namespace, name=pod.name, uid=pod.uid)
    with tracer.start_as_current_span(
        name, context=Context(), kind=kind, attributes=attributes, links=links
    ) as span:
        yield span


class PodCreations:
    """Creations seen on pods, by uid, for steps that get only the uid (kube-scheduler's
    ``/bind``); the oldest are forgotten past ``limit``."""

    def __init__(self, limit: int = CREATIONS_KEPT) -> None:
        self._limit = limit
        self._known: OrderedDict[str, SpanContext] = OrderedDict()

    def remember(self, uid: str, creation: SpanContext | None) -> None:
        """Note ``uid``'s creation (nothing when it is unknown)."""
        if not uid or creation is None:
            return
        self._known[uid] = creation
        self._known.move_to_end(uid)
        while len(self._known) > self._limit:
            self._known.popitem(last=False)

    def get(self, uid: str) -> SpanContext | None:
        """``uid``'s creation, if it was seen and not forgotten yet."""
        return self._known.get(uid)
