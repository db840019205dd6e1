"""Lupine does not cap a client's GPU memory, HAMi-core does, from
inside the client process (``LD_PRELOAD``); the library must reach a container that was built
without it, so the webhook copies it in from a library image through a shared emptyDir.

Paths match HAMi's own conventions so existing HAMi-core images and habits keep working.
"""

from __future__ import annotations

from typing import Any

from .envlist import Env, last_entry, set_env
from .errors import AdmissionDenied

__all__ = [
    "CACHE_FILE",
    "COPY_CONTAINER",
    "LIB_DIR",
    "LIB_FILE",
    "LIB_SOURCE",
    "LIB_VOLUME",
    "copy_container",
    "lib_env",
    "lib_mount",
    "lib_volume",
]

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
