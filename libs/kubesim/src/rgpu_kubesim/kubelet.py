"""A pod's remote GPU is only real once a container starts with
``LUPINE_SERVER`` resolved and talks to its server. This emulator is the kubelet for that: it
starts bound pods, resolves their downward-API env *at start time* from the pod's annotations,
fails pods whose endpoint resolves empty (the bug we must see), connects them as clients of their
fake lupine server (so the server reports the cards busy) and finishes them after their run time.

Like a real kubelet it keeps retrying its status writes while the apiserver fails, and a pod
deleted while it runs stops at once and leaves its lupine server.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final, Protocol

import anyio
import httpx
import orjson
from anyio.abc import TaskGroup, TaskStatus

from . import _pod_status
from ._container_env import resolve_env
from ._container_gpus import StartFailure, containers_asking, devices, endpoint_of, memory_bytes
from ._informer import DELETED, Informer, KubeHttp
from ._lupine_errors import SimOptionError
from ._lupine_state import LupineGpu
from ._pod_addresses import PodAddresses

__all__ = [
    "ENV_ANNOTATION",
    "RUN_SECONDS_ANNOTATION",
    "KubeletConfig",
    "KubeletEmulator",
    "LupineClientSink",
    "RunRecord",
    "resolve_env",
]

logger = logging.getLogger(__name__)

ENV_ANNOTATION: Final = "sim.rgpu.io/env"
"""Where the kubelet records every container's env as resolved at start (JSON)."""
RUN_SECONDS_ANNOTATION: Final = "sim.rgpu.io/run-seconds"
"""How long the pod runs before it succeeds (seconds, a decimal number)."""
BOUND_PODS: Final = "spec.nodeName!="
"""The kubelets' watch: every pod bound to some node (each real kubelet watches its own)."""


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

    def __post_init__(self) -> None:
        for name in ("start_delay_seconds", "default_run_seconds"):
            if not getattr(self, name) >= 0:
                raise SimOptionError(name, f"must be >= 0 seconds, got {getattr(self, name)!r}")
        for name in ("retry_initial_seconds", "retry_max_seconds"):
            if not getattr(self, name) > 0:
                raise SimOptionError(name, f"must be > 0 seconds, got {getattr(self, name)!r}")
        for name in ("count_resource", "endpoint_env"):
            if not getattr(self, name):
                raise SimOptionError(name, "must not be empty")


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


def _transient(status: int) -> bool:
    return status == 429 or status >= 500


class _Gone(Exception):
    """The pod no longer exists (or is another pod of the same name): stop quietly."""


def _path(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"


def _now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class KubeletEmulator:
    """Runs bound pods; ``records`` keeps a ``RunRecord`` per pod started, by uid.

    Run with ``await tg.start(kubelet.run)``. ``lupine(endpoint)`` finds the fake server a
    container connecting to ``endpoint`` would reach (``LupineFleet.get``), or ``None``.
    """

    def __init__(
        self,
        config: KubeletConfig,
        apiserver: httpx.AsyncClient,
        lupine: Callable[[str], LupineClientSink | None],
    ) -> None:
        self.config = config
        self.api = KubeHttp(apiserver)
        self.lupine = lupine
        self._records: dict[str, RunRecord] = {}
        self._running: dict[str, anyio.CancelScope] = {}
        self._tg: TaskGroup | None = None
        self._addresses = PodAddresses()
        self._pods = Informer(self.api, "/api/v1/pods", self._on_pod, field_selector=BOUND_PODS)

    @property
    def records(self) -> Mapping[str, RunRecord]:
        """One record per pod started, by uid (a read-only view)."""
        return MappingProxyType(self._records)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch bound pods and run them until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self._pods.run)
            task_status.started()

    def _on_pod(self, kind: str, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        uid = str(pod["metadata"]["uid"])
        if kind == DELETED or pod["metadata"].get("deletionTimestamp"):
            self._stop(uid)
            return
        phase = pod.get("status", {}).get("phase", "Pending")
        # Pods already past Pending were started by an earlier kubelet: not ours to run again.
        if phase != "Pending" or uid in self._running or uid in self._records:
            return
        if self._tg is None:
            raise RuntimeError("KubeletEmulator.run() is not running")
        scope = anyio.CancelScope()
        self._running[uid] = scope
        self._tg.start_soon(self._run_pod, pod, scope)

    def _stop(self, uid: str) -> None:
        scope = self._running.pop(uid, None)
        if scope is None:
            return
        scope.cancel()
        self._disconnect(uid)
        record = self._records.get(uid)
        if record is not None and record.finished_at is None:
            self._records[uid] = replace(record, deleted=True, finished_at=time.monotonic())

    async def _run_pod(self, pod: dict[str, Any], scope: anyio.CancelScope) -> None:
        uid = str(pod["metadata"]["uid"])
        with scope:
            try:
                await self._lifecycle(pod)
            except _Gone:
                logger.debug("kubelet: pod %s is gone", uid)
        if self._running.get(uid) is scope:
            del self._running[uid]
        self._disconnect(uid)
        self._addresses.release(uid)

    async def _lifecycle(self, pod: dict[str, Any]) -> None:
        await anyio.sleep(self.config.start_delay_seconds)
        path = _path(pod)
        current = await self._read(path, str(pod["metadata"]["uid"]))
        record = self._start(current)
        where = await self._placement(current)
        env_json = orjson.dumps(record.env).decode()
        await self._write(path, {"metadata": {"annotations": {ENV_ANNOTATION: env_json}}})
        if record.phase == "Failed":
            end = _pod_status.Exit(
                phase="Failed",
                exit_code=1,
                reason="Error",
                finished_at=_now_rfc3339(),
                message=record.message,
                pod_reason="RemoteGPUUnavailable",
            )
            await self._write_status(path, _pod_status.terminated(current, where, end))
            return
        await self._write_status(path, _pod_status.running(current, where))
        await anyio.sleep(self._run_seconds(current))
        self._finish(record.uid)
        done = _pod_status.Exit(
            phase="Succeeded", exit_code=0, reason="Completed", finished_at=_now_rfc3339()
        )
        await self._write_status(path, _pod_status.terminated(current, where, done))

    async def _placement(self, pod: Mapping[str, Any]) -> _pod_status.Placement:
        """The node's InternalIP and the pod's address in the node's pod range."""
        name = str(pod["spec"]["nodeName"])
        response = await self._send(lambda: self.api.client.get(f"/api/v1/nodes/{name}"))
        node: dict[str, Any] = orjson.loads(response.content) if response.status_code == 200 else {}
        addresses = (node.get("status") or {}).get("addresses") or ()
        internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
        pod_ip = self._addresses.lease(str(pod["metadata"]["uid"]), node, name)
        # A node without an InternalIP gets its pod range's gateway, as a bridge would have it.
        host_ip = internal[0] if internal else self._addresses.gateway(node, name)
        return _pod_status.Placement(host_ip=host_ip, pod_ip=pod_ip, started_at=_now_rfc3339())

    async def _write_status(self, path: str, status: Mapping[str, Any]) -> None:
        await self._write(f"{path}/status", {"status": status})

    # -- starting and stopping containers ----------------------------------------------------

    def _start(self, pod: dict[str, Any]) -> RunRecord:
        meta = pod["metadata"]
        record = RunRecord(
            uid=str(meta["uid"]),
            key=f"{meta['namespace']}/{meta['name']}",
            node=str(pod["spec"]["nodeName"]),
            env=resolve_env(pod),
            endpoint="",
            gpus=(),
            annotations=MappingProxyType(dict(meta.get("annotations") or {})),
            started_at=time.monotonic(),
        )
        requesting = containers_asking(pod, self.config.count_resource)
        names = [str(c["name"]) for c in requesting]
        try:
            if names:
                endpoint = endpoint_of(record.env, names, self.config.endpoint_env)
                record = replace(record, endpoint=endpoint)
                record = self._connect(record, requesting, names, str(meta["name"]))
        except StartFailure as failure:
            record = replace(
                record, phase="Failed", message=str(failure), finished_at=record.started_at
            )
        self._records[record.uid] = record
        return record

    def _connect(
        self,
        record: RunRecord,
        requesting: list[Mapping[str, Any]],
        names: list[str],
        hostname: str,
    ) -> RunRecord:
        server = self.lupine(record.endpoint)
        if server is None or server.fault == "down":
            raise StartFailure(f"cannot connect to lupine at {record.endpoint}: nothing answers")
        gpus = devices(server.gpus, record.env, names, self.config.visible_devices_env)
        memory = memory_bytes(requesting, self.config.memory_resource)
        server.add_client(record.uid, gpus, memory_bytes=memory, hostname=hostname)
        return replace(record, gpus=tuple(gpus))

    def _disconnect(self, uid: str) -> None:
        record = self._records.get(uid)
        if record is not None and record.gpus:
            server = self.lupine(record.endpoint)
            if server is not None:
                server.remove_client(uid)

    def _finish(self, uid: str) -> None:
        self._disconnect(uid)
        record = self._records[uid]
        self._records[uid] = replace(record, phase="Succeeded", finished_at=time.monotonic())

    def _run_seconds(self, pod: Mapping[str, Any]) -> float:
        raw = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        if raw is None:
            return self.config.default_run_seconds
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            logger.warning("kubelet: %s=%r is not a number of seconds", RUN_SECONDS_ANNOTATION, raw)
            return self.config.default_run_seconds
        return seconds

    # -- talking to the apiserver ------------------------------------------------------------

    async def _send(self, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        """Send until the apiserver answers something other than 429/5xx (a kubelet retries)."""
        delay = self.config.retry_initial_seconds
        while True:
            try:
                response = await send()
                if not _transient(response.status_code):
                    return response
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = repr(exc)
            logger.debug("kubelet: retrying in %.2fs after %s", delay, problem)
            await anyio.sleep(delay)
            delay = min(delay * 2, self.config.retry_max_seconds)

    async def _read(self, path: str, uid: str) -> dict[str, Any]:
        response = await self._send(lambda: self.api.client.get(path))
        if response.status_code != 200:
            raise _Gone(path)
        pod: dict[str, Any] = orjson.loads(response.content)
        if pod["metadata"].get("uid") != uid:
            raise _Gone(path)
        return pod

    async def _write(self, path: str, patch: Mapping[str, Any]) -> None:
        response = await self._send(lambda: self.api.patch(path, patch))
        if response.status_code == 404:
            raise _Gone(path)
        if response.status_code >= 400:
            logger.warning(
                "kubelet: PATCH %s refused: %s %s", path, response.status_code, response.text[:300]
            )
