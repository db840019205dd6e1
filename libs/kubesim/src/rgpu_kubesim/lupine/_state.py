"""What a fake lupine server knows (its GPUs, its clients, its fault)
is shared by the HTTP/1.1 side, the HTTP/2 side and the metrics renderer, and tests change it
while connections are open — so it lives in one small object the protocol reads on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

from rgpu_kubesim._lupine_errors import SimOptionError

__all__ = [
    "FAULTS",
    "HANGUPS",
    "MODES",
    "Admit",
    "Fault",
    "Hangup",
    "LupineClient",
    "LupineGpu",
    "LupineState",
    "Mode",
    "check_fault",
    "check_hangup",
    "check_mode",
    "make_gpus",
]

Mode: TypeAlias = Literal["sniff", "h2only"]
Fault: TypeAlias = Literal["down", "hang", "error500", "truncated"]
Hangup: TypeAlias = Literal["reset", "close"]
"""How an ``h2only`` server ends a connection: ``reset`` as the released lupine build does
(it answers, then resets the connection with ``SO_LINGER{1,0}``), or ``close`` (keeps it open
for more requests and closes cleanly: the fake's behaviour before the real build was seen)."""

Admit: TypeAlias = Callable[[str], bool]
"""Whether the network lets a connection from this source address reach the server."""

MODES: Final[tuple[Mode, ...]] = ("sniff", "h2only")
FAULTS: Final[tuple[Fault, ...]] = ("down", "hang", "error500", "truncated")
HANGUPS: Final[tuple[Hangup, ...]] = ("reset", "close")


def check_mode(mode: str) -> Mode:
    """Return ``mode`` typed, or raise ``SimOptionError`` listing the accepted modes."""
    if mode not in MODES:
        raise SimOptionError("mode", f"{mode!r} is not one of {', '.join(MODES)}")
    return mode


def check_hangup(hangup: str) -> Hangup:
    """Return ``hangup`` typed, or raise ``SimOptionError`` listing the accepted values."""
    if hangup not in HANGUPS:
        raise SimOptionError("hangup", f"{hangup!r} is not one of {', '.join(HANGUPS)}")
    return hangup


def check_fault(fault: str | None) -> Fault | None:
    """Return ``fault`` typed (``None`` clears it), or raise ``SimOptionError``."""
    if fault is not None and fault not in FAULTS:
        raise SimOptionError("fault", f"{fault!r} is not one of {', '.join(FAULTS)} or None")
    return fault


@dataclass(frozen=True, slots=True, kw_only=True)
class LupineGpu:
    """One GPU of a fake server, as NVML would name it (``device_type`` has spaces, not dashes)."""

    uuid: str
    index: int
    device_type: str
    memory_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LupineClient:
    """A connected client process and the GPUs it holds memory on.

    ``memory_bytes`` is per GPU; lupine reports one usage line per (client, GPU).
    """

    client_id: str
    gpu_uuids: tuple[str, ...]
    memory_bytes: int
    address: str
    hostname: str
    name: str
    pid: int
    utilization_percent: int
    serial: int


class LupineState:
    """Mutable state of one fake server; only the owning ``FakeLupine`` mutates it."""

    __slots__ = (
        "_clients",
        "_revision",
        "_serial",
        "admit",
        "connections",
        "cuda_version",
        "fault",
        "gpus",
        "hangup",
        "mode",
        "refused",
        "rendered",
    )

    def __init__(
        self,
        *,
        mode: Mode,
        gpus: tuple[LupineGpu, ...],
        cuda_version: str,
        hangup: Hangup = "reset",
    ) -> None:
        self.mode: Mode = mode
        self.hangup: Hangup = hangup
        # Accepted connections: the released server forks a process for each one.
        self.connections = 0
        # The network in front of the server (a NetworkPolicy-enforcing CNI): sources it
        # refuses never reach lupine; ``None`` lets every source through.
        self.admit: Admit | None = None
        self.refused = 0
        self.gpus = gpus
        self.cuda_version = cuda_version
        self.fault: Fault | None = None
        self._clients: dict[str, LupineClient] = {}
        self._serial = 0
        self._revision = 0
        self.rendered: tuple[int, str] | None = None
        """The last ``/metrics`` text and the ``revision`` it was rendered at."""

    @property
    def revision(self) -> int:
        """Counts changes of the clients (the GPUs never change): what ``/metrics`` shows."""
        return self._revision

    @property
    def clients(self) -> Mapping[str, LupineClient]:
        """A read-only snapshot of the connected clients, keyed by client id."""
        return MappingProxyType(dict(self._clients))

    def gpu(self, uuid: str) -> LupineGpu | None:
        """The GPU with this uuid, if the server has it."""
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def put_client(self, client: LupineClient) -> None:
        """Add or replace a client (a reconnecting process keeps its id)."""
        self._clients[client.client_id] = client
        self._revision += 1

    def pop_client(self, client_id: str) -> bool:
        """Forget a client; ``False`` when it was not connected."""
        self._revision += 1
        return self._clients.pop(client_id, None) is not None

    def next_serial(self) -> int:
        """A per-server sequence number, used to make process ids look distinct."""
        self._serial += 1
        return self._serial


def make_gpus(
    uuids: Sequence[str], *, device_type: str, memory_bytes: int
) -> tuple[LupineGpu, ...]:
    """Number the GPUs in the given order; reject empty or duplicate uuids."""
    if memory_bytes <= 0:
        raise SimOptionError("gpu_memory_bytes", f"must be positive, got {memory_bytes}")
    _check_unique(uuids, "gpus")
    return tuple(
        LupineGpu(uuid=u, index=i, device_type=device_type, memory_bytes=memory_bytes)
        for i, u in enumerate(uuids)
    )


def _check_unique(uuids: Iterable[str], field: str) -> None:
    seen: set[str] = set()
    for uuid in uuids:
        if not uuid or uuid in seen:
            problem = "an empty uuid" if not uuid else f"{uuid!r} twice"
            raise SimOptionError(field, f"GPU uuids must be distinct and non-empty; got {problem}")
        seen.add(uuid)
