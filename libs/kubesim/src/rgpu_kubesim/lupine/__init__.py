"""Fake lupine servers: the remote-GPU protocol over real loopback sockets, each server's
cards and clients, its Prometheus metrics, and the client side the kubelet dials with.
"""

from __future__ import annotations

from rgpu_kubesim.lupine._dial import (
    Dialed,
    dial,
)
from rgpu_kubesim.lupine._fake import (
    DEFAULT_CUDA_VERSION,
    DEFAULT_DEVICE_TYPE,
    DEFAULT_GPU_MEMORY_BYTES,
    FakeLupine,
    LupineClient,
    LupineSpec,
    run_lupine,
    start_lupine,
)
from rgpu_kubesim.lupine._fleet import LupineFleet, open_lupine_fleet
from rgpu_kubesim.lupine._state import (
    LupineGpu,
    Mode,
)

__all__ = [
    "DEFAULT_CUDA_VERSION",
    "DEFAULT_DEVICE_TYPE",
    "DEFAULT_GPU_MEMORY_BYTES",
    "Dialed",
    "FakeLupine",
    "LupineClient",
    "LupineFleet",
    "LupineGpu",
    "LupineSpec",
    "Mode",
    "dial",
    "open_lupine_fleet",
    "run_lupine",
    "start_lupine",
]
