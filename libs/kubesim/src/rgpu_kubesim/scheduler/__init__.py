"""The scheduler emulator: kube-scheduler's queue, default filters and extender calls,
against the simulated apiserver.
"""

from __future__ import annotations

from rgpu_kubesim.scheduler._emulator import (
    PodRecord,
    SchedulerConfig,
    SchedulerEmulator,
    Step,
)

__all__ = [
    "PodRecord",
    "SchedulerConfig",
    "SchedulerEmulator",
    "Step",
]
