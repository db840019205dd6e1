"""What admission decides about a gated pod, and why it waits, is read by the admitter (which
acts on it), ``GET /v1/queue`` and ``rgpu explain`` (which show it) and the metrics (which
count it); the vocabulary lives here once, with the two rules that explain a wait in terms
of the fleet (HAMi's reasons, said as a wait).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rgpu_contracts import Claim, Reason
from rgpu_placement import Demand, Gang, Refusal

from .booker import Booked
from .pods import PodInfo

__all__ = ["Verdict", "Wait", "no_fit_message"]


class Wait(enum.StrEnum):
    """Why a gated pod is not admitted now (the metric label and the Event's theme)."""

    NO_FIT = "NoFit"
    """No server fits the pod now; the message gives HAMi's per-card reasons."""
    NEVER_FITS = "NeverFits"
    """No server of the fleet could take the pod even if every one were free."""
    PREEMPTING = "Preempting"
    """A server is being freed for the pod (its victims are leaving)."""
    BEHIND_PRIORITY = "BehindPriority"
    """What fits is kept for a waiting pod of higher priority."""
    QUOTA_EXCEEDED = "QuotaExceeded"
    """Its namespace holds its card quota (ConfigMap ``rgpu-queues``)."""
    GANG_INCOMPLETE = "GangIncomplete"
    """Not every member of its gang exists yet; nothing is booked until all do."""
    GANG_INVALID = "GangInvalid"
    """Its gang's labels disagree (sizes, or more members than the size)."""
    NO_CLIENT_NODE = "NoClientNode"
    """No client node matches the pod's node selector or required affinity."""
    UNREADABLE = "UnreadableRequest"
    """The pod's remote-GPU ask cannot be read."""
    ADMITTING = "Admitting"
    """A booking or the gate's removal is in flight."""


WARNINGS = frozenset({Wait.NEVER_FITS, Wait.NO_CLIENT_NODE, Wait.UNREADABLE, Wait.GANG_INVALID})
"""Waits that need the pod's owner to act: their Events are Warnings."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What the pass decided for one pod."""

    pod: PodInfo
    booked: Booked | None = None
    """Book this now."""
    held: Claim | None = None
    """Already booked (a leader before us, or this one a moment ago): lift the gate."""
    wait: Wait | None = None
    message: str = ""
    refusal: Refusal | None = None
    """What blocked the pod, for preemption."""
    demand: Demand | None = None
    gang: Gang | None = None
    """Set on the members of a gang admitted together: all are written, then all lifted."""


def no_fit_message(refusal: Refusal) -> str:
    """HAMi's reasons, said as a wait."""
    reasons = refusal.nofit.reasons
    if not reasons or all(r.reason is Reason.NO_SERVERS for r in reasons):
        return refusal.nofit.message
    return f"no remote GPU server fits now: {refusal.nofit.message}"
