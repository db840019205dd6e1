"""Discovery documents (/version, /api, /api/v1, /apis, /apis/<group>[/<version>]).

Unmodified clients (kubectl above all) find resources through these before they make any
request; the answers must list exactly what the simulator serves, with the same shapes as
kube-apiserver's legacy (non-aggregated) discovery.
"""

from __future__ import annotations

from typing import Any

from rgpu_kubesim.machinery import (
    SUBRESOURCE_KINDS,
    VERBS,
    Resource,
    group_versions,
    in_group_version,
)

JsonObj = dict[str, Any]

_SUBRESOURCE_VERBS = {
    "status": ["get", "patch", "update"],
    "binding": ["create"],
    "token": ["create"],
    "eviction": ["create"],
    "finalize": ["update"],
}


def version_info() -> JsonObj:
    return {
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-kubesim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> JsonObj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(group: str) -> JsonObj:
    versions = [
        {"groupVersion": f"{group}/{v}", "version": v} for g, v in group_versions() if g == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def api_group_list() -> JsonObj:
    groups = dict.fromkeys(g for g, _ in group_versions() if g)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in groups]}


def api_group(group: str) -> JsonObj | None:
    if not any(g == group for g, _ in group_versions()) or not group:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group)}


def _resource_entry(resource: Resource) -> JsonObj:
    entry: JsonObj = {
        "name": resource.plural,
        "singularName": resource.singular,
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": list(resource.verbs or VERBS),
    }
    if resource.short_names:
        entry["shortNames"] = list(resource.short_names)
    if resource.categories:
        entry["categories"] = list(resource.categories)
    return entry


_SUBRESOURCE_GROUPS = {
    "eviction": ("policy", "v1"),
    "token": ("authentication.k8s.io", "v1"),
}
"""Subresources served in another group's kind; kubectl drain finds the Eviction API by it."""


def _subresource_entry(resource: Resource, sub: str) -> JsonObj:
    kind = SUBRESOURCE_KINDS[sub] or resource.kind
    entry: JsonObj = {
        "name": f"{resource.plural}/{sub}",
        "singularName": "",
        "namespaced": resource.namespaced,
    }
    if sub in _SUBRESOURCE_GROUPS:
        entry["group"], entry["version"] = _SUBRESOURCE_GROUPS[sub]
    return {**entry, "kind": kind, "verbs": _SUBRESOURCE_VERBS[sub]}


def resource_list(group: str, version: str) -> JsonObj | None:
    served = in_group_version(group, version)
    if not served:
        return None
    entries = []
    if not group:
        binding = {
            "name": "bindings",
            "singularName": "binding",
            "namespaced": True,
            "kind": "Binding",
        }
        entries.append({**binding, "verbs": ["create"]})
    for resource in served:
        entries.append(_resource_entry(resource))
        entries += [_subresource_entry(resource, sub) for sub in resource.subresources]
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    }
