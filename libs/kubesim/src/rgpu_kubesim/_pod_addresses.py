"""Pod IP addresses the emulated kubelets hand out, one range per node.

A real node gets a pod CIDR (``spec.podCIDR``, from the node IPAM controller) and its CNI
plugin leases each pod the lowest free address in it. The emulator does the same: a node's own
``spec.podCIDR`` when it has one, else the next /24 of 10.128.0.0/9 in the order nodes are first
seen; within it, the lowest free host address from .2 up (.1 is the bridge's), released when the
pod stops. Tools that show pod IPs (``kubectl get pods -o wide``) then see unique, stable ones.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

_POOL = ipaddress.ip_network("10.128.0.0/9")
_PREFIX = 24
_FIRST_HOST = 2


class PodAddresses:
    """Per-node pod ranges and the addresses leased in them, by pod uid."""

    def __init__(self) -> None:
        self._ranges: dict[str, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
        self._next_range = 0
        self._leases: dict[str, tuple[str, int]] = {}
        self._used: dict[str, set[int]] = {}

    def gateway(self, node: Mapping[str, Any], name: str) -> str:
        """The first address of the node's pod range (the bridge's)."""
        return str(self._range(node, name)[1])

    def _range(
        self, node: Mapping[str, Any], name: str
    ) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        known = self._ranges.get(name)
        if known is None:
            declared = (node.get("spec") or {}).get("podCIDR")
            known = ipaddress.ip_network(declared, strict=False) if declared else self._allocate()
            self._ranges[name] = known
        return known

    def _allocate(self) -> ipaddress.IPv4Network:
        index = self._next_range % (1 << (_PREFIX - _POOL.prefixlen))
        self._next_range += 1
        start = int(_POOL.network_address) + (index << (32 - _PREFIX))
        return ipaddress.IPv4Network((start, _PREFIX))

    def lease(self, uid: str, node: Mapping[str, Any], name: str) -> str:
        """The pod's address, leased on first call and the same on later ones."""
        held = self._leases.get(uid)
        network = self._range(node, name)
        if held is not None:
            return str(network[held[1]])
        used = self._used.setdefault(name, set())
        free = (h for h in range(_FIRST_HOST, network.num_addresses - 1) if h not in used)
        host = next(free, None)
        if host is None:
            raise RuntimeError(f"node {name}: every address of its pod range {network} is leased")
        used.add(host)
        self._leases[uid] = (name, host)
        return str(network[host])

    def release(self, uid: str) -> None:
        held = self._leases.pop(uid, None)
        if held is not None:
            self._used.get(held[0], set()).discard(held[1])
