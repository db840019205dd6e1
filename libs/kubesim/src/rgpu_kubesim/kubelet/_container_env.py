"""A container's environment is decided by the kubelet at the moment
the container starts, from the pod as it is *then* — which is exactly when rgpu's endpoint
annotation must already be there. This reproduces the kubelet's resolution of downward-API
``fieldRef``s and of ``$(NAME)`` references, so the emulated kubelet sees what a process would.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["resolve_env"]

_FIELD = re.compile(r"^metadata\.(annotations|labels)\['(.+)'\]$")
_REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")


def resolve_env(pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Resolve every container's env the way the kubelet does, from the pod as it is now.

    Downward-API ``fieldRef``s read the pod (a missing annotation resolves to ``""``, as in
    Kubernetes); literal values expand ``$(NAME)`` from earlier entries and ``$$`` to ``$``.
    """
    spec = pod.get("spec", {})
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    return {str(c["name"]): _container_env(pod, c) for c in containers}


def _container_env(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name = str(entry.get("name", ""))
        if "valueFrom" in entry:
            env[name] = _field_value(pod, entry["valueFrom"] or {})
        else:
            env[name] = _expand(str(entry.get("value", "")), env)
    return env


def _expand(value: str, defined: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return _REFERENCE.sub(substitute, value)


def _field_value(pod: Mapping[str, Any], value_from: Mapping[str, Any]) -> str:
    # Only fieldRef exists here: the simulated cluster has no ConfigMaps or Secrets.
    path = str((value_from.get("fieldRef") or {}).get("fieldPath", ""))
    meta = pod.get("metadata", {})
    match = _FIELD.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    spec, status = pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.uid": meta.get("uid"),
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
    }
    return str(simple.get(path) or "")
