"""Mapping REST paths to (resource, namespace, name, subresource) and HTTP methods to verbs.

kube's paths are ambiguous to a plain router: ``/api/v1/namespaces/x/status`` is a namespace's
status subresource while ``/api/v1/namespaces/x/pods`` is a namespaced collection. This parser
applies kube's own rule (a third segment that is a namespace subresource is not a resource).
"""

from __future__ import annotations

from dataclasses import dataclass

from rgpu_kubesim.machinery import status as _status
from rgpu_kubesim.machinery._resources import Resource, lookup, require

_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_PODS = require("pods")
_CREATE_ONLY = frozenset({"binding", "token", "eviction"})
"""Subresources that only accept POST (pods/binding, pods/eviction, serviceaccounts/token)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What a request addresses; ``namespace`` None is cluster scope or all namespaces."""

    resource: Resource
    namespace: str | None
    name: str = ""
    subresource: str = ""

    @property
    def fault_key(self) -> str:
        """The resource name fault rules match: ``pods`` or ``pods/binding``."""
        if self.subresource:
            return f"{self.resource.plural}/{self.subresource}"
        return self.resource.plural


def _split(path: str) -> tuple[str, str, list[str]]:
    parts = path.strip("/").split("/")
    if "" in parts:
        raise _status.route_not_found()
    if parts[0] == "api" and len(parts) >= 3:
        return "", parts[1], parts[2:]
    if parts[0] == "apis" and len(parts) >= 4:
        return parts[1], parts[2], parts[3:]
    raise _status.route_not_found()


def parse_target(path: str) -> Target:
    """The target of a resource path; 404 with kube's body for anything not served."""
    group, version, rest = _split(path)
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        raise _status.route_not_found()
    if not group and rest == ["bindings"] and namespace is not None:
        return Target(resource=_PODS, namespace=namespace, subresource="binding")
    resource = lookup(group, version, rest[0])
    if resource is None or (namespace is not None and not resource.namespaced):
        raise _status.route_not_found()
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if subresource and subresource not in resource.subresources:
        raise _status.route_not_found()
    if resource.namespaced and name and namespace is None:
        raise _status.route_not_found()
    return Target(resource=resource, namespace=namespace, name=name, subresource=subresource)


def verb_for(method: str, target: Target, watch: bool) -> str:
    """kube's request verb; 405 for method/path combinations kube does not serve."""
    collection = not target.name
    if method == "GET" and target.subresource not in _CREATE_ONLY:
        return ("watch" if watch else "list") if collection else "get"
    if method == "POST" and target.subresource in _CREATE_ONLY:
        return "create"
    if (
        method == "POST"
        and collection
        and (target.namespace is not None or not target.resource.namespaced)
    ):
        return "create"
    if not collection and target.subresource not in _CREATE_ONLY:
        verb = {"PUT": "update", "PATCH": "patch"}.get(method)
        if verb is None and method == "DELETE" and not target.subresource:
            verb = "delete"
        if verb is not None:
            return verb
    if method == "DELETE" and collection and not target.subresource:
        return "deletecollection"
    raise _status.method_not_allowed()
