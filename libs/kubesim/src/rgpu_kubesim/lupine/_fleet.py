"""Many fake lupine servers in one process, found by server name (the Node they stand for)
or by endpoint (what a client connecting there would reach), with one network rule in front of
all of them, and closed together by their owner."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager

from rgpu_kubesim._lupine_errors import LupineNotFound, SimOptionError
from rgpu_kubesim.lupine._fake import FakeLupine, LupineSpec, start_lupine

__all__ = ["LupineFleet", "Network", "open_lupine_fleet"]


class LupineFleet:
    """Many fake servers, found by server name or endpoint; closed together by its owner."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self._stack = stack
        self._by_name: dict[str, FakeLupine] = {}
        self._by_endpoint: dict[str, FakeLupine] = {}
        self._network: Network | None = None

    def guard(self, network: Network | None) -> None:
        """Put ``network`` in front of every server, those started later included:
        ``network(server, source_address)`` decides whether a connection reaches it."""
        self._network = network
        for lupine in self._by_endpoint.values():
            lupine.guard(_gate(network, lupine))

    def __len__(self) -> int:
        return len(self._by_endpoint)

    def __iter__(self) -> Iterator[FakeLupine]:
        return iter(tuple(self._by_endpoint.values()))

    async def start(self, spec: LupineSpec) -> FakeLupine:
        """Start one more server; raises ``SimOptionError`` for a duplicate name (an instance's
        name is known once it listens)."""
        if spec.name and not spec.instance and spec.name in self._by_name:
            raise SimOptionError("name", f"a fake lupine named {spec.name!r} already runs")
        lupine = await start_lupine(spec)
        lupine.guard(_gate(self._network, lupine))
        self._stack.push_async_callback(lupine.aclose)
        if lupine.name in self._by_name:
            raise SimOptionError("name", f"a fake lupine named {lupine.name!r} already runs")
        self._by_endpoint[lupine.endpoint] = lupine
        if lupine.name:
            self._by_name[lupine.name] = lupine
        return lupine

    def by_name(self, name: str) -> FakeLupine:
        """The server standing for Node ``name``; raises ``LupineNotFound``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise LupineNotFound(f"no fake lupine for server {name!r}") from None

    def get(self, endpoint: str) -> FakeLupine | None:
        """The server at ``host:port``, or ``None`` (what a client connecting there would find)."""
        return self._by_endpoint.get(endpoint)

    def by_endpoint(self, endpoint: str) -> FakeLupine:
        """The server at ``host:port``; raises ``LupineNotFound``."""
        try:
            return self._by_endpoint[endpoint]
        except KeyError:
            raise LupineNotFound(f"no fake lupine listens on {endpoint!r}") from None


Network = Callable[[FakeLupine, str], bool]
"""Whether a connection from a source address may reach a fake server (see ``guard``)."""


def _gate(network: Network | None, lupine: FakeLupine) -> Callable[[str], bool] | None:
    if network is None:
        return None
    return lambda source: network(lupine, source)


@asynccontextmanager
async def open_lupine_fleet() -> AsyncIterator[LupineFleet]:
    """An empty fleet; every server started in it is closed when the block exits."""
    async with AsyncExitStack() as stack:
        yield LupineFleet(stack)
