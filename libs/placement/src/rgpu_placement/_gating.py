"""A GPU pod waits behind rgpu's scheduling gate until a server is booked for it, and the
webhook (which adds the gate), the admitter (which lifts it), the extender (which guards it)
and the CLI (which shows who waits) must read a pod's gates the same way.

Kubernetes runs no scheduler on a pod while ``spec.schedulingGates`` is not empty, lets gates
be set only at creation and only removed afterwards. Several controllers may gate one pod
(Kueue, for one, admits a workload by lifting its own gate): rgpu considers a pod only once
its gate is the last one left, so a pod another system has not admitted yet holds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ADMISSION_GATE", "gates_after_admission", "scheduling_gates", "waits_for_rgpu"]

ADMISSION_GATE = "rgpu.io/admission"
"""The scheduling gate rgpu adds at creation and lifts once a server is booked."""


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def scheduling_gates(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the pod's scheduling gates, in order (malformed entries read as nameless)."""
    gates = _object(pod.get("spec")).get("schedulingGates")
    if not isinstance(gates, list):
        return ()
    return tuple(str(_object(g).get("name") or "") for g in gates)


def waits_for_rgpu(gates: tuple[str, ...]) -> bool:
    """Whether rgpu's gate is the only one left: the pod is rgpu's to admit now."""
    return gates == (ADMISSION_GATE,)


def gates_after_admission(gates: tuple[str, ...]) -> list[dict[str, str]]:
    """The ``spec.schedulingGates`` a pod keeps once rgpu's gate is lifted."""
    return [{"name": g} for g in gates if g != ADMISSION_GATE]
