"""Apiserver calls appear in traces, so a slow filter shows the Lease write that made it slow.

Every request a ``KubeClient`` sends (models, raw fast paths and watches alike) passes through
kubernetes_asyncio's REST client; ``trace_requests`` wraps that one method of one client
instance with a CLIENT span named like kube-apiserver's own request metrics: the HTTP method
and the resource (``PUT leases``, ``POST pods/binding``), never an object's name, so span
names stay bounded. Names, namespaces and the verb go in attributes, and the request carries
``traceparent`` so an apiserver with tracing enabled continues the trace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, TracerProvider

__all__ = ["KubeRequest", "trace_requests"]

Request = Callable[..., Awaitable[Any]]

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
_NAMED = {"pods": "k8s.pod.name", "nodes": "k8s.node.name"}


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeRequest:
    """What one apiserver request addresses, read from its method, path and query."""

    method: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    watch: bool = False

    @classmethod
    def parse(cls, method: str, url: str, query: Sequence[tuple[str, Any]] = ()) -> KubeRequest:
        """Split ``/api/v1/...`` or ``/apis/<group>/<version>/...`` into its parts."""
        parts = [unquote(p) for p in urlsplit(url).path.split("/") if p]
        group, rest = ("", parts[2:]) if parts[:1] == ["api"] else (_at(parts, 1), parts[3:])
        namespace = ""
        if len(rest) > 2 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        watch = any(k == "watch" and str(v).lower() in ("true", "1") for k, v in query)
        return cls(
            method=method.upper(),
            group=group,
            resource=_at(rest, 0),
            name=_at(rest, 1),
            subresource=_at(rest, 2),
            namespace=namespace,
            watch=watch,
        )

    @property
    def span_name(self) -> str:
        target = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.method} {target or '/'}"

    @property
    def verb(self) -> str:
        """The Kubernetes verb (what RBAC and the audit log call it)."""
        if self.method == "GET":
            return "watch" if self.watch else ("get" if self.name else "list")
        if self.method == "DELETE":
            return "delete" if self.name else "deletecollection"
        return _VERBS.get(self.method, self.method.lower())

    def attributes(self, url: str) -> dict[str, str | int]:
        parts = urlsplit(url)
        found: dict[str, str | int] = {
            "http.request.method": self.method,
            "server.address": parts.hostname or "",
            "server.port": parts.port or (443 if parts.scheme == "https" else 80),
            "url.path": parts.path,
            "k8s.verb": self.verb,
            "k8s.resource": self.resource,
        }
        optional = {
            "k8s.api_group": self.group,
            "k8s.subresource": self.subresource,
            "k8s.namespace.name": self.namespace,
            "k8s.object.name": self.name,
        }
        found.update({key: value for key, value in optional.items() if value})
        # OpenTelemetry's Kubernetes conventions name pods and nodes by their own keys, so a
        # Binding or a pod read shows up in a search for the pod.
        named = _NAMED.get(self.resource)
        if named is not None and self.name:
            found[named] = self.name
        return found


def trace_requests(api_client: ApiClient, provider: TracerProvider | None = None) -> None:
    """Give every request ``api_client`` sends from now on a CLIENT span (this instance only)."""
    rest = api_client.rest_client
    tracer = trace.get_tracer(__name__, tracer_provider=provider)
    # An instance attribute shadows the method for this client only: ``GET``/``POST``/...
    # and the ApiClient all go through ``self.request``, and no other client changes.
    setattr(rest, "request", _traced(rest.request, tracer))  # noqa: B010


def _traced(request: Request, tracer: trace.Tracer) -> Request:
    async def traced(
        method: str,
        url: str,
        query_params: Sequence[tuple[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Any:
        target = KubeRequest.parse(method, url, query_params or ())
        attributes = target.attributes(url)
        with tracer.start_as_current_span(
            target.span_name, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            carrier = dict(headers or {})
            propagate.inject(carrier)
            try:
                response = await request(
                    method, url, query_params=query_params, headers=carrier, **kwargs
                )
            except ApiException as exc:
                _answered(span, exc.status or 0)
                raise
            _answered(span, response.status)
            return response

    return traced


def _answered(span: trace.Span, status: int) -> None:
    if status:
        span.set_attribute("http.response.status_code", status)
    if status >= 400:
        span.set_attribute("error.type", str(status))
        span.set_status(trace.StatusCode.ERROR)


def _at(parts: Sequence[str], index: int) -> str:
    return parts[index] if len(parts) > index else ""
