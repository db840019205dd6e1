"""An admitted pod reaches kube-scheduler with its server already booked, and kube-scheduler
hands the extender the pod itself with every ``/filter`` and ``/prioritize``: so the admitter
writes the booking onto the pod (annotation ``rgpu.io/booking``, in the same update that lifts
rgpu's scheduling gate), and the extender reads it there, with no lookup at all.

The annotation is scheduler-owned (the webhook refuses ``rgpu.io/*`` from anyone else), and it
is only a hint for the serial path: the claim in the server's Lease stays the truth, judged
again at commit. It carries its expiry, so a booking that lapsed is never read as standing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from . import _validate as v
from .errors import ContractError
from .ids import ServerName

__all__ = ["ANNOTATION_BOOKING", "BookingNote", "decode_booking"]

ANNOTATION_BOOKING = "rgpu.io/booking"
MAX_BOOKING_CHARS = 512
"""A booking note is a server name and a time: anything much longer is not one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BookingNote:
    """The server booked for a pod at admission, and when that booking lapses unbound."""

    server: ServerName
    expires_at: float
    """Wall-clock seconds."""

    def encode(self) -> str:
        return json.dumps({"server": self.server, "expiresAt": self.expires_at})

    def standing(self, now: float, margin: float) -> bool:
        """Whether the booking still stands ``margin`` seconds from ``now``."""
        return self.expires_at - now > margin


def decode_booking(text: object) -> BookingNote:
    """Read an ``rgpu.io/booking`` value; raises ``ContractError`` when it is not one."""
    if not isinstance(text, str) or len(text) > MAX_BOOKING_CHARS:
        raise ContractError(ANNOTATION_BOOKING, "expected a short JSON object")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ContractError(ANNOTATION_BOOKING, f"not JSON ({exc})") from exc
    m = v.as_mapping(raw, ANNOTATION_BOOKING)
    expires = v.number(m, "expiresAt", ANNOTATION_BOOKING)
    if not math.isfinite(expires):
        raise ContractError(f"{ANNOTATION_BOOKING}.expiresAt", "must be a finite time")
    server = v.string(m, "server", ANNOTATION_BOOKING)
    if not server:
        raise ContractError(f"{ANNOTATION_BOOKING}.server", "must not be empty")
    return BookingNote(server=ServerName(server), expires_at=expires)
