"""The long-poll feeds between the services (discovery's fleet and topology, the
allocator's claims): each declared once, answered by one publisher snapshot, and followed into
a mirror that says how fresh it is.
"""

from __future__ import annotations

from ._changelog import CHANGELOG_LIMIT, Changes
from ._discovery_mirror import DiscoveryMirror
from ._feed import CLAIMS_FEED, FLEET_FEED, TOPOLOGY_FEED
from ._follower import Follower, FollowPolicy
from ._longpoll import Poll
from ._mirror import FollowStatus, Mirror
from ._published import Entry, Published, initial_revision
from ._versioned import Versioned

__all__ = [
    "CHANGELOG_LIMIT",
    "CLAIMS_FEED",
    "FLEET_FEED",
    "TOPOLOGY_FEED",
    "Changes",
    "DiscoveryMirror",
    "Entry",
    "FollowPolicy",
    "FollowStatus",
    "Follower",
    "Mirror",
    "Poll",
    "Published",
    "Versioned",
    "initial_revision",
]
