"""The embedded stack keeps its services' spans in a file a person (and ``rgpu trace``) can
read without a trace store: one JSON object per span and line, appended as spans arrive.

A line holds what a waterfall needs and what a search needs: ids in the W3C hex forms, the
service, name, kind, start and end (Unix nanoseconds), status, attributes and links::

    {"trace_id": "4bf9...", "span_id": "00f0...", "parent_id": "", "service": "rgpu-extender",
     "name": "POST /filter", "kind": "server", "start_ns": ..., "end_ns": ..., "status": "ok",
     "message": "", "attributes": {"k8s.pod.uid": "..."}, "links": [{"trace_id": ...,
     "span_id": ..., "attributes": {...}}]}

Spans arrive as OTLP ``ExportTraceServiceRequest`` messages (what every OpenTelemetry SDK
sends); ``records_of`` flattens one into these records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = ["LinkRecord", "SpanRecord", "read_spans", "records_of"]

Scalar = str | int | float | bool

_KINDS = {
    Span.SpanKind.SPAN_KIND_INTERNAL: "internal",
    Span.SpanKind.SPAN_KIND_SERVER: "server",
    Span.SpanKind.SPAN_KIND_CLIENT: "client",
    Span.SpanKind.SPAN_KIND_PRODUCER: "producer",
    Span.SpanKind.SPAN_KIND_CONSUMER: "consumer",
}
_STATUSES = {Status.STATUS_CODE_OK: "ok", Status.STATUS_CODE_ERROR: "error"}


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkRecord:
    """A span's link to another span (the pod's creation, say)."""

    trace_id: str
    span_id: str
    attributes: Mapping[str, Scalar]

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "attributes": dict(self.attributes),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanRecord:
    """One finished span as the file keeps it."""

    trace_id: str
    span_id: str
    parent_id: str
    """Empty for the first span of a trace."""
    service: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    """``ok``, ``error`` or ``unset`` (the usual status of a span that did not fail)."""
    message: str
    attributes: Mapping[str, Scalar]
    links: tuple[LinkRecord, ...] = ()

    @property
    def seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    def attribute(self, key: str) -> str:
        """An attribute as text ("" when absent)."""
        value = self.attributes.get(key)
        return "" if value is None else str(value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "service": self.service,
            "name": self.name,
            "kind": self.kind,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "status": self.status,
            "message": self.message,
            "attributes": dict(self.attributes),
            "links": [link.to_dict() for link in self.links],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SpanRecord:
        """A record from one line's object; raises ``KeyError``/``TypeError``/``ValueError``."""
        links = tuple(
            LinkRecord(
                trace_id=str(link["trace_id"]),
                span_id=str(link["span_id"]),
                attributes=dict(link.get("attributes") or {}),
            )
            for link in raw.get("links") or ()
        )
        return cls(
            trace_id=str(raw["trace_id"]),
            span_id=str(raw["span_id"]),
            parent_id=str(raw.get("parent_id") or ""),
            service=str(raw.get("service") or ""),
            name=str(raw["name"]),
            kind=str(raw.get("kind") or "internal"),
            start_ns=int(raw["start_ns"]),
            end_ns=int(raw["end_ns"]),
            status=str(raw.get("status") or "unset"),
            message=str(raw.get("message") or ""),
            attributes=dict(raw.get("attributes") or {}),
            links=links,
        )


def records_of(request: ExportTraceServiceRequest) -> Iterator[SpanRecord]:
    """Every span of one OTLP export request, with its resource's ``service.name``."""
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                yield _record(span, service)


def _record(span: Span, service: str) -> SpanRecord:
    return SpanRecord(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        service=service,
        name=span.name,
        kind=_KINDS.get(span.kind, "internal"),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        status=_STATUSES.get(span.status.code, "unset"),
        message=span.status.message,
        attributes=_attributes(span.attributes),
        links=tuple(
            LinkRecord(
                trace_id=link.trace_id.hex(),
                span_id=link.span_id.hex(),
                attributes=_attributes(link.attributes),
            )
            for link in span.links
        ),
    )


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Scalar]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Scalar:
    which = value.WhichOneof("value")
    if which in ("string_value", "bool_value", "int_value", "double_value"):
        scalar: Scalar = getattr(value, which)
        return scalar
    if which == "array_value":
        return ", ".join(str(_value(item)) for item in value.array_value.values)
    return ""


def read_spans(path: Path) -> list[SpanRecord]:
    """Every readable span in the file; a line cut short (a write in progress) is skipped.

    Raises ``OSError`` when the file cannot be read.
    """
    found: list[SpanRecord] = []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            try:
                found.append(SpanRecord.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return found
