"""Why this module exists: kube-scheduler cannot run here, yet rgpu's behaviour (wait times,
wake-ups, retries) only shows when something calls the extender the way kube-scheduler does and
queues pods the way it does. This emulator is that something: a client of the apiserver over HTTP
and of the extender over HTTP, with kube-scheduler's activeQ / backoffQ / unschedulable pods.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
from anyio.abc import TaskStatus

from ._informer import Informer, KubeHttp
from ._scheduling import extender_pod, feasible, requests_any

__all__ = ["PodRecord", "SchedulerConfig", "SchedulerEmulator"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """How the emulated kube-scheduler behaves; defaults are kube-scheduler's."""

    extender_url: str
    scheduler_name: str = "rgpu-scheduler"
    managed_resources: tuple[str, ...] = ("nvidia.com/remote-gpu", "nvidia.com/remote-gpu-memory")
    http_timeout_seconds: float = 5.0
    """kube-scheduler's extender ``httpTimeout``."""
    initial_backoff_seconds: float = 1.0
    max_backoff_seconds: float = 10.0
    unschedulable_flush_seconds: float = 300.0
    """Pods nothing moved back are retried after this long (kube-scheduler: 5 minutes)."""
    prioritize_weight: int = 1
    seed: int = 0


@dataclass(slots=True, kw_only=True)
class PodRecord:
    """What happened to one pod: attempts, outcome, and the time from creation to binding."""

    uid: str
    key: str
    first_seen: float
    attempts: int = 0
    bound_at: float | None = None
    node: str | None = None
    last_message: str = ""
    refusals: list[str] = field(default_factory=list)

    @property
    def wait_seconds(self) -> float | None:
        return None if self.bound_at is None else self.bound_at - self.first_seen


@dataclass(slots=True)
class _Queues:
    active: deque[str] = field(default_factory=deque)
    backoff: dict[str, float] = field(default_factory=dict)
    unschedulable: dict[str, float] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    last_failure: dict[str, float] = field(default_factory=dict)

    def queued(self, uid: str) -> bool:
        return uid in self.active or uid in self.backoff or uid in self.unschedulable

    def forget(self, uid: str) -> None:
        if uid in self.active:
            self.active.remove(uid)
        for table in (self.backoff, self.unschedulable, self.attempts, self.last_failure):
            table.pop(uid, None)


class SchedulerEmulator:
    """Schedules pending pods of ``config.scheduler_name`` through the extender.

    Run with ``await tg.start(emulator.run)``; ``records`` keeps one ``PodRecord`` per pod seen.
    """

    def __init__(self, config: SchedulerConfig, apiserver: httpx.AsyncClient) -> None:
        self.config = config
        self.api = KubeHttp(apiserver)
        self.extender = httpx.AsyncClient(
            base_url=config.extender_url, timeout=config.http_timeout_seconds
        )
        self.records: dict[str, PodRecord] = {}
        self._queues = _Queues()
        self._wake = anyio.Event()
        self._random = random.Random(config.seed)
        self._pods = Informer(self.api, "/api/v1/pods", self._on_pod)
        self._nodes = Informer(self.api, "/api/v1/nodes", self._on_node)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self.extender, anyio.create_task_group() as tg:
            await tg.start(self._nodes.run)
            await tg.start(self._pods.run)
            tg.start_soon(self._timers)
            task_status.started()
            await self._work()

    # -- queueing -------------------------------------------------------------------------

    def _pending(self, pod: dict[str, Any]) -> bool:
        spec, meta = pod.get("spec", {}), pod["metadata"]
        return bool(
            spec.get("schedulerName") == self.config.scheduler_name
            and not spec.get("nodeName")
            and not meta.get("deletionTimestamp")
            and pod.get("status", {}).get("phase", "Pending") == "Pending"
        )

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED" or not self._pending(pod):
            self._queues.forget(uid)
            if kind == "DELETED" or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                self._move_all("pod event")
            return
        self._track(uid, pod)
        if uid in self._queues.unschedulable:
            # An update of the pending pod itself (an annotation counts) re-queues it.
            self._move(uid)
        elif not self._queues.queued(uid) and kind == "ADDED":
            self._activate(uid)

    def _track(self, uid: str, pod: dict[str, Any]) -> None:
        if uid not in self.records:
            meta = pod["metadata"]
            key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            self.records[uid] = PodRecord(uid=uid, key=key, first_seen=time.monotonic())

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        self._move_all(f"node {kind.lower()}")

    def _activate(self, uid: str) -> None:
        self._queues.active.append(uid)
        self._wake.set()

    def _move(self, uid: str) -> None:
        self._queues.unschedulable.pop(uid, None)
        if self._backoff_until(uid) > time.monotonic():
            self._queues.backoff[uid] = self._backoff_until(uid)
        else:
            self._activate(uid)

    def _move_all(self, why: str) -> None:
        if self._queues.unschedulable:
            logger.debug("moving %d unschedulable pods: %s", len(self._queues.unschedulable), why)
        for uid in list(self._queues.unschedulable):
            self._move(uid)

    def _backoff_until(self, uid: str) -> float:
        attempts = self._queues.attempts.get(uid, 0)
        if not attempts:
            return 0.0
        delay = self.config.initial_backoff_seconds * 2.0 ** (attempts - 1)
        return self._queues.last_failure.get(uid, 0.0) + min(delay, self.config.max_backoff_seconds)

    async def _timers(self) -> None:
        while True:
            now = time.monotonic()
            for uid, due in list(self._queues.backoff.items()):
                if due <= now:
                    del self._queues.backoff[uid]
                    self._activate(uid)
            flush = self.config.unschedulable_flush_seconds
            for uid, since in list(self._queues.unschedulable.items()):
                if now - since >= flush:
                    self._move(uid)
            await anyio.sleep(0.05)

    # -- scheduling one pod -----------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            if not self._queues.active:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            uid = self._queues.active.popleft()
            pod = self._pods.objects.get(uid)
            if pod is not None and self._pending(pod):
                await self._schedule(uid, pod)

    def _fail(self, uid: str, message: str, *, unschedulable: bool) -> None:
        record = self.records[uid]
        record.last_message = message
        self._queues.attempts[uid] = self._queues.attempts.get(uid, 0) + 1
        self._queues.last_failure[uid] = time.monotonic()
        if unschedulable:
            record.refusals.append(message)
            self._queues.unschedulable[uid] = time.monotonic()
        else:
            self._queues.backoff[uid] = self._backoff_until(uid)

    async def _schedule(self, uid: str, pod: dict[str, Any]) -> None:
        record = self.records[uid]
        record.attempts += 1
        nodes = feasible(pod, self._nodes.objects.values())
        if not nodes:
            self._fail(uid, "0 nodes are available", unschedulable=True)
            return
        interested = requests_any(pod, self.config.managed_resources)
        try:
            if interested:
                nodes = await self._filter(uid, pod, nodes)
                if not nodes:
                    return
            node = await self._choose(pod, nodes, interested)
            error = await self._bind(pod, node, interested)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self._fail(uid, f"extender call failed: {exc!r}", unschedulable=False)
            return
        if error:
            self._fail(uid, f"binding rejected: {error}", unschedulable=False)
            return
        record.bound_at, record.node = time.monotonic(), node
        self._queues.forget(uid)

    async def _filter(self, uid: str, pod: dict[str, Any], nodes: list[str]) -> list[str]:
        args = {"Pod": extender_pod(pod), "Nodes": None, "NodeNames": nodes}
        response = await self.extender.post("/filter", content=orjson.dumps(args))
        response.raise_for_status()
        result = orjson.loads(response.content)
        if result.get("Error"):
            self._fail(uid, f"extender error: {result['Error']}", unschedulable=False)
            return []
        kept = [n for n in result.get("NodeNames") or [] if n in nodes]
        if not kept:
            failed = {
                **(result.get("FailedNodes") or {}),
                **(result.get("FailedAndUnresolvableNodes") or {}),
            }
            reasons = sorted(set(failed.values()))
            self._fail(
                uid, f"0/{len(nodes)} nodes are available: {'; '.join(reasons)}", unschedulable=True
            )
        return kept

    async def _choose(self, pod: dict[str, Any], nodes: list[str], interested: bool) -> str:
        if len(nodes) == 1 or not interested:
            return self._random.choice(nodes)
        args = {"Pod": extender_pod(pod), "Nodes": None, "NodeNames": nodes}
        response = await self.extender.post("/prioritize", content=orjson.dumps(args))
        response.raise_for_status()
        scores = {
            p["Host"]: int(p["Score"]) * self.config.prioritize_weight
            for p in orjson.loads(response.content)
        }
        best = max(scores.get(n, 0) for n in nodes)
        return self._random.choice([n for n in nodes if scores.get(n, 0) == best])

    async def _bind(self, pod: dict[str, Any], node: str, interested: bool) -> str:
        meta = pod["metadata"]
        if interested:
            args = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": node,
            }
            response = await self.extender.post("/bind", content=orjson.dumps(args))
            response.raise_for_status()
            return str(orjson.loads(response.content).get("Error") or "")
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding"
        response = await self.api.post(path, binding)
        return "" if response.status_code == 201 else response.text
