"""Pod addresses: loopback, one range per node, a freed address not handed out again at once."""

from __future__ import annotations

import ipaddress

import pytest

from rgpu_kubesim.kubelet._pod_addresses import PodAddresses

NODE = {"metadata": {"name": "n1"}}


def test_each_pod_gets_a_loopback_address_of_its_nodes_range() -> None:
    addresses = PodAddresses()
    first, second = addresses.lease("a", NODE, "n1"), addresses.lease("b", NODE, "n1")
    other = addresses.lease("c", NODE, "n2")
    assert (first, second, other) == ("127.130.0.2", "127.130.0.3", "127.130.1.2")
    assert all(ipaddress.ip_address(a).is_loopback for a in (first, second, other))
    assert addresses.lease("a", NODE, "n1") == first


def test_a_freed_address_is_reused_only_after_the_rest_of_the_range() -> None:
    addresses = PodAddresses()
    first = addresses.lease("a", NODE, "n1")
    addresses.release("a")
    assert addresses.lease("b", NODE, "n1") != first
    for uid in range(251):
        addresses.lease(f"fill-{uid}", NODE, "n1")
    assert addresses.lease("late", NODE, "n1") == first
    with pytest.raises(RuntimeError, match="every address"):
        addresses.lease("one-too-many", NODE, "n1")


def test_a_declared_loopback_pod_cidr_is_used_and_any_other_is_not() -> None:
    addresses = PodAddresses()
    own = {"spec": {"podCIDR": "127.200.7.0/24"}}
    foreign = {"spec": {"podCIDR": "10.244.1.0/24"}}
    assert addresses.lease("a", own, "n1") == "127.200.7.2"
    assert addresses.lease("b", foreign, "n2").startswith("127.130.")
