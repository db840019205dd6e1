"""Three values travel between the services by long-poll — discovery's fleet and topology, the
allocator's claims — and a publisher and its followers must agree on each: where it is served,
how its body and its updates decode, and how an update lays out what changed. Each feed is
declared here once; publishers answer by the declaration (``Published``), followers ask by it
(``Mirror``, ``Follower``).

The revision rules are the same for every feed: a value carries its ``revision``, the state it
names reflects every change up to it, and it only grows, so a follower never takes a lower
one (``Follower``) and a publisher holds a follower from further along until it catches up
(``Poll``, ``Versioned``). Where a revision comes from is the publisher's to say: the
apiserver's resourceVersions where replicas must agree (the fleet, the claims), else a start
above any a restarted replica served before (``initial_revision``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from rgpu_contracts import (
    ClaimSet,
    ClaimsUpdate,
    Fleet,
    FleetUpdate,
    Topology,
    UpdateKind,
)

__all__ = [
    "CLAIMS_FEED",
    "FLEET_FEED",
    "TOPOLOGY_FEED",
    "DeltaLayout",
    "Feed",
    "Revisioned",
    "Update",
]

T = TypeVar("T")


class Revisioned(Protocol):
    """A long-polled value: every feed's contract carries its revision."""

    @property
    def revision(self) -> int: ...


R = TypeVar("R", bound=Revisioned)


class Update(Protocol[T]):
    """An update answer (``rgpu_contracts.FleetUpdate``, ``ClaimsUpdate``)."""

    @property
    def kind(self) -> UpdateKind: ...

    @property
    def revision(self) -> int: ...

    @property
    def since(self) -> int | None: ...

    def apply(self, held: T | None) -> T:
        """The value this update describes given the value held (``ContractError`` if none)."""
        ...


class DeltaLayout(enum.Enum):
    """How a feed's ``delta`` update lays out what changed since the follower's revision."""

    CHANGED = "changed"
    """The changed entries under the feed's key, the names of those gone under ``removed``
    (``FleetUpdate``)."""
    GROUPED = "grouped"
    """Every name changed or gone under ``servers``, and the entries of those still present
    joined under the feed's key (``ClaimsUpdate``: an entry is one server's claims, so a
    server named without claims holds none any more)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Feed(Generic[R]):
    """One long-polled value, as publisher and followers both read it."""

    path: str
    """Where the publisher serves it (``GET``, with ``since``, ``wait`` and ``delta``)."""
    key: str
    """The body's list of entries, after its other fields."""
    decode: Callable[[object], R]
    """The value contract's ``from_dict``."""
    updates: Callable[[object], Update[R]] | None = None
    """The update contract's ``from_dict``; ``None``: the feed is answered whole only, and a
    ``delta=1`` is ignored."""
    delta: DeltaLayout = DeltaLayout.CHANGED
    """How a ``delta`` update is laid out (only with ``updates``)."""


FLEET_FEED: Final[Feed[Fleet]] = Feed(
    path="/v1/fleet", key="servers", decode=Fleet.from_dict, updates=FleetUpdate.from_dict
)
"""Discovery's fleet; updates carry the servers changed and the names removed."""
TOPOLOGY_FEED: Final[Feed[Topology]] = Feed(
    path="/v1/topology", key="nodes", decode=Topology.from_dict
)
"""Discovery's client-node topology, answered whole (it changes with Node labels, rarely)."""
CLAIMS_FEED: Final[Feed[ClaimSet]] = Feed(
    path="/v1/claims",
    key="claims",
    decode=ClaimSet.from_dict,
    updates=ClaimsUpdate.from_dict,
    delta=DeltaLayout.GROUPED,
)
"""The allocator's claims; updates carry every claim of the servers whose claims changed."""
