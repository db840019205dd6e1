"""Discovery probes lupine servers and reads which GPUs are busy from
their ``/metrics``; tests, benchmarks and the demo need many such servers on loopback whose
clients and failures they control from the same process. This module owns one server's
lifecycle (``run_lupine`` closes everything it opened); ``_fleet`` holds many.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

from rgpu_contracts.hami import join_endpoint
from rgpu_contracts.instances import instance_server_name
from rgpu_kubesim._lupine_errors import AddressUnavailable, SimOptionError
from rgpu_kubesim.lupine._metrics import render_metrics
from rgpu_kubesim.lupine._protocol import LupineProtocol
from rgpu_kubesim.lupine._state import (
    Fault,
    Hangup,
    LupineClient,
    LupineGpu,
    LupineState,
    Mode,
    check_fault,
    check_hangup,
    check_mode,
    make_gpus,
)

__all__ = [
    "DEFAULT_CUDA_VERSION",
    "DEFAULT_DEVICE_TYPE",
    "DEFAULT_GPU_MEMORY_BYTES",
    "FakeLupine",
    "LupineClient",
    "LupineGpu",
    "LupineSpec",
    "run_lupine",
    "start_lupine",
]

logger = logging.getLogger(__name__)

GIB: Final = 1 << 30
DEFAULT_DEVICE_TYPE: Final = "NVIDIA A100-SXM4-80GB"
DEFAULT_GPU_MEMORY_BYTES: Final = 80 * GIB
DEFAULT_CUDA_VERSION: Final = "12.4"


@dataclass(frozen=True, slots=True, kw_only=True)
class LupineSpec:
    """What to start: one fake server's address, protocol mode and GPUs.

    ``host`` must be an IP literal (a name could resolve to several sockets on different ports).
    ``port`` 0 picks a free port; the started server reports the real one. ``hangup`` says how
    an ``h2only`` server ends connections: ``reset`` (the released build) or ``close``.
    ``instance`` makes it one of several lupine instances of Node ``name`` (one per GPU): the
    server it stands for is then ``<name>@<port>``.
    """

    name: str = ""
    instance: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    mode: Mode = "sniff"
    hangup: Hangup = "reset"
    gpus: tuple[str, ...] = ()
    device_type: str = DEFAULT_DEVICE_TYPE
    gpu_memory_bytes: int = DEFAULT_GPU_MEMORY_BYTES
    cuda_version: str = DEFAULT_CUDA_VERSION
    gpu_table: tuple[LupineGpu, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_hangup(self.hangup)
        _check_host(self.host)
        if not 0 <= self.port <= 65535:
            raise SimOptionError("port", f"{self.port} is outside 0..65535 (0 = any free port)")
        table = make_gpus(
            self.gpus, device_type=self.device_type, memory_bytes=self.gpu_memory_bytes
        )
        object.__setattr__(self, "gpu_table", table)


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise SimOptionError("host", f"{host!r} is not an IP address, e.g. 127.0.0.1") from None


class FakeLupine:
    """A running fake lupine server; build it with ``run_lupine`` or ``LupineFleet.start``."""

    def __init__(self, spec: LupineSpec) -> None:
        self._spec = spec
        self._port = spec.port
        self._state = LupineState(
            mode=spec.mode,
            gpus=spec.gpu_table,
            cuda_version=spec.cuda_version,
            hangup=spec.hangup,
        )
        self._server: asyncio.Server | None = None
        self._live: set[asyncio.Transport] = set()

    def __repr__(self) -> str:
        return f"FakeLupine(name={self.name!r}, endpoint={self.endpoint!r}, mode={self.mode!r})"

    @property
    def name(self) -> str:
        """The server this fake stands for: its Node's name, or ``<node>@<port>`` for a lupine
        instance; may be empty for a lone server."""
        if self._spec.instance and self._spec.name:
            return instance_server_name(self._spec.name, self._port)
        return self._spec.name

    @property
    def node(self) -> str:
        """The Node this fake runs on (``name`` without the port of an instance)."""
        return self._spec.name

    @property
    def host(self) -> str:
        """The IP address the server listens on."""
        return self._spec.host

    @property
    def port(self) -> int:
        """The real port (never 0 once started)."""
        return self._port

    @property
    def endpoint(self) -> str:
        """``host:port`` as HAMi writes it into ``hami.io/lupine-endpoint``."""
        return join_endpoint(self.host, self._port)

    @property
    def mode(self) -> Mode:
        """``sniff`` (HTTP/1.1 and HTTP/2 on one port; newer builds with ``/metrics``) or
        ``h2only`` (the released build: HTTP/2 only, no ``/metrics``)."""
        return self._state.mode

    @property
    def hangup(self) -> Hangup:
        """How an ``h2only`` server ends connections: ``reset`` (released build) or ``close``."""
        return self._state.hangup

    @property
    def connections(self) -> int:
        """Connections accepted so far: the released server forks a process for each one."""
        return self._state.connections

    @property
    def refused(self) -> int:
        """Connections the network refused (``guard``) before lupine saw a byte."""
        return self._state.refused

    def guard(self, admit: Callable[[str], bool] | None) -> None:
        """Put a network in front of the server: ``admit(source_address)`` decides whether a
        connection reaches it (refused ones are reset at once); ``None`` removes it."""
        self._state.admit = admit

    @property
    def gpus(self) -> tuple[LupineGpu, ...]:
        """The server's GPUs in index order."""
        return self._state.gpus

    @property
    def clients(self) -> Mapping[str, LupineClient]:
        """Connected clients by id (a snapshot)."""
        return self._state.clients

    @property
    def fault(self) -> Fault | None:
        """The fault in effect, or ``None``."""
        return self._state.fault

    def add_client(
        self,
        client_id: str,
        gpu_uuids: Sequence[str],
        *,
        memory_bytes: int = GIB,
        address: str = "127.0.0.1",
        hostname: str | None = None,
        process_name: str = "python3",
        pid: int | None = None,
        utilization_percent: int = 0,
    ) -> LupineClient:
        """Connect (or reconnect) a client holding ``memory_bytes`` on each of ``gpu_uuids``.

        Raises ``SimOptionError`` for an empty id, a GPU this server does not have, or a
        negative amount.
        """
        _check_client_args(self._state, client_id, gpu_uuids, memory_bytes, utilization_percent)
        serial = self._state.next_serial()
        client = LupineClient(
            client_id=client_id,
            gpu_uuids=tuple(gpu_uuids),
            memory_bytes=memory_bytes,
            address=address,
            hostname=hostname if hostname is not None else client_id,
            name=process_name,
            pid=pid if pid is not None else 1000 + serial,
            utilization_percent=utilization_percent,
            serial=serial,
        )
        self._state.put_client(client)
        return client

    def remove_client(self, client_id: str) -> bool:
        """Disconnect a client; ``False`` if it was not connected (idempotent)."""
        return self._state.pop_client(client_id)

    def metrics_text(self) -> str:
        """What ``GET /metrics`` would answer now (without faults)."""
        return render_metrics(self._state)

    async def set_fault(self, fault: str | None) -> None:
        """Switch to ``fault`` (``down``, ``hang``, ``error500``, ``truncated``) or clear it.

        Returns once the fault is in effect: after ``down`` connections are refused and open
        ones reset; leaving ``down`` listens again on the same port. Connections that hung
        stay hung. Raises ``SimOptionError`` for an unknown fault and ``AddressUnavailable``
        when the port was taken while the server was down.
        """
        new = check_fault(fault)
        old, self._state.fault = self._state.fault, new
        if new == "down" and old != "down":
            await self._stop_listening()
        elif old == "down" and new != "down":
            await self.start()
        logger.debug("fake lupine %s fault %s -> %s", self.endpoint, old, new)

    async def start(self) -> None:
        """Listen (used by ``start_lupine``); raises ``AddressUnavailable``."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: LupineProtocol(self._state, self._live), self.host, self._port
            )
        except OSError as exc:
            raise AddressUnavailable(
                f"fake lupine {self.name or '(unnamed)'} cannot listen on "
                f"{join_endpoint(self.host, self._port)}: {exc.strerror or exc}; "
                "use port 0 for any free port, or a local address"
            ) from exc
        self._port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        """Stop listening and reset every open connection."""
        await self._stop_listening()

    async def _stop_listening(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for transport in tuple(self._live):
            transport.abort()
        self._live.clear()
        if server is not None:
            await server.wait_closed()


def _check_client_args(
    state: LupineState,
    client_id: str,
    gpu_uuids: Sequence[str],
    memory_bytes: int,
    utilization_percent: int,
) -> None:
    if not client_id:
        raise SimOptionError("client_id", "must not be empty")
    if isinstance(gpu_uuids, str):
        raise SimOptionError("gpu_uuids", "pass a sequence of GPU uuids, not one string")
    unknown = [u for u in gpu_uuids if state.gpu(u) is None]
    if unknown:
        known = ", ".join(g.uuid for g in state.gpus) or "none"
        raise SimOptionError("gpu_uuids", f"{unknown} not on this server (it has: {known})")
    if memory_bytes < 0:
        raise SimOptionError("memory_bytes", f"must be >= 0, got {memory_bytes}")
    if not 0 <= utilization_percent <= 100:
        raise SimOptionError("utilization_percent", f"must be 0..100, got {utilization_percent}")


async def start_lupine(spec: LupineSpec) -> FakeLupine:
    """Start a fake server; the caller must ``await server.aclose()`` (prefer ``run_lupine``)."""
    lupine = FakeLupine(spec)
    await lupine.start()
    return lupine


@asynccontextmanager
async def run_lupine(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    mode: str = "sniff",
    hangup: str = "reset",
    gpus: Sequence[str] = (),
    name: str = "",
    device_type: str = DEFAULT_DEVICE_TYPE,
    gpu_memory_bytes: int = DEFAULT_GPU_MEMORY_BYTES,
    cuda_version: str = DEFAULT_CUDA_VERSION,
) -> AsyncIterator[FakeLupine]:
    """Run one fake lupine server in the current event loop for the duration of the block.

    Raises ``SimOptionError`` for bad arguments and ``AddressUnavailable`` when it cannot listen.
    """
    spec = LupineSpec(
        name=name,
        host=host,
        port=port,
        mode=check_mode(mode),
        hangup=check_hangup(hangup),
        gpus=tuple(gpus),
        device_type=device_type,
        gpu_memory_bytes=gpu_memory_bytes,
        cuda_version=cuda_version,
    )
    lupine = await start_lupine(spec)
    try:
        yield lupine
    finally:
        await lupine.aclose()
