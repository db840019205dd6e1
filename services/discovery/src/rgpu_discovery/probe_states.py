"""What probing knows about a server is shared by every discovery replica through the
apiserver: one Lease per server in the system namespace, written only by the replica that
probes it, read (watched) by all. So a server is probed once, not once per replica, and
every replica computes the same fleet from the same objects.

The Lease is named ``lupine-<server>`` (hashed when too long) and labelled
``app.kubernetes.io/component: lupine-state`` and ``app.kubernetes.io/managed-by:
rgpu-discovery``: never ``rgpu-…`` nor ``managed-by: rgpu``, which are the allocator's claim
Leases' name prefix and label, so neither service ever reads the other's Leases. The server is
named in ``rgpu.io/probed-server`` (not the claim Leases' ``rgpu.io/server``, which tools
reading every Lease take for a claim Lease), the state in ``rgpu.io/probe`` (JSON);
``spec.holderIdentity`` names the replica that wrote it last and ``spec.renewTime`` when, so
``kubectl get leases`` shows who probes what.

A state is rewritten when it changes, and otherwise at least every heartbeat, so a state
nobody refreshes stands out (its prober stopped). A heartbeat must not look like a change to
the fleet's revision, which is derived from resourceVersions: the annotation carries
``since``, the resourceVersion of the Lease version where the content the fleet shows (busy
set, reachability, usage reported, CUDA version) first appeared, and a replica that lists the
Leases later computes the same revision as one that watched every write.

The rule folding probe outcomes into a state (``ProbeState``): a server is unreachable only
after two probes in a row got no answer; a reply that carried a readable usage report
replaces the busy set (even with an empty one); a ``404`` means the build reports no usage
(busy unknown, not busy-free); every other outcome keeps the last busy set, because
forgetting a busy GPU on a hiccup would double-book it. The CUDA version is replaced only by
an answer that carried one, and kept otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from rgpu_contracts.ids import GpuUuid, ServerName, prefixed_name

from .lupine import ProbeOutcome

__all__ = [
    "ANNOTATION_PROBE",
    "ANNOTATION_SERVER",
    "COMPONENT_SELECTOR",
    "UNREACHABLE_AFTER",
    "ProbeState",
    "StampedState",
    "decode_state",
    "encode_state",
    "state_lease_name",
]

UNREACHABLE_AFTER: Final = 2
"""Consecutive unanswered probes before a server counts as unreachable."""

ANNOTATION_PROBE: Final = "rgpu.io/probe"
ANNOTATION_SERVER: Final = "rgpu.io/probed-server"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
COMPONENT_VALUE: Final = "lupine-state"
COMPONENT_SELECTOR: Final = f"{COMPONENT_LABEL}={COMPONENT_VALUE}"
_MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "rgpu-discovery"}
_PREFIX: Final = "lupine-"
_MAX_VERSION_CHARS: Final = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeState:
    """What probing knows about one server; the default is "never probed"."""

    reachable: bool = True
    usage_reported: bool = False
    busy: frozenset[GpuUuid] = frozenset()
    failures: int = 0
    probed: bool = False
    cuda_version: str | None = None

    def same_for_fleet(self, other: ProbeState) -> bool:
        """Whether ``other`` would publish the same fleet (failures below the threshold
        and whether a probe ever happened are not part of it)."""
        return (self.reachable, self.usage_reported, self.busy, self.cuda_version) == (
            other.reachable,
            other.usage_reported,
            other.busy,
            other.cuda_version,
        )

    def after(self, outcome: ProbeOutcome) -> ProbeState:
        """The state once ``outcome`` is known."""
        if not outcome.answered:
            # Capped: past the threshold another failure changes nothing worth a write.
            failures = min(self.failures + 1, UNREACHABLE_AFTER)
            return replace(
                self, failures=failures, reachable=failures < UNREACHABLE_AFTER, probed=True
            )
        alive = replace(self, failures=0, reachable=True, probed=True)
        if outcome.cuda_version is not None:
            alive = replace(alive, cuda_version=outcome.cuda_version)
        if outcome.result == "usage":
            return replace(alive, usage_reported=True, busy=outcome.busy)
        if outcome.result == "no_usage":
            return replace(alive, usage_reported=False, busy=frozenset())
        return alive


@dataclass(frozen=True, slots=True, kw_only=True)
class StampedState:
    """One server's state Lease as read: the probe state, for which endpoint, and versions."""

    server: ServerName
    endpoint: str
    probe: ProbeState
    version: str
    """The Lease's resourceVersion, to compare-and-swap on."""
    since: int
    """The resourceVersion where this content first appeared (the fleet's revision input)."""
    renewed_at: float
    """Wall-clock seconds of the last write, change or heartbeat."""
    holder: str


def state_lease_name(server: str) -> str:
    """The Lease holding ``server``'s probe state: ``lupine-<server>``, or a readable prefix
    plus a hash of the full name when that would exceed 63 characters."""
    return prefixed_name(_PREFIX, server)


def encode_state(
    *,
    server: ServerName,
    endpoint: str,
    probe: ProbeState,
    since: int | None,
    holder: str,
    now: float,
    heartbeat_seconds: float,
) -> dict[str, Any]:
    """The Lease body for ``probe``; ``since`` is ``None`` when the content is new (the
    version this write creates is then where it first appeared)."""
    content: dict[str, object] = {
        "endpoint": endpoint,
        "reachable": probe.reachable,
        "usageReported": probe.usage_reported,
        "busy": sorted(probe.busy),
        "failures": probe.failures,
        "probed": probe.probed,
    }
    if probe.cuda_version is not None:
        content["cudaVersion"] = probe.cuda_version
    if since is not None:
        content["since"] = since
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": state_lease_name(server),
            "labels": {COMPONENT_LABEL: COMPONENT_VALUE, **_MANAGED_BY},
            "annotations": {
                ANNOTATION_SERVER: server,
                ANNOTATION_PROBE: orjson.dumps(content).decode(),
            },
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, round(heartbeat_seconds)),
            "renewTime": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


def decode_state(obj: Mapping[str, Any]) -> StampedState | None:
    """The state in a Lease, or ``None`` when it is not one discovery could have written
    (a hand-made or damaged Lease is ignored: the server then counts as never probed)."""
    metadata: Mapping[str, Any] = obj.get("metadata") or {}
    annotations: Mapping[str, Any] = metadata.get("annotations") or {}
    server = annotations.get(ANNOTATION_SERVER)
    version = str(metadata.get("resourceVersion") or "")
    try:
        content = orjson.loads(annotations.get(ANNOTATION_PROBE) or "")
        probe = _probe(content)
        since = int(content.get("since", version))
        endpoint = str(content["endpoint"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    if not isinstance(server, str) or not server or not version.isdigit():
        return None
    spec: Mapping[str, Any] = obj.get("spec") or {}
    return StampedState(
        server=ServerName(server),
        endpoint=endpoint,
        probe=probe,
        version=version,
        since=since,
        renewed_at=_timestamp(spec.get("renewTime")),
        holder=str(spec.get("holderIdentity") or ""),
    )


def _probe(content: Mapping[str, Any]) -> ProbeState:
    busy = content["busy"]
    if not isinstance(busy, list) or not all(isinstance(b, str) for b in busy):
        raise TypeError("busy is not a list of GPU UUIDs")
    return ProbeState(
        reachable=bool(content["reachable"]),
        usage_reported=bool(content["usageReported"]),
        busy=frozenset(GpuUuid(b) for b in busy),
        failures=int(content["failures"]),
        probed=bool(content["probed"]),
        cuda_version=_version(content.get("cudaVersion")),
    )


def _version(value: object) -> str | None:
    # Written by discovery from a checked answer; anything else is a hand edit, ignored.
    if isinstance(value, str) and 0 < len(value) <= _MAX_VERSION_CHARS:
        return value
    return None


def _timestamp(text: object) -> float:
    if not isinstance(text, str):
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
