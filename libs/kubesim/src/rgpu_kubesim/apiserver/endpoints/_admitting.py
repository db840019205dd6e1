"""Admission in kube-apiserver's order for one write: mutating webhooks, then
ValidatingAdmissionPolicies, then validating webhooks, each given the attributes a real
apiserver passes (the object with its type, the old one, the user, the namespace's labels)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.requests import Request

from rgpu_kubesim.apiserver.endpoints import _requests
from rgpu_kubesim.apiserver.endpoints._deps import Deps
from rgpu_kubesim.apiserver.kinds import Attributes
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import SUBRESOURCE_KINDS, Entry, Target, full_object, require

__all__ = ["AdmissionStep"]

JsonObj = dict[str, Any]
_NAMESPACES = require("namespaces")


class AdmissionStep:
    """The admission of the writes one server handles."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def admit(
        self,
        request: Request,
        target: Target,
        operation: str,
        obj: JsonObj | None,
        old: Entry | None,
        *,
        name: str = "",
        dry_run: bool = False,
    ) -> JsonObj | None:
        admission, policies = self.deps.admission, self.deps.policies
        webhooks = admission.needed(operation, target.resource, target.subresource)
        if not webhooks and not policies.needed(operation, target.resource, target.subresource):
            return obj
        resource, namespace = target.resource, target.namespace or ""
        kind = SUBRESOURCE_KINDS.get(target.subresource) or resource.kind
        attrs = Attributes(
            resource=resource,
            subresource=target.subresource,
            operation=operation,
            namespace=namespace,
            name=name or target.name or str(((obj or {}).get("metadata") or {}).get("name", "")),
            obj=_with_type(kind, resource.api_version, obj),
            old=full_object(resource, old) if old is not None else None,
            kind=kind,
            api_version=resource.api_version,
            user=_requests.user_of(request, self.deps.default_user, self.deps.user_agents),
            namespace_labels=self._namespace_labels(namespace),
            user_info=_requests.user_info_of(request),
            dry_run=dry_run,
        )
        if not webhooks:
            policies.validate(attrs)
            return obj
        # Read back by the write's answer as Warning headers (``_warned``), whatever happens next.
        request.state.admission_warnings = attrs.warnings
        admitted = await admission.admit(attrs)
        mutated = attrs if admitted is attrs.obj else replace(attrs, obj=admitted)
        # kube's order: mutating webhooks, then admission policies, then validating webhooks.
        policies.validate(mutated)
        await admission.validate(mutated)
        # The very object sent in comes back when no webhook patched it: the caller's own
        # (already normalized) copy is then still the object to store.
        return obj if admitted is attrs.obj else admitted

    async def admitted(
        self,
        request: Request,
        target: Target,
        operation: str,
        obj: JsonObj,
        old: Entry | None,
        *,
        name: str = "",
        dry_run: bool = False,
    ) -> JsonObj:
        """Admit a write whose object exists; webhooks can patch it but never remove it."""
        admitted = await self.admit(
            request, target, operation, obj, old, name=name, dry_run=dry_run
        )
        return obj if admitted is None else admitted

    def _namespace_labels(self, namespace: str) -> dict[str, str]:
        try:
            return (
                dict(self.deps.storage.get(_NAMESPACES, "", namespace).labels) if namespace else {}
            )
        except ApiError:
            return {}


def _with_type(kind: str, api_version: str, obj: JsonObj | None) -> JsonObj | None:
    if obj is None:
        return None
    return {
        "kind": kind,
        "apiVersion": api_version,
        **{k: v for k, v in obj.items() if k not in {"kind", "apiVersion"}},
    }
