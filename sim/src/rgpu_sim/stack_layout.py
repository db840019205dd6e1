"""Where every process of a stack listens, decided before any starts: each service's name (or
``<service>-<n>`` per replica), its port, the extender's webhook port, and, with replicas, the
Service-like proxy in front of each service. Fixed ports (``rgpu up``'s) go where clients reach
a service; the rest are picked below the kernel's ephemeral range, never a fixed one twice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .processes import PortPicker, ServiceProcess
from .service_proxy import ServiceProxy

__all__ = ["REPLICATED", "SERVICES", "Layout", "endpoints_of", "port_of", "scheme"]

SERVICES = ("discovery", "allocator", "extender", "metrics")
REPLICATED = ("discovery", "allocator", "extender", "metrics")
"""The services ``StackOptions.replicas`` multiplies (every one: each must divide its work,
not repeat it; metrics replicas elect one exporter of the card series)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Names, ports and Services of every process, decided before any starts."""

    names: dict[str, tuple[str, ...]]
    ports: dict[str, int]
    webhook_ports: dict[str, int]
    proxies: dict[str, ServiceProxy]

    @classmethod
    def plan(cls, replicas: int, fixed: Mapping[str, int]) -> Layout:
        names = {
            s: (s,) if replicas == 1 or s not in REPLICATED else _numbered(s, replicas)
            for s in SERVICES
        }
        picker = _Picker(fixed)
        # Alone, a process is where clients reach its service: it gets the fixed port.
        alone = {} if replicas > 1 else fixed
        ports = {name: picker.take(alone.get(name)) for group in names.values() for name in group}
        webhook_ports = {name: picker.take(alone.get("webhook")) for name in names["extender"]}
        proxies = {}
        if replicas > 1:
            for service in REPLICATED:
                proxies[service] = ServiceProxy(
                    name=service,
                    backends=tuple(ports[n] for n in names[service]),
                    port=picker.take(fixed.get(service)),
                    scheme=scheme(service),
                )
            proxies["webhook"] = ServiceProxy(
                name="webhook",
                backends=tuple(webhook_ports.values()),
                port=picker.take(fixed.get("webhook")),
            )
        return cls(names=names, ports=ports, webhook_ports=webhook_ports, proxies=proxies)

    def url(self, service: str) -> str:
        proxy = self.proxies.get(service)
        port = self.ports[self.names[service][0]]
        return proxy.url if proxy else f"{scheme(service)}://127.0.0.1:{port}"

    def webhook_url(self) -> str:
        proxy = self.proxies.get("webhook")
        port = proxy.port if proxy else next(iter(self.webhook_ports.values()))
        return f"https://127.0.0.1:{port}/mutate"


class _Picker:
    """Fixed ports where given, picked ones elsewhere, never a fixed one picked twice."""

    def __init__(self, fixed: Mapping[str, int]) -> None:
        self._fixed = frozenset(fixed.values())
        self._picker = PortPicker()

    def take(self, fixed: int | None = None) -> int:
        if fixed:
            return fixed
        port = self._picker.take()
        while port in self._fixed:
            port = self._picker.take()
        return port


def scheme(service: str) -> str:
    """What ``service`` speaks: the extender's scheduler listener serves TLS and requires
    kube-scheduler's client certificate, as the dev overlay deploys it."""
    return "https" if service == "extender" else "http"


def _numbered(service: str, replicas: int) -> tuple[str, ...]:
    return tuple(f"{service}-{n}" for n in range(1, replicas + 1))


def endpoints_of(
    proxies: Mapping[str, ServiceProxy], process: ServiceProcess
) -> list[tuple[ServiceProxy, int]]:
    """The Services ``process`` is an endpoint of, with its port in each."""
    found = []
    if (proxy := proxies.get(process.service)) is not None:
        found.append((proxy, port_of(process.url)))
    if process.service == "extender" and (proxy := proxies.get("webhook")) is not None:
        found.append((proxy, port_of(process.env["RGPU_WEBHOOK_LISTEN"])))
    return found


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])
