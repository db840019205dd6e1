"""The kubelet emulator: runs the pods bound to its nodes, dials their lupine servers,
leases pod addresses and reports pod status as a kubelet would.
"""

from __future__ import annotations

from rgpu_kubesim.kubelet._emulator import (
    DIAL_ANNOTATION,
    ENV_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    Dialed,
    KubeletConfig,
    KubeletEmulator,
    LupineClientSink,
    RunRecord,
    dial,
    resolve_env,
)

__all__ = [
    "DIAL_ANNOTATION",
    "ENV_ANNOTATION",
    "RUN_SECONDS_ANNOTATION",
    "Dialed",
    "KubeletConfig",
    "KubeletEmulator",
    "LupineClientSink",
    "RunRecord",
    "dial",
    "resolve_env",
]
