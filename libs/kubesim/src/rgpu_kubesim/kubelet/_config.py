"""What the kubelet emulator is configured with and what it records about each pod it ran.

Kept apart from the emulator so callers (the stack, the soak, tests) can build a configuration
and read run records without the machinery that watches and runs pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rgpu_kubesim._lupine_errors import SimOptionError
from rgpu_kubesim.lupine import LupineGpu


class LupineClientSink(Protocol):
    """The part of a fake lupine server the kubelet uses (``FakeLupine`` has it)."""

    @property
    def gpus(self) -> tuple[LupineGpu, ...]: ...

    @property
    def fault(self) -> str | None: ...

    def add_client(
        self,
        client_id: str,
        gpu_uuids: Sequence[str],
        *,
        memory_bytes: int = ...,
        address: str = ...,
        hostname: str | None = ...,
    ) -> object: ...

    def remove_client(self, client_id: str) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeletConfig:
    """Names and timings the emulated kubelet uses."""

    count_resource: str = "nvidia.com/remote-gpu"
    """A container naming this resource needs its lupine server to start."""
    memory_resource: str = "nvidia.com/remote-gpu-memory"
    """MiB per card; the client holds this much on each GPU it uses (1 GiB when absent)."""
    start_delay_seconds: float = 0.2
    """Image pull and container start, compressed."""
    default_run_seconds: float = 5.0
    """Run time of pods without a valid ``sim.rgpu.io/run-seconds`` annotation."""
    endpoint_env: str = "LUPINE_SERVER"
    visible_devices_env: str = "CUDA_VISIBLE_DEVICES"
    """Limits the GPUs a container uses (UUIDs or indices); unset means every GPU of the server."""
    retry_initial_seconds: float = 0.1
    """First wait before retrying a failed apiserver call; doubles per failure."""
    retry_max_seconds: float = 2.0
    shutdown_seconds: float | None = None
    """How long containers take to stop once a deleted pod's grace period starts; the pod's
    lupine client disconnects then. None: ``shutdown_fraction`` of the pod's grace period."""
    shutdown_fraction: float = 0.1
    """A well-behaved container exits well within its grace period, so a tenth by default."""
    lupine_connect_seconds: float = 10.0
    """How long a GPU container's lupine client keeps trying to connect while its connection
    is reset or unanswered (a policy admitting the pod may still be on its way); nothing
    listening fails the pod at once."""
    lupine_dial_timeout_seconds: float = 2.0
    """One connection attempt's limit: lupine answers the HTTP/2 preface in microseconds."""

    def __post_init__(self) -> None:
        if self.shutdown_seconds is not None and not self.shutdown_seconds >= 0:
            raise SimOptionError(
                "shutdown_seconds", f"must be >= 0 seconds or None, got {self.shutdown_seconds!r}"
            )
        if not 0 <= self.shutdown_fraction <= 1:
            raise SimOptionError(
                "shutdown_fraction", f"must be between 0 and 1, got {self.shutdown_fraction!r}"
            )
        for name in ("start_delay_seconds", "default_run_seconds", "lupine_connect_seconds"):
            if not getattr(self, name) >= 0:
                raise SimOptionError(name, f"must be >= 0 seconds, got {getattr(self, name)!r}")
        for name in ("retry_initial_seconds", "retry_max_seconds", "lupine_dial_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise SimOptionError(name, f"must be > 0 seconds, got {getattr(self, name)!r}")
        for name in ("count_resource", "endpoint_env"):
            if not getattr(self, name):
                raise SimOptionError(name, "must not be empty")

    def shutdown_for(self, grace_seconds: float) -> float:
        """Seconds a deleted pod's containers take to stop, never beyond its grace period."""
        wanted = self.shutdown_seconds
        if wanted is None:
            wanted = grace_seconds * self.shutdown_fraction
        return min(wanted, grace_seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One pod's run: where it ran, what its env resolved to, which GPUs it used and when."""

    uid: str
    key: str
    """``namespace/name``."""
    node: str
    env: Mapping[str, Mapping[str, str]]
    """Container name -> env as resolved when the containers started."""
    endpoint: str
    """The lupine server the pod talked to (``""`` when ``LUPINE_SERVER`` resolved empty)."""
    gpus: tuple[str, ...]
    """GPU UUIDs the pod held on that server; empty for pods without remote GPUs."""
    annotations: Mapping[str, str]
    """The pod's annotations at start."""
    started_at: float
    """``time.monotonic()`` when the containers started."""
    finished_at: float | None = None
    phase: str = "Running"
    """The phase the kubelet last gave the pod: ``Running``, ``Succeeded`` or ``Failed``."""
    message: str = ""
    deleted: bool = False
    """The pod was deleted before it finished."""
    terminating_at: float | None = None
    """``time.monotonic()`` when the kubelet saw the pod's deletionTimestamp (None: never)."""
    exit_code: int | None = None
    """The containers' exit code once they ended (137 when killed at deletion)."""
    address: str = ""
    """The pod's address, which its connections come from (empty before it has one)."""
    dials: Mapping[str, str] = field(default_factory=dict)
    """``sim.rgpu.io/dial`` endpoint -> how connecting to it went (``connected``, ``reset``,
    ``refused`` or ``timeout``)."""
