"""The admitter plans on the ledger, which follows a Lease watch, so a release written a moment
ago may not have reached it yet. A gate lifted on such a booking lets the pod through with
nothing booked behind it: it books again through kube-scheduler's filter, past its namespace's
quota and apart from its gang (the 5,000-pod soak saw a namespace at 20 of its 16 cards and a
gang run one member of three this way). So a booking the plan found in the ledger, rather than
one this admission wrote, is read back from its Lease before its gate is lifted, and the ledger
takes what was read so the next pass plans on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from rgpu_contracts import Claim

from .judging import Judge
from .leases import LeaseWriter

__all__ = ["standing"]


async def standing(writer: LeaseWriter, judge: Judge, claims: Sequence[Claim]) -> bool:
    """Whether every one of ``claims`` is still in its server's Lease and holds its cards."""
    for claim in claims:
        record = await writer.reread(claim.server)
        found = None if record is None else record.claim_of(claim.pod.uid)
        if found is None or not judge.validity(found).blocks:
            return False
    return True
