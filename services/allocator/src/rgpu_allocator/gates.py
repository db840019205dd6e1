"""Lifting rgpu's scheduling gate is the moment a pod passes from admission to kube-scheduler,
and it must remove only rgpu's gate, never another system's (Kueue's, say) and never on a pod
that changed in a way the decision did not see: so it is an update against the pod's
``resourceVersion``, re-read and retried when the pod moved on meanwhile. The same update
writes the booking onto the pod (``rgpu.io/booking``): kube-scheduler hands the extender the
pod with every ``/filter``, which then reads the booking there instead of looking it up.
"""

from __future__ import annotations

import enum

from rgpu_contracts import ANNOTATION_BOOKING, BookingNote
from rgpu_placement import gates_after_admission
from rgpu_runtime.errors import KubeConflict, KubeNotFound

from .clients import KubeApi
from .pods import PodInfo, pod_info

__all__ = ["ATTEMPTS", "Lifted", "lift_gate"]

ATTEMPTS = 4
"""Tries when the pod keeps changing under us (each re-reads it)."""


class Lifted(enum.Enum):
    """How lifting a gate ended."""

    LIFTED = "lifted"
    ALREADY = "already"
    """Someone (a leader before us) lifted it already."""
    GONE = "gone"
    """The pod is gone (or another pod took its name)."""
    CONTENDED = "contended"
    """The pod kept changing; the next pass tries again."""


async def lift_gate(api: KubeApi, pod: PodInfo, booking: BookingNote) -> Lifted:
    """Remove rgpu's gate from ``pod`` and note ``booking`` on it, against its version.
    Raises ``KubeError`` when the apiserver fails otherwise."""
    note = {ANNOTATION_BOOKING: booking.encode()}
    current: PodInfo | None = pod
    for _ in range(ATTEMPTS):
        if current is None or current.uid != pod.uid:
            return Lifted.GONE
        gated = current.gated
        if gated is None:
            return Lifted.ALREADY
        try:
            await api.lift_gate(
                pod.namespace,
                pod.name,
                resource_version=gated.resource_version,
                gates=gates_after_admission(gated.gates),
                annotations=note,
            )
            return Lifted.LIFTED
        except KubeNotFound:
            return Lifted.GONE
        except KubeConflict:
            raw = await api.get_pod(pod.namespace, pod.name)
            current = pod_info(raw) if raw is not None else None
    return Lifted.CONTENDED
