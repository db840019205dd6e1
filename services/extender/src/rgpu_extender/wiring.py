"""A requesting container finds its GPU server only through env vars the
webhook wires from the pod's own annotations (downward API), resolved by the kubelet when the
container starts, after bind has written them. The webhook writes this wiring and the filter
checks it, so both read the one definition here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rgpu_contracts import ANNOTATION_ENDPOINT
from rgpu_placement import PodDemand

from .errors import WebhookMissing
from .pods import mapping, pod_label

__all__ = [
    "ANNOTATION_VISIBLE_DEVICES",
    "ENV_ENDPOINT",
    "ENV_VISIBLE_DEVICES",
    "ENV_WORKLOAD_ID",
    "annotation_path",
    "check_wired",
    "field_env",
    "wired_env",
]

ENV_ENDPOINT = "LUPINE_SERVER"
ENV_WORKLOAD_ID = "LUPINE_WORKLOAD_ID"
ENV_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ANNOTATION_VISIBLE_DEVICES = "rgpu.io/visible-devices"


def annotation_path(key: str) -> str:
    """The downward-API field path of one annotation (the form the kubelet resolves)."""
    return f"metadata.annotations['{key}']"


def field_env(name: str, field_path: str) -> dict[str, Any]:
    """An env entry sourced from a pod field through the downward API."""
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def wired_env(*, card_mode: bool) -> tuple[dict[str, Any], ...]:
    """The entries every requesting container carries, in order."""
    entries = [
        field_env(ENV_ENDPOINT, annotation_path(ANNOTATION_ENDPOINT)),
        field_env(ENV_WORKLOAD_ID, "metadata.uid"),
    ]
    if card_mode:
        entries.append(field_env(ENV_VISIBLE_DEVICES, annotation_path(ANNOTATION_VISIBLE_DEVICES)))
    return tuple(entries)


def _field_path(entry: Mapping[str, Any]) -> str | None:
    ref = mapping(mapping(entry.get("valueFrom")).get("fieldRef"))
    path = ref.get("fieldPath")
    return path if isinstance(path, str) else None


def _endpoint_wired(container: Mapping[str, Any]) -> bool:
    env = container.get("env")
    entries = [mapping(e) for e in env] if isinstance(env, list) else []
    # Kubernetes lets the last entry of a duplicated name win, so judge the last one.
    named = [e for e in entries if e.get("name") == ENV_ENDPOINT]
    return bool(named) and _field_path(named[-1]) == annotation_path(ANNOTATION_ENDPOINT)


def check_wired(pod: Mapping[str, Any], demand: PodDemand) -> None:
    """Raise ``WebhookMissing`` unless every requesting container reads its endpoint annotation."""
    for container in demand.requesting:
        if not _endpoint_wired(container.slot.body):
            raise WebhookMissing(
                f"pod {pod_label(pod)} was not mutated by the rgpu admission webhook: container "
                f'"{container.slot.name}" has no {ENV_ENDPOINT} env sourced from '
                f"{annotation_path(ANNOTATION_ENDPOINT)}, so it could not find its GPU server; "
                "check that the MutatingWebhookConfiguration is installed and selects this "
                "namespace, then recreate the pod"
            )
