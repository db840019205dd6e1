"""The scheduler emulator: kube-scheduler's queue, default filters and extender calls,
against the simulated apiserver.
"""

from __future__ import annotations

from rgpu_kubesim.scheduler._config import SchedulerConfig
from rgpu_kubesim.scheduler._emulator import SchedulerEmulator
from rgpu_kubesim.scheduler._records import PodRecord, Step

__all__ = [
    "PodRecord",
    "SchedulerConfig",
    "SchedulerEmulator",
    "Step",
]
