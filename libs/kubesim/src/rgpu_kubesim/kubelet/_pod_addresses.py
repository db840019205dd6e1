"""Pod IP addresses the emulated kubelets hand out, one range per node.

A real node gets a pod CIDR (``spec.podCIDR``, from the node IPAM controller) and its CNI
plugin leases each pod an address in it. Here every pod address is a loopback address of its
own, so a pod's connections really come from its address: the kubelet binds the pod's lupine
connection to it, and the simulated network judges NetworkPolicies by it. A node gets its own
``spec.podCIDR`` when that lies in 127.0.0.0/8, else the next /24 of 127.130.0.0 up to
127.254.255.0 in the order nodes are first seen (below 127.130 live the fleet's node
addresses, 127.255 is left for pods the simulator places itself). Within a range, addresses
are leased from .2 up (.1 is the bridge's) the way host-local IPAM does: the next free one
after the last leased, so a freed address is not handed out again at once. Tools that show pod
IPs (``kubectl get pods -o wide``) see unique, stable ones.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Final

LOOPBACK: Final = ipaddress.ip_network("127.0.0.0/8")
_FIRST_RANGE: Final = int(ipaddress.IPv4Address("127.130.0.0"))
_RANGES: Final = (int(ipaddress.IPv4Address("127.255.0.0")) - _FIRST_RANGE) >> 8
_PREFIX: Final = 24
_FIRST_HOST: Final = 2

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class PodAddresses:
    """Per-node pod ranges and the addresses leased in them, by pod uid."""

    def __init__(self) -> None:
        self._ranges: dict[str, Network] = {}
        self._next_range = 0
        self._leases: dict[str, tuple[str, int]] = {}
        self._used: dict[str, set[int]] = {}
        self._last: dict[str, int] = {}

    def gateway(self, node: Mapping[str, Any], name: str) -> str:
        """The first address of the node's pod range (the bridge's)."""
        return str(self._range(node, name)[1])

    def _range(self, node: Mapping[str, Any], name: str) -> Network:
        known = self._ranges.get(name)
        if known is None:
            declared = (node.get("spec") or {}).get("podCIDR")
            known = _declared(declared) or self._allocate()
            self._ranges[name] = known
        return known

    def _allocate(self) -> ipaddress.IPv4Network:
        index = self._next_range % _RANGES
        self._next_range += 1
        return ipaddress.IPv4Network((_FIRST_RANGE + (index << (32 - _PREFIX)), _PREFIX))

    def lease(self, uid: str, node: Mapping[str, Any], name: str) -> str:
        """The pod's address, leased on first call and the same on later ones."""
        held = self._leases.get(uid)
        network = self._range(node, name)
        if held is not None:
            return str(network[held[1]])
        host = self._next_free(name, network)
        self._used.setdefault(name, set()).add(host)
        self._last[name] = host
        self._leases[uid] = (name, host)
        return str(network[host])

    def _next_free(self, name: str, network: Network) -> int:
        used, hosts = self._used.get(name, set()), network.num_addresses - 1 - _FIRST_HOST
        start = self._last.get(name, _FIRST_HOST - 1) + 1 - _FIRST_HOST
        for step in range(hosts):
            host = _FIRST_HOST + (start + step) % hosts
            if host not in used:
                return host
        raise RuntimeError(f"node {name}: every address of its pod range {network} is leased")

    def release(self, uid: str) -> None:
        held = self._leases.pop(uid, None)
        if held is not None:
            self._used.get(held[0], set()).discard(held[1])


def _declared(text: object) -> Network | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    return network if network.version == 4 and network.subnet_of(LOOPBACK) else None  # type: ignore[arg-type]
