"""The fleet is one value many readers wait on, changed by two writers (the Node watch and the
probes); its revision must move exactly when something allocation-relevant changed, and never
on a no-op.

A ``Server`` is one lupine listener of a server Node — the Node itself, or one of the lupine
instances it declares (``listeners``) — with its Node's facts, its decoded register annotation
(both from ``nodes``) and what probing knows, put together by ``build_server`` under HAMi's
compatibility contract: port from the label (or the instance), endpoint from the first
InternalIP. Each server is rebuilt
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
from rgpu_contracts.ids import NodeName, ServerName
from rgpu_runtime.feeds import FLEET_FEED, Entry, Published, Versioned

from .listeners import Layout, Listener, listeners, read_layout
from .lupine import ProbeOutcome
from .nodes import NodeView, Register, decode_cards
from .probe_states import UNREACHABLE_AFTER, ProbeState, StampedState

__all__ = [
    "UNREACHABLE_AFTER",
    "Decoded",
    "FleetSnapshot",
    "FleetState",
    "ProbeReport",
    "ProbeState",
    "build_server",
]

logger = logging.getLogger(__name__)

FleetSnapshot = Published[Server]


def build_server(
    view: NodeView,
    register: Register,
    probe: ProbeState,
    default_port: int,
    listener: Listener | None = None,
) -> Server:
    """The fleet's view of ``listener`` on server node ``view`` (default: its first, the Node
    itself unless it declares lupine instances)."""
    if listener is None:
        listener = listeners(view, register, read_layout(view.instances), default_port)[0]
    endpoint = _endpoint(view, listener)
    problems = [p for p in (register.error, listener.problem) if p]
    if endpoint is None:
        problems.insert(0, "node has no InternalIP address, so lupine cannot be reached")
    return Server(
        name=listener.name,
        endpoint=endpoint,
        port=listener.port,
        ready=view.ready,
        reachable=probe.reachable,
        usage_reported=probe.usage_reported,
        busy=probe.busy,
        topology=view.topology,
        cards=listener.cards if endpoint is not None else (),
        error="; ".join(problems) or None,
        node=listener.node,
        cordoned=view.unschedulable,
        cuda_version=probe.cuda_version,
    )


def _endpoint(view: NodeView, listener: Listener) -> str | None:
    return None if view.internal_ip is None else join_endpoint(view.internal_ip, listener.port)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decoded:
    """A server Node's annotations as decoded (once per text), and the servers it runs."""

    register: Register
    layout: Layout
    servers: tuple[ServerName, ...]


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
    listener: Listener
    probe: ProbeState
    item: Entry[Server]
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
        self._nodes: dict[NodeName, Decoded] = {}
        self._states: dict[ServerName, StampedState] = {}
        empty = Published[Server](
            FLEET_FEED, revision=0, listed=False, fields={"observedAt": clock()}, entries=()
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

    def item(self, name: ServerName) -> Entry[Server] | None:
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

    def apply(self, view: NodeView, version: int = 0) -> Decoded:
        """Add or update server node ``view`` (Node resourceVersion ``version``) and the
        servers it runs; publishes when one changed."""
        entries, decoded = self._build(view, version)
        gone = self._forget(view.name, keep=decoded.servers)
        changed = [self._store(entry) for entry in entries]
        self._nodes[view.name] = decoded
        if gone or any(changed):
            self._publish(max((e.version for e in entries), default=version))
        return decoded

    def remove(self, name: NodeName | ServerName, version: int = 0) -> bool:
        """Forget server node ``name`` and its servers (deleted at ``version``, or no longer
        labelled); publishes when it was known."""
        if not self._forget(NodeName(name)):
            return False
        self._publish(version)
        return True

    def _forget(self, node: NodeName, keep: tuple[ServerName, ...] = ()) -> bool:
        """Drop the servers node ``node`` ran that are not in ``keep``; whether any was."""
        known = self._nodes.pop(node, None)
        names = known.servers if known is not None else (ServerName(node),)
        gone = [self._entries.pop(n, None) for n in names if n not in keep]
        return any(entry is not None for entry in gone)

    def replace_all(
        self, views: Iterable[NodeView], versions: Mapping[str, int] | None = None
    ) -> Mapping[NodeName, Decoded]:
        """Make the fleet exactly ``views`` (after a list; ``versions``: resourceVersions by
        Node name); publishes once if anything changed."""
        versions = versions or {}
        nodes: dict[NodeName, Decoded] = {}
        built: dict[ServerName, _Entry] = {}
        for view in views:
            entries, nodes[view.name] = self._build(view, versions.get(view.name, 0))
            built.update((entry.server.name, entry) for entry in entries)
        gone = self._entries.keys() - built.keys()
        for name in gone:
            del self._entries[name]
        self._nodes = nodes
        changed = [self._store(entry) for entry in built.values()]
        if gone or any(changed) or not self.published.value.listed:
            self._publish(max((e.version for e in built.values()), default=0))
        return nodes

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
        rebuilt = self._rebuilt(entry.view, entry.register, entry.listener, entry.version)
        _log_transition(entry, rebuilt.probe, before, self._states.get(name))
        return self._store(rebuilt)

    def _build(self, view: NodeView, version: int) -> tuple[list[_Entry], Decoded]:
        old = self._nodes.get(view.name)
        if old is not None and old.register.text == view.register:
            register = old.register
        else:
            register = decode_cards(ServerName(view.name), view.register)
        if old is not None and old.layout.text == view.instances:
            layout = old.layout
        else:
            layout = read_layout(view.instances)
        laid = listeners(view, register, layout, self._default_port)
        entries = [self._rebuilt(view, register, listener, version) for listener in laid]
        names = tuple(listener.name for listener in laid)
        return entries, Decoded(register=register, layout=layout, servers=names)

    def _rebuilt(
        self, view: NodeView, register: Register, listener: Listener, version: int
    ) -> _Entry:
        name = listener.name
        endpoint = _endpoint(view, listener)
        state = self._states.get(name)
        probe, stamp = ProbeState(), 0
        if state is not None and endpoint is not None and state.endpoint == endpoint:
            probe, stamp = state.probe, state.since
        server = build_server(view, register, probe, self._default_port, listener)
        old = self._entries.get(name)
        if old is not None and old.server == server:
            item = old.item
        else:
            item = Entry.of(server.name, server, Server.to_dict)
        return _Entry(
            view=view,
            register=register,
            listener=listener,
            probe=probe,
            item=item,
            version=max(version, stamp),
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
            FLEET_FEED,
            revision=revision,
            fields={"observedAt": self._clock()},
            entries=(e.item for e in self._entries.values()),
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
