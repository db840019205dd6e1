"""Work divided among a service's replicas through Leases, the only thing they all see:
one leader (``Election``) for work that must be done once, or a hash ring of live members
(``Membership``) for work that is shared out.
"""

from __future__ import annotations

from ._election import Election, ElectionTiming
from ._membership import Membership, MembershipTiming, member_lease_name

__all__ = ["Election", "ElectionTiming", "Membership", "MembershipTiming", "member_lease_name"]
