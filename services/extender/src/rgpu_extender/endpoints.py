"""Only a container that is allocated a server may be pointed at one.

lupine has no access control of its own: whoever reaches a server's port can use its GPUs (and
read what the holder left in them). A container that asks for the resource gets its endpoint
from its own pod's allocation through the downward API (``wiring``); a container that asks for
nothing, in any pod, has no server to be pointed at. So the webhook refuses a ``LUPINE_*``
variable that names a server (any but ``LUPINE_WORKLOAD_ID``) in such a container, however it
is set (literal, from a ConfigMap or Secret key, or from a field), and an ``envFrom`` that
prefixes its keys with ``LUPINE_``.

This catches the manifest that says it outright. It cannot stop a program that dials a server
it learned some other way (a ConfigMap's keys without a prefix, its command line, its code):
without network enforcement, exclusivity is advisory (docs/security.md, the threat model).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rgpu_placement import PodDemand

from .errors import AdmissionDenied
from .objects import mapping, pod_label

__all__ = ["ENDPOINT_PREFIX", "refuse_stray_endpoints"]

ENDPOINT_PREFIX = "LUPINE_"
_NOT_ENDPOINTS = frozenset({"LUPINE_WORKLOAD_ID"})
"""lupine variables that name no server (the workload id only labels the client's usage)."""
SECTIONS = ("initContainers", "containers", "ephemeralContainers")


def refuse_stray_endpoints(
    pod: Mapping[str, Any],
    demand: PodDemand | None,
    *,
    resource: str,
    sections: Iterable[str] = SECTIONS,
) -> None:
    """Raise ``AdmissionDenied`` naming the first container in ``sections`` that sets a lupine
    endpoint without asking for ``resource`` (``demand``: who asks; None: nobody)."""
    asking = (
        set() if demand is None else {(c.slot.section, c.slot.index) for c in demand.requesting}
    )
    spec = mapping(pod.get("spec"))
    for section in sections:
        containers = spec.get(section)
        for index, container in enumerate(containers if isinstance(containers, list) else ()):
            if (section, index) in asking:
                continue
            names = _endpoint_names(mapping(container))
            if names:
                raise AdmissionDenied(
                    _message(pod, section, index, mapping(container), names, resource)
                )


def _endpoint_names(container: Mapping[str, Any]) -> list[str]:
    env = container.get("env")
    names = [
        str(entry.get("name"))
        for entry in (env if isinstance(env, list) else ())
        if _is_endpoint(mapping(entry).get("name"))
    ]
    sources = container.get("envFrom")
    names += [
        f"envFrom prefix {prefix}"
        for source in (sources if isinstance(sources, list) else ())
        if isinstance(prefix := mapping(source).get("prefix"), str)
        and prefix.startswith(ENDPOINT_PREFIX)
    ]
    return names


def _is_endpoint(name: object) -> bool:
    return isinstance(name, str) and name.startswith(ENDPOINT_PREFIX) and name not in _NOT_ENDPOINTS


def _message(
    pod: Mapping[str, Any],
    section: str,
    index: int,
    container: Mapping[str, Any],
    names: list[str],
    resource: str,
) -> str:
    name = container.get("name") or f"{section}[{index}]"
    return (
        f"pod {pod_label(pod)}: container {name!r} (spec.{section}[{index}]) sets "
        f"{', '.join(names)} but asks for no {resource}: only a container allocated a remote "
        f"GPU may point at a lupine server, and its endpoint is wired from the pod's own "
        f"allocation. Remove {', '.join(names)} from that container, or ask for {resource} "
        "in it"
    )
