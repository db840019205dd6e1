"""At 1,000 servers one server turning busy made every follower download and decode the
whole fleet (and every claim) again; these contracts carry only what changed.

A follower that asks ``GET /v1/fleet?since=R&delta=1`` (or ``/v1/claims``) gets an
*update*, one of three kinds:

* ``full``: the whole value (the answer when ``R`` is older than the publisher's history,
  or was never given); the body is today's ``Fleet`` / ``ClaimSet`` plus ``"kind"`` (a body
  without ``"kind"``, from a peer that predates updates, reads as full);
* ``delta``: what changed between ``since`` (= ``R``) and ``revision``: the servers added
  or changed, and the names of those removed (for claims: the servers whose claims changed,
  and every claim those servers now hold);
* ``behind``: the publisher is still below ``R`` (it answered a follower that came from a
  replica further along); it carries nothing to apply and the follower keeps what it holds.

``apply(held)`` turns an update into the value it describes; unchanged entries are carried
over by identity, so applying costs the decoding of the changed entries only.
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import TypedDict

from . import _validate as v
from .allocation import Claim, ClaimDict, ClaimSet
from .errors import ContractError
from .fleet import Fleet, Server, ServerDict
from .ids import ServerName

__all__ = [
    "ClaimsUpdate",
    "ClaimsUpdateDict",
    "FleetUpdate",
    "FleetUpdateDict",
    "UpdateKind",
]


class UpdateKind(enum.Enum):
    """What an update carries: the whole value, what changed, or nothing yet."""

    FULL = "full"
    DELTA = "delta"
    BEHIND = "behind"


_KINDS = [kind.value for kind in UpdateKind]


class FleetUpdateDict(TypedDict, total=False):
    kind: str
    revision: int
    since: int
    observedAt: float
    servers: list[ServerDict]
    removed: list[str]


class ClaimsUpdateDict(TypedDict, total=False):
    kind: str
    revision: int
    since: int
    servers: list[str]
    claims: list[ClaimDict]


def _head(m: object, path: str) -> tuple[UpdateKind, int, int | None]:
    raw = v.as_mapping(m, path)
    # A peer that predates updates ignores ``delta=1`` and answers the plain contract: whole.
    kind = UpdateKind(v.choice(raw, "kind", path, _KINDS, UpdateKind.FULL.value))
    revision = v.integer(raw, "revision", path, minimum=0)
    if kind is UpdateKind.FULL:
        return kind, revision, None
    since = v.integer(raw, "since", path, minimum=0)
    if kind is UpdateKind.DELTA and revision < since:
        raise ContractError(v.join(path, "revision"), f"a delta cannot go back to {since}")
    return kind, revision, since


def _check_applicable(kind: UpdateKind, since: int | None, held_revision: int | None) -> None:
    if kind is UpdateKind.BEHIND:
        raise ContractError("kind", "a behind answer carries nothing to apply")
    if kind is UpdateKind.DELTA and held_revision != since:
        raise ContractError(
            "since", f"delta is from {since}, but the value held is {held_revision}"
        )


def _server_name(server: Server) -> ServerName:
    return server.name


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetUpdate:
    """One answer to ``GET /v1/fleet?delta=1``; ``servers`` are all of them (full) or the
    changed ones (delta), ``removed`` the names gone since ``since`` (delta only)."""

    kind: UpdateKind
    revision: int
    since: int | None = None
    observed_at: float = 0.0
    servers: tuple[Server, ...] = ()
    removed: tuple[ServerName, ...] = ()

    def apply(self, held: Fleet | None) -> Fleet:
        """The fleet this update describes, given the fleet held at ``since`` (delta).

        Raises ``ContractError`` for a behind answer or a delta from another revision.
        """
        _check_applicable(self.kind, self.since, None if held is None else held.revision)
        if self.kind is UpdateKind.FULL or held is None:
            servers = self.servers
        else:
            servers = _patched(held.servers, self.servers, self.removed)
        return Fleet(revision=self.revision, observed_at=self.observed_at, servers=servers)

    def to_dict(self) -> FleetUpdateDict:
        raw: FleetUpdateDict = {"kind": self.kind.value, "revision": self.revision}
        if self.since is not None:
            raw["since"] = self.since
        raw["observedAt"] = self.observed_at
        raw["servers"] = [server.to_dict() for server in self.servers]
        if self.kind is UpdateKind.DELTA:
            raw["removed"] = list(self.removed)
        return raw

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> FleetUpdate:
        kind, revision, since = _head(raw, path)
        m = v.as_mapping(raw, path)
        removed = v.strings(m, "removed", path, ())
        if removed and kind is not UpdateKind.DELTA:
            raise ContractError(v.join(path, "removed"), f"only a delta removes, not {kind.value}")
        return cls(
            kind=kind,
            revision=revision,
            since=since,
            observed_at=v.number(m, "observedAt", path, 0.0),
            servers=v.items(m, "servers", path, Server.from_dict, ()),
            removed=tuple(ServerName(name) for name in removed),
        )


def _patched(
    held: tuple[Server, ...], changed: tuple[Server, ...], removed: tuple[ServerName, ...]
) -> tuple[Server, ...]:
    """``held`` (sorted by name, as discovery serves it) with ``changed`` put in place and
    ``removed`` taken out; everything else is carried over as the same objects."""
    servers = list(held)
    for name in removed:
        at = bisect_left(servers, name, key=_server_name)
        if at < len(servers) and servers[at].name == name:
            del servers[at]
    for server in changed:
        at = bisect_left(servers, server.name, key=_server_name)
        if at < len(servers) and servers[at].name == server.name:
            servers[at] = server
        else:
            servers.insert(at, server)
    return tuple(servers)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimsUpdate:
    """One answer to ``GET /v1/claims?delta=1``: ``claims`` are all of them (full) or every
    claim of the servers named in ``servers`` (delta; a named server without claims in the
    update holds none any more)."""

    kind: UpdateKind
    revision: int
    since: int | None = None
    servers: tuple[ServerName, ...] = ()
    claims: tuple[Claim, ...] = ()

    def apply(self, held: ClaimSet | None) -> ClaimSet:
        """The claim set this update describes, given the set held at ``since`` (delta),
        ordered by server like the allocator serves it.

        Raises ``ContractError`` for a behind answer or a delta from another revision.
        """
        _check_applicable(self.kind, self.since, None if held is None else held.revision)
        if self.kind is UpdateKind.FULL or held is None:
            return ClaimSet(revision=self.revision, claims=self.claims)
        return ClaimSet(revision=self.revision, claims=self._patched(held.claims))

    def _patched(self, held: tuple[Claim, ...]) -> tuple[Claim, ...]:
        """``held`` (ordered by server, as the allocator serves it) with each named server's
        claims replaced; every other claim is carried over as the same object."""
        claims = list(held)
        for server in sorted(set(self.servers)):
            low = bisect_left(claims, server, key=_claim_server)
            high = bisect_right(claims, server, lo=low, key=_claim_server)
            claims[low:high] = [claim for claim in self.claims if claim.server == server]
        return tuple(claims)

    def to_dict(self) -> ClaimsUpdateDict:
        raw: ClaimsUpdateDict = {"kind": self.kind.value, "revision": self.revision}
        if self.since is not None:
            raw["since"] = self.since
        if self.kind is UpdateKind.DELTA:
            raw["servers"] = list(self.servers)
        raw["claims"] = [claim.to_dict() for claim in self.claims]
        return raw

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ClaimsUpdate:
        kind, revision, since = _head(raw, path)
        m = v.as_mapping(raw, path)
        servers = tuple(ServerName(name) for name in v.strings(m, "servers", path, ()))
        claims = v.items(m, "claims", path, Claim.from_dict, ())
        if kind is UpdateKind.DELTA:
            _check_named(claims, frozenset(servers), path)
        elif servers:
            raise ContractError(
                v.join(path, "servers"), f"only a delta names servers, not {kind.value}"
            )
        return cls(kind=kind, revision=revision, since=since, servers=servers, claims=claims)


def _check_named(claims: tuple[Claim, ...], servers: frozenset[str], path: str) -> None:
    for i, claim in enumerate(claims):
        if claim.server not in servers:
            raise ContractError(
                v.join(v.join(path, "claims"), i), f"server {claim.server!r} is not in servers"
            )


def _claim_server(claim: Claim) -> ServerName:
    return claim.server
