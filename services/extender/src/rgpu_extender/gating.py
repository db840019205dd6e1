"""With admission by scheduling gate, a GPU pod reaches kube-scheduler only once rgpu has
booked it a server. The webhook adds the gate at CREATE (gates can only be set then), and
guards it afterwards: anyone who may update a pod may remove a scheduling gate, and a pod
whose rgpu gate a user lifted would skip the queue (priority order, quotas) and be booked on
kube-scheduler's serial path instead. Only the identities trusted with the scheduler-owned
annotations (the allocator's account among them) may lift it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rgpu_contracts import pointer
from rgpu_placement import ADMISSION_GATE, scheduling_gates

from .errors import AdmissionDenied
from .objects import mapping, pod_label

__all__ = ["gate_ops", "guard_gate"]


def gate_ops(pod: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSONPatch adding rgpu's gate after any gates the pod already has (idempotent)."""
    if ADMISSION_GATE in scheduling_gates(pod):
        return
    gate = {"name": ADMISSION_GATE}
    if isinstance(mapping(pod.get("spec")).get("schedulingGates"), list):
        yield {"op": "add", "path": pointer("spec", "schedulingGates", "-"), "value": gate}
    else:
        yield {"op": "add", "path": pointer("spec", "schedulingGates"), "value": [gate]}


def guard_gate(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], *, username: str, trusted: bool
) -> None:
    """Refuse an update by an untrusted user that lifts rgpu's gate."""
    lifted = old is not None and ADMISSION_GATE in scheduling_gates(old)
    if not lifted or ADMISSION_GATE in scheduling_gates(new) or trusted:
        return
    raise AdmissionDenied(
        f"user {username!r} may not remove the scheduling gate {ADMISSION_GATE} from pod "
        f"{pod_label(new)}: rgpu lifts it once a remote GPU server is booked for the pod "
        "(`rgpu explain` says why it waits); leave spec.schedulingGates as it is, or delete the "
        "pod"
    )
