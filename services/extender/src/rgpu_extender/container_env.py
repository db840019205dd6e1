"""A requesting container reaches its GPU server only through what the webhook writes into its
spec, and filter must be able to tell that it was written; both read the one definition here.

* The endpoint and workload id arrive as env vars wired from the pod's own annotations through
  the downward API, resolved by the kubelet when the container starts, after bind has written
  them.
* A container's ``env`` is a list in which names may repeat (the last one wins) and later
  entries may refer to earlier ones with ``$(NAME)``; setting a variable must respect both, or a
  wired value silently loses to a user's stale literal.
* Lupine does not cap a client's GPU memory, HAMi-core does, from inside the client process
  (``LD_PRELOAD``); the library must reach a container that was built without it, so the webhook
  copies it in from a library image through a shared emptyDir. Paths match HAMi's own
  conventions so existing HAMi-core images and habits keep working.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rgpu_contracts import ANNOTATION_ENDPOINT
from rgpu_placement import PodDemand

from .errors import AdmissionDenied, WebhookMissing
from .objects import mapping, pod_label

__all__ = [
    "ANNOTATION_VISIBLE_DEVICES",
    "CACHE_FILE",
    "COPY_CONTAINER",
    "ENV_ENDPOINT",
    "ENV_VISIBLE_DEVICES",
    "ENV_WORKLOAD_ID",
    "LIB_DIR",
    "LIB_FILE",
    "LIB_SOURCE",
    "LIB_VOLUME",
    "Env",
    "annotation_path",
    "check_wired",
    "copy_container",
    "env_list",
    "field_env",
    "last_entry",
    "lib_env",
    "lib_mount",
    "lib_volume",
    "set_env",
    "wired_env",
]

ENV_ENDPOINT = "LUPINE_SERVER"
ENV_WORKLOAD_ID = "LUPINE_WORKLOAD_ID"
ENV_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ANNOTATION_VISIBLE_DEVICES = "rgpu.io/visible-devices"

Env = list[dict[str, Any]]


def env_list(container: Mapping[str, Any]) -> Env:
    """A fresh copy of the container's env entries (empty when it has none)."""
    env = container.get("env")
    return [dict(mapping(e)) for e in env] if isinstance(env, list) else []


def last_entry(env: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The entry of ``name`` the kubelet would use (the last one), if any."""
    return next((e for e in reversed(env) if e.get("name") == name), None)


def set_env(env: Env, entries: Sequence[dict[str, Any]]) -> Env:
    """Return ``env`` with ``entries`` as the only definitions of their names, in their order.

    The block takes the place of the first existing definition of any of its names, so
    ``$(NAME)`` references after it still resolve; a block of new names goes first, where
    every later entry can refer to it.
    """
    names = {entry["name"] for entry in entries}
    positions = [i for i, e in enumerate(env) if e.get("name") in names]
    at = positions[0] if positions else 0
    before = [e for e in env[:at] if e.get("name") not in names]
    after = [e for e in env[at:] if e.get("name") not in names]
    return [*before, *entries, *after]


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
    # Kubernetes lets the last entry of a duplicated name win, so judge the last one.
    entry = last_entry(env_list(container), ENV_ENDPOINT)
    return entry is not None and _field_path(entry) == annotation_path(ANNOTATION_ENDPOINT)


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


LIB_VOLUME = "hami-remote-gpu-lib"
LIB_DIR = "/hami-remote-gpu"
LIB_FILE = f"{LIB_DIR}/libvgpu.so"
CACHE_FILE = f"{LIB_DIR}/vgpu.cache"
COPY_CONTAINER = "hami-remote-gpu-lib"
LIB_SOURCE = "/k8s-vgpu/lib/nvidia/libvgpu.so"
"""Where HAMi's images ship HAMi-core; the copy container reads it from there."""


def lib_volume() -> dict[str, Any]:
    """The emptyDir the copy container fills and the GPU containers read."""
    return {"name": LIB_VOLUME, "emptyDir": {}}


def lib_mount() -> dict[str, Any]:
    return {"name": LIB_VOLUME, "mountPath": LIB_DIR}


def copy_container(image: str) -> dict[str, Any]:
    """The init container, placed first, that copies the library into the volume."""
    return {
        "name": COPY_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp", "-f", LIB_SOURCE, LIB_FILE],
        "volumeMounts": [lib_mount()],
        # Namespaces with a ResourceQuota on limits refuse containers without them; copying a
        # few MiB needs next to nothing.
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "100m", "memory": "64Mi"},
        },
    }


def _preload(env: Env, container: str) -> str:
    current = last_entry(env, "LD_PRELOAD")
    if current is None:
        return LIB_FILE
    if "valueFrom" in current:
        raise AdmissionDenied(
            f'container "{container}" sets LD_PRELOAD from valueFrom; rgpu must put HAMi-core '
            f"({LIB_FILE}) first in LD_PRELOAD and cannot edit a sourced value; set LD_PRELOAD "
            "as a literal value instead"
        )
    value = str(current.get("value") or "")
    libraries = value.replace(":", " ").split()
    # Already first: the webhook ran before (reinvocation) and must change nothing.
    if libraries[:1] == [LIB_FILE] or not value:
        return value or LIB_FILE
    return f"{LIB_FILE}:{value}"


def lib_env(env: Env, *, memory_mib: int, container: str) -> Env:
    """``env`` with HAMi-core preloaded and capped at ``memory_mib`` per card."""
    preload = _preload(env, container)
    entries = (
        ("LD_PRELOAD", preload),
        ("CUDA_DEVICE_MEMORY_LIMIT", f"{memory_mib}m"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", CACHE_FILE),
    )
    return set_env(env, [{"name": name, "value": value} for name, value in entries])
