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

Probe results come from the apiserver (``probe_states``): every replica folds the same state
Leases into its fleet, so replicas serve the same fleet. The revision is derived from the
apiserver's resourceVersions, so it is comparable across replicas: each change publishes
``max(previous + 1, the change's resourceVersion)`` — a Node's version, or the version where a
probe state's content first appeared (a heartbeat is not a change) — and a first list takes
the newest such version of all. Replicas that saw the same history therefore publish the same
revision for the same fleet, and one replica's revisions only ever grow. The two streams
(Nodes, Leases) can deliver out of order by a moment; then the ``previous + 1`` keeps the
revision growing, and the replicas agree again on the next change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from rgpu_contracts.fleet import Fleet, Server
from rgpu_contracts.hami import join_endpoint
from rgpu_contracts.hami import port_from_label as _port_rule
from rgpu_contracts.ids import ServerName
from rgpu_runtime import Versioned

from .lupine import ProbeOutcome
from .nodes import NodeView, Register, decode_cards
from .probe_states import UNREACHABLE_AFTER, ProbeState, StampedState
from .published import Item, Published

__all__ = [
    "UNREACHABLE_AFTER",
    "FleetSnapshot",
    "FleetState",
    "ProbeReport",
    "ProbeState",
    "build_server",
]

logger = logging.getLogger(__name__)

FleetSnapshot = Published[Server]


def build_server(
    view: NodeView, register: Register, probe: ProbeState, default_port: int
) -> Server:
    """The fleet's view of server node ``view``."""
    port = _port_rule(view.server_label, default_port).port
    endpoint = _endpoint(view, default_port)
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


def _endpoint(view: NodeView, default_port: int) -> str | None:
    port = _port_rule(view.server_label, default_port).port
    return None if view.internal_ip is None else join_endpoint(view.internal_ip, port)


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
    version: int
    """The newest resourceVersion behind this entry: its Node's, or its probe state's."""

    @property
    def server(self) -> Server:
        return self.item.value


class FleetState:
    """The current fleet and its long-poll; mutated only from the event loop's thread."""

    def __init__(self, *, default_port: int, clock: Callable[[], float] = time.time) -> None:
        self._default_port = default_port
        self._clock = clock
        self._entries: dict[ServerName, _Entry] = {}
        self._states: dict[ServerName, StampedState] = {}
        empty = Published[Server](
            revision=0, listed=False, key="servers", fields={"observedAt": clock()}, items=()
        )
        self.published: Versioned[FleetSnapshot] = Versioned(empty, revision=0)
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

    def state(self, name: ServerName) -> StampedState | None:
        """Server ``name``'s probe state as last read from the apiserver, if any."""
        return self._states.get(name)

    def listed_states(self) -> list[StampedState]:
        """Probe states of the servers the fleet lists."""
        return [state for name, state in self._states.items() if name in self._entries]

    def orphans(self) -> list[StampedState]:
        """Probe states of servers the listed fleet does not have (their Node is gone)."""
        if not self.published.value.listed:
            return []
        return [state for name, state in self._states.items() if name not in self._entries]

    def targets(self) -> dict[ServerName, str]:
        """Every server with an endpoint, to probe."""
        return {name: e.server.endpoint for name, e in self._entries.items() if e.server.endpoint}

    def apply(self, view: NodeView, version: int = 0) -> Register:
        """Add or update server ``view`` (Node resourceVersion ``version``); publishes when
        the server changed."""
        entry = self._build(view, version)
        if self._store(entry):
            self._publish(entry.version)
        return entry.register

    def remove(self, name: ServerName, version: int = 0) -> bool:
        """Forget a server (deleted at ``version``, or no longer labelled); publishes when
        it was known."""
        if self._entries.pop(name, None) is None:
            return False
        self._publish(version)
        return True

    def replace_all(
        self, views: Iterable[NodeView], versions: Mapping[str, int] | None = None
    ) -> Mapping[ServerName, Register]:
        """Make the fleet exactly ``views`` (after a list; ``versions``: resourceVersions by
        Node name); publishes once if anything changed."""
        versions = versions or {}
        built = {e.view.name: e for e in (self._build(v, versions.get(v.name, 0)) for v in views)}
        gone = self._entries.keys() - built.keys()
        for name in gone:
            del self._entries[name]
        changed = [self._store(entry) for entry in built.values()]
        if gone or any(changed) or not self.published.value.listed:
            self._publish(max((e.version for e in built.values()), default=0))
        return {ServerName(name): entry.register for name, entry in built.items()}

    def apply_states(
        self, states: Iterable[StampedState], gone: Iterable[ServerName] = (), version: int = 0
    ) -> bool:
        """Fold probe states read from the apiserver in (``gone``: states deleted at
        ``version``); publishes once if any server changed."""
        newest, changed = version, False
        for state in states:
            before = self._states.get(state.server)
            self._states[state.server] = state
            newest = max(newest, state.since)
            changed |= self._refresh(state.server, before)
        for name in gone:
            before = self._states.pop(name, None)
            changed |= before is not None and self._refresh(name, before)
        if changed:
            self._publish(newest)
        return changed

    def _refresh(self, name: ServerName, before: StampedState | None) -> bool:
        entry = self._entries.get(name)
        if entry is None:
            return False
        rebuilt = self._rebuilt(entry.view, entry.register, entry.version)
        _log_transition(entry, rebuilt.probe, before, self._states.get(name))
        return self._store(rebuilt)

    def _build(self, view: NodeView, version: int) -> _Entry:
        old = self._entries.get(ServerName(view.name))
        if old is not None and old.register.text == view.register:
            register = old.register
        else:
            register = decode_cards(ServerName(view.name), view.register)
        return self._rebuilt(view, register, version)

    def _rebuilt(self, view: NodeView, register: Register, version: int) -> _Entry:
        name = ServerName(view.name)
        endpoint = _endpoint(view, self._default_port)
        state = self._states.get(name)
        probe, stamp = ProbeState(), 0
        if state is not None and endpoint is not None and state.endpoint == endpoint:
            probe, stamp = state.probe, state.since
        server = build_server(view, register, probe, self._default_port)
        old = self._entries.get(name)
        if old is not None and old.server == server:
            item = old.item
        else:
            item = Item.of(server.name, server, Server.to_dict)
        return _Entry(
            view=view, register=register, probe=probe, item=item, version=max(version, stamp)
        )

    def _store(self, entry: _Entry) -> bool:
        """Keep ``entry``; whether the published server changed."""
        name = entry.server.name
        old = self._entries.get(name)
        self._entries[name] = entry
        before = None if old is None else old.server.endpoint
        if entry.server.endpoint is not None and entry.server.endpoint != before:
            self.targets_changed.publish(self.targets_changed.value + 1)
        return old is None or old.item is not entry.item

    def _publish(self, version: int) -> None:
        revision = max(self.published.revision + 1, version)
        snapshot = Published[Server](
            revision=revision,
            listed=True,
            key="servers",
            fields={"observedAt": self._clock()},
            items=(e.item for e in self._entries.values()),
            previous=self.published.value,
        )
        self.published.publish(snapshot, revision=revision)


def _log_transition(
    entry: _Entry, probe: ProbeState, before: StampedState | None, after: StampedState | None
) -> None:
    endpoint = entry.server.endpoint
    if entry.probe.reachable and not probe.reachable:
        holder = "" if after is None else after.holder
        logger.warning(
            "lupine at %s unreachable after %d probes (by %s)",
            endpoint,
            probe.failures,
            holder,
            extra={"node": entry.server.name},
        )
    elif not entry.probe.reachable and probe.reachable and before is not None:
        logger.info("lupine at %s reachable again", endpoint, extra={"node": entry.server.name})


def _observed(snapshot: FleetSnapshot) -> float:
    value = snapshot.fields["observedAt"]
    return float(value) if isinstance(value, int | float) else 0.0
