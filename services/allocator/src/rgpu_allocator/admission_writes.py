"""Admitting a unit (a pod, or a whole gang) is three steps, in this order: write every
booking the pass planned, check that every booking it found already made still stands, then
lift each pod's gate. A gang's bookings are all written before any of its gates is lifted, and
if one write fails the others are released: a gang never runs in part.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio

from rgpu_contracts import BookingNote, Claim
from rgpu_placement import expires_at
from rgpu_runtime.telemetry import trace_exemplar

from .booker import Booker
from .clients import KubeApi
from .gates import Lifted, lift_gate
from .instruments import Instruments
from .judging import Judge
from .pods import PodInfo
from .removal import Remover
from .retries import Retries
from .standing import standing
from .verdicts import Verdict
from .waits import Waits

__all__ = ["UnitWrites"]

logger = logging.getLogger(__name__)


class UnitWrites:
    """The writes admitting one unit makes; what the admitter's pass decided is carried out
    here, and what failed is remembered in ``retries``."""

    __slots__ = (
        "_api",
        "_booker",
        "_clock",
        "_instruments",
        "_judge",
        "_lifted",
        "_remover",
        "_retries",
        "_waits",
    )

    def __init__(
        self,
        *,
        booker: Booker,
        remover: Remover,
        judge: Judge,
        api: KubeApi,
        instruments: Instruments,
        retries: Retries,
        waits: Waits,
        lifted: set[str],
        clock: Callable[[], float],
    ) -> None:
        self._booker, self._remover, self._judge = booker, remover, judge
        self._api, self._instruments = api, instruments
        self._retries, self._waits, self._lifted = retries, waits, lifted
        self._clock = clock

    async def admit(self, unit: list[Verdict]) -> None:
        """Book, check, lift; raises our errors (the caller counts the unit as failed)."""
        claims = await self._book(unit)
        if claims is not None and await self._standing(unit, claims):
            await self._lift(unit, claims)

    async def _book(self, unit: list[Verdict]) -> list[Claim] | None:
        """Every booking of ``unit`` written, or none left standing (``None``)."""
        claims: list[Claim] = []
        try:
            for verdict in unit:
                claim = verdict.held
                if verdict.booked is not None:
                    claim = await self._booker.book(verdict.booked)
                if claim is None:
                    break
                claims.append(claim)
        finally:
            if len(claims) < len(unit):
                await self._release([c for c, v in zip(claims, unit, strict=False) if v.booked])
        return claims if len(claims) == len(unit) else None

    async def _standing(self, unit: list[Verdict], claims: list[Claim]) -> bool:
        found = [c for v, c in zip(unit, claims, strict=True) if v.booked is None]
        if not found or await standing(self._booker.writer, self._judge, found):
            return True
        self._retries.failed(v.pod.uid for v in unit)
        logger.info(
            "not admitting %s: a booking the ledger showed is gone",
            ", ".join(v.pod.ref.key for v in unit),
        )
        return False

    async def _release(self, claims: Sequence[Claim]) -> None:
        with anyio.CancelScope(shield=True):
            for claim in claims:
                await self._remover.release(claim.pod.uid)

    async def _lift(self, unit: list[Verdict], claims: list[Claim]) -> None:
        for verdict, claim in zip(unit, claims, strict=True):
            lapses = expires_at(claim, None, self._judge.ttl) or self._clock()
            note = BookingNote(server=claim.server, expires_at=lapses)
            lifted = await lift_gate(self._api, verdict.pod, note)
            self._retries.forget(verdict.pod.uid)
            if lifted is Lifted.LIFTED:
                self._lifted.add(verdict.pod.uid)
                self._admitted(verdict.pod, claim.server)

    def _admitted(self, pod: PodInfo, server: str) -> None:
        self._waits.forget(pod.uid)
        self._instruments.admissions.labels("admitted").inc()
        created = pod.gated.created_at if pod.gated is not None else 0.0
        if created:
            waited = max(0.0, self._clock() - created)
            self._instruments.admission_wait_seconds.observe(waited, trace_exemplar())
        logger.info("admitted %s with server %s", pod.ref.key, server)
