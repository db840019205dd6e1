"""The fleet is one value many readers wait on, changed by two writers (the Node watch and the
probes); its revision must move exactly when something allocation-relevant changed, and never
on a no-op.

A ``Server`` is its Node's facts, its decoded register annotation (both from ``nodes``) and
what probing knows, put together by ``build_server`` under HAMi's compatibility contract
(DESIGN §3): port from the label, endpoint from the first InternalIP. Each server is rebuilt
alone when its Node or its probe result changes, and compared with the previous ``Server``
value: the contract holds only allocation-relevant facts, so "equal" means "no change". Only
then is a new snapshot published, with the revision bumped by one; the other 4,999 servers
are reused as they are.

Probe results must be folded into what the fleet says about a server by one rule, or a
single lost packet would flap a server out of the fleet. The rule (``ProbeState``): a server
is unreachable only after two probes in a row got no answer; a reply that carried a readable
usage report replaces the busy set (even with an empty one); a ``404`` means the build
reports no usage (busy unknown, not busy-free); every other outcome keeps the last busy set,
because forgetting a busy GPU on a hiccup would double-book it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from rgpu_contracts.fleet import Fleet, Server
from rgpu_contracts.hami import join_endpoint
from rgpu_contracts.hami import port_from_label as _port_rule
from rgpu_contracts.ids import GpuUuid, ServerName
from rgpu_runtime import Versioned

from .lupine import ProbeOutcome
from .nodes import NodeView, Register, decode_cards
from .published import Item, Published, initial_revision

__all__ = [
    "UNREACHABLE_AFTER",
    "FleetSnapshot",
    "FleetState",
    "ProbeReport",
    "ProbeState",
    "build_server",
]

logger = logging.getLogger(__name__)

UNREACHABLE_AFTER: Final = 2
"""Consecutive unanswered probes before a server counts as unreachable."""

FleetSnapshot = Published[Server]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeState:
    """What probing knows about one server; the default is "never probed"."""

    reachable: bool = True
    usage_reported: bool = False
    busy: frozenset[GpuUuid] = frozenset()
    failures: int = 0
    probed: bool = False

    def after(self, outcome: ProbeOutcome) -> ProbeState:
        """The state once ``outcome`` is known."""
        if not outcome.answered:
            failures = self.failures + 1
            return replace(
                self, failures=failures, reachable=failures < UNREACHABLE_AFTER, probed=True
            )
        alive = replace(self, failures=0, reachable=True, probed=True)
        if outcome.result == "usage":
            return replace(alive, usage_reported=True, busy=outcome.busy)
        if outcome.result == "no_usage":
            return replace(alive, usage_reported=False, busy=frozenset())
        return alive


def build_server(
    view: NodeView, register: Register, probe: ProbeState, default_port: int
) -> Server:
    """The fleet's view of server node ``view``."""
    port = _port_rule(view.server_label, default_port).port
    endpoint = None if view.internal_ip is None else join_endpoint(view.internal_ip, port)
    problems = [register.error] if register.error else []
    if endpoint is None:
        problems.insert(0, "node has no InternalIP address, so lupine cannot be reached")
    return Server(
        name=ServerName(view.name),
        endpoint=endpoint,
        port=port,
        ready=view.ready,
        reachable=probe.reachable,
        usage_reported=probe.usage_reported,
        busy=probe.busy,
        topology=view.topology,
        cards=register.cards if endpoint is not None else (),
        error="; ".join(problems) or None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeReport:
    """A probe result for ``endpoint`` of ``server``; ignored if the endpoint changed since."""

    server: ServerName
    endpoint: str
    outcome: ProbeOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class _Entry:
    view: NodeView
    register: Register
    probe: ProbeState
    item: Item[Server]

    @property
    def server(self) -> Server:
        return self.item.value


class FleetState:
    """The current fleet and its long-poll; mutated only from the event loop's thread."""

    def __init__(self, *, default_port: int, clock: Callable[[], float] = time.time) -> None:
        self._default_port = default_port
        self._clock = clock
        self._entries: dict[ServerName, _Entry] = {}
        empty = Published[Server](
            revision=initial_revision(),
            listed=False,
            key="servers",
            fields={"observedAt": clock()},
            items=(),
        )
        self.published: Versioned[FleetSnapshot] = Versioned(empty, revision=empty.revision)
        self.targets_changed: Versioned[int] = Versioned(0)
        """Bumped when a server to probe appears or moves, so the prober probes it at once."""

    def snapshot(self) -> FleetSnapshot:
        """The latest published fleet."""
        return self.published.value

    def fleet(self) -> Fleet:
        """The latest fleet as the wire contract."""
        snap = self.published.value
        return Fleet(revision=snap.revision, observed_at=_observed(snap), servers=snap.values)

    def item(self, name: ServerName) -> Item[Server] | None:
        """Server ``name`` as last published (value and JSON), or ``None`` when not listed."""
        entry = self._entries.get(name)
        return None if entry is None else entry.item

    def targets(self) -> dict[ServerName, str]:
        """Every server with an endpoint, to probe."""
        return {name: e.server.endpoint for name, e in self._entries.items() if e.server.endpoint}

    def apply(self, view: NodeView) -> Register:
        """Add or update server ``view``; publishes when the server changed."""
        entry = self._build(view)
        if self._store(entry):
            self._publish()
        return entry.register

    def remove(self, name: ServerName) -> bool:
        """Forget a server (deleted, or no longer labelled); publishes when it was known."""
        if self._entries.pop(name, None) is None:
            return False
        self._publish()
        return True

    def replace_all(self, views: Iterable[NodeView]) -> Mapping[ServerName, Register]:
        """Make the fleet exactly ``views`` (after a list); publishes once if anything changed."""
        built = {entry.view.name: entry for entry in map(self._build, views)}
        gone = self._entries.keys() - built.keys()
        for name in gone:
            del self._entries[name]
        changed = [self._store(entry) for entry in built.values()]
        if gone or any(changed) or not self.published.value.listed:
            self._publish()
        return {ServerName(name): entry.register for name, entry in built.items()}

    def apply_probes(self, reports: Iterable[ProbeReport]) -> bool:
        """Fold probe results in; publishes once if any server changed."""
        changed = False
        for report in reports:
            entry = self._entries.get(report.server)
            if entry is None or entry.server.endpoint != report.endpoint:
                continue
            probe = entry.probe.after(report.outcome)
            _log_transition(entry, probe, report)
            changed |= self._store(self._rebuilt(entry.view, entry.register, probe))
        if changed:
            self._publish()
        return changed

    def _build(self, view: NodeView) -> _Entry:
        old = self._entries.get(ServerName(view.name))
        if old is not None and old.register.text == view.register:
            register = old.register
        else:
            register = decode_cards(ServerName(view.name), view.register)
        probe = old.probe if old is not None else ProbeState()
        return self._rebuilt(view, register, probe)

    def _rebuilt(self, view: NodeView, register: Register, probe: ProbeState) -> _Entry:
        server = build_server(view, register, probe, self._default_port)
        old = self._entries.get(server.name)
        if old is not None and old.server == server:
            item = old.item
        else:
            item = Item.of(server.name, server, Server.to_dict)
        return _Entry(view=view, register=register, probe=probe, item=item)

    def _store(self, entry: _Entry) -> bool:
        """Keep ``entry``; whether the published server changed."""
        name = entry.server.name
        old = self._entries.get(name)
        self._entries[name] = entry
        before = None if old is None else old.server.endpoint
        if entry.server.endpoint is not None and entry.server.endpoint != before:
            self.targets_changed.publish(self.targets_changed.value + 1)
        return old is None or old.item is not entry.item

    def _publish(self) -> None:
        snapshot = Published[Server](
            revision=self.published.revision + 1,
            listed=True,
            key="servers",
            fields={"observedAt": self._clock()},
            items=(e.item for e in self._entries.values()),
            previous=self.published.value,
        )
        self.published.publish(snapshot)


def _log_transition(entry: _Entry, probe: ProbeState, report: ProbeReport) -> None:
    if entry.probe.reachable and not probe.reachable:
        logger.warning(
            "lupine at %s unreachable after %d probes: %s",
            report.endpoint,
            probe.failures,
            report.outcome.detail,
            extra={"node": report.server},
        )
    elif not entry.probe.reachable and probe.reachable:
        logger.info("lupine at %s reachable again", report.endpoint, extra={"node": report.server})


def _observed(snapshot: FleetSnapshot) -> float:
    value = snapshot.fields["observedAt"]
    return float(value) if isinstance(value, int | float) else 0.0
