"""Why this module exists: a pod's remote GPU is only real once a container starts with
``LUPINE_SERVER`` resolved and talks to its server. This emulator is the kubelet for that: it
starts bound pods, resolves their downward-API env *at start time* from the pod's annotations,
fails pods whose endpoint resolves empty (the bug we must see), connects them as clients of their
fake lupine server (so the server reports the cards busy) and finishes them after their run time.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import httpx
import orjson
from anyio.abc import TaskGroup, TaskStatus

from ._informer import Informer, KubeHttp

__all__ = [
    "ENV_ANNOTATION",
    "RUN_SECONDS_ANNOTATION",
    "KubeletConfig",
    "KubeletEmulator",
    "RunRecord",
]

logger = logging.getLogger(__name__)

ENV_ANNOTATION = "sim.rgpu.io/env"
RUN_SECONDS_ANNOTATION = "sim.rgpu.io/run-seconds"
_FIELD = re.compile(r"^metadata\.(annotations|labels)\['(.+)'\]$")


class LupineClientSink(Protocol):
    """The part of a fake lupine server the kubelet uses."""

    @property
    def gpus(self) -> tuple[Any, ...]: ...

    def add_client(self, client_id: str, gpu_uuids: list[str]) -> object: ...

    def remove_client(self, client_id: str) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeletConfig:
    """Timing and names the emulated kubelet uses."""

    count_resource: str = "nvidia.com/remote-gpu"
    start_delay_seconds: float = 0.2
    """Image pull and container start, compressed."""
    default_run_seconds: float = 5.0
    endpoint_env: str = "LUPINE_SERVER"
    visible_devices_annotation: str = "rgpu.io/visible-devices"


@dataclass(slots=True, kw_only=True)
class RunRecord:
    """One pod's run: where it ran, what its env resolved to, which GPUs it used and when."""

    uid: str
    key: str
    node: str
    env: dict[str, dict[str, str]]
    endpoint: str
    gpus: tuple[str, ...]
    annotations: dict[str, str]
    started_at: float
    finished_at: float | None = None
    phase: str = "Running"
    message: str = ""


def resolve_env(pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Resolve every container's env the way the kubelet does, from the pod as it is now."""
    spec = pod.get("spec", {})
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    return {c["name"]: {e["name"]: _value(pod, e) for e in c.get("env") or []} for c in containers}


def _value(pod: Mapping[str, Any], env: Mapping[str, Any]) -> str:
    if "value" in env or "valueFrom" not in env:
        return str(env.get("value", ""))
    path = (env["valueFrom"].get("fieldRef") or {}).get("fieldPath", "")
    meta = pod.get("metadata", {})
    match = _FIELD.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.uid": meta.get("uid"),
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "spec.nodeName": pod.get("spec", {}).get("nodeName"),
    }
    return str(simple.get(path) or "")


def _requesting(pod: Mapping[str, Any], resource: str) -> list[str]:
    spec = pod.get("spec", {})
    names = []
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        res = c.get("resources") or {}
        if resource in (res.get("limits") or {}) or resource in (res.get("requests") or {}):
            names.append(c["name"])
    return names


@dataclass(slots=True)
class _Running:
    cancel: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class KubeletEmulator:
    """Runs bound pods; ``records`` keeps a ``RunRecord`` per pod started."""

    def __init__(
        self,
        config: KubeletConfig,
        apiserver: httpx.AsyncClient,
        lupine: Callable[[str], LupineClientSink | None],
    ) -> None:
        self.config = config
        self.api = KubeHttp(apiserver)
        self.lupine = lupine
        self.records: dict[str, RunRecord] = {}
        self._running: dict[str, _Running] = {}
        self._tg: TaskGroup | None = None
        self._pods = Informer(self.api, "/api/v1/pods", self._on_pod)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self._pods.run)
            task_status.started()

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            running = self._running.pop(uid, None)
            if running is not None:
                running.cancel.cancel()
            return
        phase = pod.get("status", {}).get("phase", "Pending")
        if pod.get("spec", {}).get("nodeName") and phase == "Pending" and uid not in self._running:
            self._running[uid] = _Running()
            assert self._tg is not None
            self._tg.start_soon(self._run_pod, pod)

    async def _run_pod(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self._running[uid].cancel:
            try:
                await self._lifecycle(pod)
            except httpx.HTTPError as exc:
                logger.warning("kubelet: pod %s: %s", uid, exc)
        self._disconnect(uid)

    async def _lifecycle(self, pod: dict[str, Any]) -> None:
        await anyio.sleep(self.config.start_delay_seconds)
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        current = await self.api.get(path)
        record = self._start_record(current)
        await self.api.patch(
            path, {"metadata": {"annotations": {ENV_ANNOTATION: orjson.dumps(record.env).decode()}}}
        )
        if record.phase == "Failed":
            await self._set_phase(path, record, "Failed", record.message)
            return
        await self._set_phase(path, record, "Running", "")
        await anyio.sleep(self._run_seconds(current))
        self._disconnect(record.uid)
        await self._set_phase(path, record, "Succeeded", "")

    def _start_record(self, pod: dict[str, Any]) -> RunRecord:
        meta = pod["metadata"]
        env = resolve_env(pod)
        annotations = dict(meta.get("annotations") or {})
        requesting = _requesting(pod, self.config.count_resource)
        endpoints = {env.get(name, {}).get(self.config.endpoint_env, "") for name in requesting}
        endpoint = next(iter(endpoints)) if len(endpoints) == 1 else ""
        record = RunRecord(
            uid=meta["uid"],
            key=f"{meta['namespace']}/{meta['name']}",
            node=pod["spec"]["nodeName"],
            env=env,
            endpoint=endpoint,
            gpus=(),
            annotations=annotations,
            started_at=time.monotonic(),
        )
        self.records[record.uid] = record
        if requesting and not endpoint:
            record.phase = "Failed"
            record.message = (
                f"{self.config.endpoint_env} resolved empty or inconsistent: {sorted(endpoints)}"
            )
        elif requesting:
            self._connect(record)
        return record

    def _connect(self, record: RunRecord) -> None:
        server = self.lupine(record.endpoint)
        if server is None:
            record.phase, record.message = (
                "Failed",
                f"no lupine server answers at {record.endpoint}",
            )
            return
        visible = record.annotations.get(self.config.visible_devices_annotation, "")
        gpus = [g for g in visible.split(",") if g] or [
            str(getattr(g, "uuid", g)) for g in server.gpus
        ]
        server.add_client(record.uid, gpus)
        record.gpus = tuple(gpus)

    def _disconnect(self, uid: str) -> None:
        record = self.records.get(uid)
        if record is None or not record.gpus:
            return
        server = self.lupine(record.endpoint)
        if server is not None:
            server.remove_client(uid)
        if record.finished_at is None:
            record.finished_at = time.monotonic()

    def _run_seconds(self, pod: Mapping[str, Any]) -> float:
        raw = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        try:
            return float(raw) if raw is not None else self.config.default_run_seconds
        except ValueError:
            return self.config.default_run_seconds

    async def _set_phase(self, path: str, record: RunRecord, phase: str, message: str) -> None:
        record.phase = phase
        if phase != "Running" and record.finished_at is None:
            record.finished_at = time.monotonic()
        status: dict[str, Any] = {"phase": phase}
        if message:
            status.update(reason="RemoteGPUUnavailable", message=message)
        await self.api.patch(f"{path}/status", {"status": status})
