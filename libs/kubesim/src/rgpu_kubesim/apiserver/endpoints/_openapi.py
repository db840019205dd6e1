"""The least OpenAPI v3 that lets ``kubectl create -f`` work without ``--validate=false``.

kubectl validates manifests by asking the server to (``fieldValidation=Strict``) when the
OpenAPI v3 document of the object's group/version lists that query parameter on the PATCH
operation of the object's kind; otherwise it downloads full schemas to validate locally. The
simulator publishes only that PATCH operation per kind; the known fields it checks the
parameter against are listed in ``_fields`` (unknown ones: 400 under Strict, dropped with a
Warning header otherwise).
"""

from __future__ import annotations

from typing import Any

from rgpu_kubesim.machinery import Resource, group_versions, in_group_version

JsonObj = dict[str, Any]
_HASH = "kubesim-1"


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def root() -> JsonObj:
    """GET /openapi/v3: where each group/version's document lives."""
    paths = {}
    for group, version in group_versions():
        path = _gv_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={_HASH}"}
    return {"paths": paths}


def _item_path(resource: Resource) -> str:
    scope = "namespaces/{namespace}/" if resource.namespaced else ""
    return f"/{_gv_path(resource.group, resource.version)}/{scope}{resource.plural}/{{name}}"


def _patch_operation(resource: Resource) -> JsonObj:
    gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
    parameter = {
        "name": "fieldValidation",
        "in": "query",
        "description": "Ignore, Warn (default) or Strict: what to do with unknown fields",
        "schema": {"type": "string", "uniqueItems": True},
    }
    return {
        "x-kubernetes-group-version-kind": gvk,
        "x-kubernetes-action": "patch",
        "parameters": [parameter],
        "responses": {"200": {"description": "OK"}},
    }


def group_version(group: str, version: str) -> JsonObj | None:
    """GET /openapi/v3/api(s)/...: one PATCH operation per served kind, or None."""
    served = in_group_version(group, version)
    if not served:
        return None
    paths = {_item_path(r): {"patch": _patch_operation(r)} for r in served}
    info = {"title": "Kubernetes (rgpu kubesim)", "version": "v1.32.0"}
    return {"openapi": "3.0.0", "info": info, "paths": paths, "components": {"schemas": {}}}
