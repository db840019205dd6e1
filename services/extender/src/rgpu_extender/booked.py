"""With admission by scheduling gate, every GPU pod that reaches ``/filter`` already holds a
booking, and kube-scheduler's serial cycle should only read it: no decision, no write, no hop
to the allocator. The admitter writes the booking onto the pod (``rgpu.io/booking``) in the
update that lifts its gate, and kube-scheduler sends the extender the pod itself, so the
booking is read from there. A pod without one (HAMi's flow, a pod created before the upgrade)
goes to the allocator as before.

Only what a read can trust is answered from it: a note the webhook guards (``rgpu.io/*`` is
scheduler-owned), still standing ``MARGIN_SECONDS`` from now (the claim in the Lease is judged
again at commit, and a lapsed booking makes the pod take the filter path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from rgpu_contracts import ANNOTATION_BOOKING, ContractError, ServerName, decode_booking

from .objects import mapping

__all__ = ["MARGIN_SECONDS", "booked_server"]

MARGIN_SECONDS: Final = 2.0
"""A booking this close to lapsing (or this far into clock skew) is left to the allocator."""


def booked_server(pod: Mapping[str, Any], now: float) -> ServerName | None:
    """The server admission booked for ``pod`` when the note still stands; ``None`` otherwise
    (no note, unreadable, lapsing)."""
    text = mapping(mapping(pod.get("metadata")).get("annotations")).get(ANNOTATION_BOOKING)
    if text is None:
        return None
    try:
        note = decode_booking(text)
    except ContractError:
        return None
    return note.server if note.standing(now, MARGIN_SECONDS) else None
