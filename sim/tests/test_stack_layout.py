"""Where a stack's processes listen: fixed ports (``rgpu up``'s) go where clients reach each
service — the process itself, or with replicas the Service in front of them — and the picked
ports never take a fixed one."""

from __future__ import annotations

from rgpu_sim.stack_layout import Layout
from rgpu_sim.up import plan_ports

FIXED = {name: port for name, port in plan_ports(0).items() if name != "apiserver"}


def test_alone_each_process_listens_on_its_services_fixed_port() -> None:
    layout = Layout.plan(1, FIXED)
    assert layout.url("discovery") == "http://127.0.0.1:8081"
    assert layout.url("metrics") == "http://127.0.0.1:9400"
    assert layout.webhook_url() == "https://127.0.0.1:8443/mutate"
    # The scheduler listener requires kube-scheduler's client certificate: TLS.
    assert layout.url("extender") == "https://127.0.0.1:8083"
    assert layout.proxies == {}


def test_with_replicas_the_services_take_the_fixed_ports_and_replicas_others() -> None:
    layout = Layout.plan(3, FIXED)
    assert layout.url("allocator") == "http://127.0.0.1:8082"
    assert layout.url("extender") == "https://127.0.0.1:8083"
    assert layout.webhook_url() == "https://127.0.0.1:8443/mutate"
    replicas = set(layout.ports.values()) | set(layout.webhook_ports.values())
    assert len(replicas) == 3 * 4 + 3
    assert not replicas & set(FIXED.values())


def test_without_fixed_ports_every_port_is_picked_and_distinct() -> None:
    layout = Layout.plan(2, {})
    ports = [*layout.ports.values(), *layout.webhook_ports.values()]
    ports += [proxy.port for proxy in layout.proxies.values()]
    assert len(set(ports)) == len(ports)
