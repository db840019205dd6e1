"""Kube-scheduler cannot run here, yet rgpu's behaviour (wait times,
wake-ups, retries) only shows when something calls the extender the way kube-scheduler does and
queues pods the way it does. This emulator is that something: a client of the apiserver over HTTP
and of the extender over HTTP, with kube-scheduler's activeQ / backoffQ / unschedulable pods.

What it reproduces, and from where in kube-scheduler:
* one scheduling cycle at a time (filter, then prioritize when more than one node is left), the
  binding cycle running concurrently, as ``scheduleOne`` does with its binding goroutine;
* its pod informer only holds non-terminal pods, so a pod finishing reaches it as a deletion
  (``AssignedPodDelete``), which moves every unschedulable pod;
* an unschedulable pod moves back on node add, on scheduling-relevant node updates, on the
  deletion of an assigned pod and on an update of the pod itself; moved pods still serve the rest
  of their backoff; a move that arrives while the pod is being scheduled sends it to backoffQ
  instead of unschedulable (the ``moveRequestCycle`` rule), so no wake-up is lost;
* with ``pop_from_backoff`` (kube-scheduler 1.33 and later), an idle scheduler takes pods from
  backoffQ before their backoff ends (``SchedulerPopFromBackoffQ``); off by default, as in the
  v1.31 kube-scheduler rgpu deploys.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections import deque
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final

import aiohttp
import anyio
import httpx
import orjson
from anyio.abc import TaskGroup, TaskStatus

from rgpu_kubesim._informer import (
    ADDED,
    DELETED,
    MODIFIED,
    TRANSPORT_ERRORS,
    Informer,
    KubeHttp,
    base_url_of,
    close_session,
)
from rgpu_kubesim.scheduler._config import SchedulerConfig
from rgpu_kubesim.scheduler._extender_calls import (
    ExtenderError,
    extender_pod,
    parse_filter,
    parse_scores,
)
from rgpu_kubesim.scheduler._queue import SchedulingQueue
from rgpu_kubesim.scheduler._records import PodRecord, Step
from rgpu_kubesim.scheduler._scheduling import (
    NodeVerdicts,
    filter_inputs,
    find_feasible,
    fit_error,
    is_interested,
    node_changed,
    num_nodes_to_find,
    pod_updated,
    select_host,
)

__all__ = ["SchedulerEmulator"]

logger = logging.getLogger(__name__)

NON_TERMINAL_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"
"""kube-scheduler's pod informer field selector: finished pods leave its cache."""

TIMED: Final = ("filter", "prioritize", "bind", "cycle")
"""What ``latencies`` keeps: each extender verb as this scheduler waited for it, and each
scheduling cycle whole (the emulator's own work is a cycle minus its filter and prioritize)."""
_KEPT_LATENCIES: Final = 100_000
_EXTENDER_HEADERS: Final = {"Content-Type": "application/json", "Accept": "application/json"}
USER_AGENT: Final = "kube-scheduler/v1.31.0 (rgpu-kubesim)"
"""How the emulator announces itself to the apiserver (its request tally names it so)."""


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class SchedulerEmulator:
    """Schedules pending pods of ``config.scheduler_name`` through the extender.

    ``apiserver`` is the apiserver's base URL (of an httpx client, its ``base_url``: the
    emulator talks through its own aiohttp session). Run with ``await tg.start(emulator.run)``
    (it returns once both informers have listed); ``records`` keeps one ``PodRecord`` per pod
    seen, by uid.
    """

    def __init__(self, config: SchedulerConfig, apiserver: str | httpx.AsyncClient) -> None:
        self.config = config
        self.api = KubeHttp(base_url_of(apiserver), user_agent=USER_AGENT)
        self.queue = SchedulingQueue(
            initial_backoff=config.initial_backoff_seconds,
            max_backoff=config.max_backoff_seconds,
            flush_after=config.unschedulable_flush_seconds,
            pop_from_backoff=config.pop_from_backoff,
            window=config.backoff_window_seconds,
        )
        self._records: dict[str, PodRecord] = {}
        self._gated: set[str] = set()
        self._random = random.Random(config.seed)
        self._extenders: tuple[tuple[str, aiohttp.ClientSession], ...] = ()
        self._calls = 0
        self._node_order: list[dict[str, Any]] | None = None
        self._verdicts = NodeVerdicts()
        self._next_start = 0
        self._pods = Informer(
            self.api, "/api/v1/pods", self._on_pod, field_selector=NON_TERMINAL_PODS
        )
        self._nodes = Informer(self.api, "/api/v1/nodes", self._on_node)
        self._latencies = {name: deque[float](maxlen=_KEPT_LATENCIES) for name in TIMED}

    @property
    def records(self) -> Mapping[str, PodRecord]:
        """One record per pod seen, by uid (a read-only view)."""
        return MappingProxyType(self._records)

    @property
    def gated(self) -> frozenset[str]:
        """The uids of the pods this scheduler holds back for their scheduling gates."""
        return frozenset(self._gated)

    def latencies(self) -> Mapping[str, tuple[float, ...]]:
        """Seconds per extender call and per scheduling cycle, by ``TIMED`` name, the most
        recent first-to-last (bounded, so a long ``rgpu up`` does not grow)."""
        return {name: tuple(kept) for name, kept in self._latencies.items()}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch nodes and pods and schedule until cancelled."""
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self.api)
            # One session (its own kept-alive connection) per extender URL, as kube-scheduler
            # keeps one client per extender (aiohttp: three calls per pod, the cheapest client).
            urls = (self.config.extender_url, *self.config.more_extender_urls)
            # The extender's tlsConfig: verify it by the CA, present the client certificate.
            tls: ssl.SSLContext | bool = self.config.extender_tls or True
            sessions = [
                aiohttp.ClientSession(
                    headers=_EXTENDER_HEADERS,
                    trust_env=False,
                    connector=aiohttp.TCPConnector(ssl=tls),
                )
                for _ in urls
            ]
            for session in sessions:
                stack.push_async_callback(close_session, session)
            self._extenders = tuple((u.rstrip("/"), s) for u, s in zip(urls, sessions, strict=True))
            tg = await stack.enter_async_context(anyio.create_task_group())
            await tg.start(self._nodes.run)
            await tg.start(self._pods.run)
            task_status.started()
            await self._work(tg)

    # -- events ------------------------------------------------------------------------------

    def _responsible(self, pod: Mapping[str, Any]) -> bool:
        spec, meta = pod.get("spec", {}), pod["metadata"]
        return bool(
            spec.get("schedulerName") == self.config.scheduler_name
            and not spec.get("nodeName")
            and not meta.get("deletionTimestamp")
        )

    def _on_pod(self, kind: str, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        uid = str(pod["metadata"]["uid"])
        if kind == DELETED:
            self.queue.forget(uid)
            self._gated.discard(uid)
            if pod.get("spec", {}).get("nodeName"):
                self._move_all("assigned pod deleted or finished")
        elif not self._responsible(pod):
            self.queue.forget(uid)
            self._gated.discard(uid)
        elif pod.get("spec", {}).get("schedulingGates"):
            self._hold(uid, pod)
        elif kind == ADDED or old is None or uid in self._gated:
            self._admit(uid, pod)
        elif pod_updated(old, pod):
            self._step(uid, "updated")
            self.queue.updated(uid)

    def _hold(self, uid: str, pod: dict[str, Any]) -> None:
        """kube-scheduler's PreEnqueue: a gated pod never enters activeQ (no attempt, no
        extender call); the update that removes its last gate queues it."""
        self._record(uid, pod, time.monotonic())
        if uid not in self._gated:
            self._gated.add(uid)
            gates = ",".join(str(g.get("name", "")) for g in pod["spec"]["schedulingGates"])
            self._step(uid, "gated", gates)

    def _record(self, uid: str, pod: dict[str, Any], now: float) -> None:
        if uid not in self._records:
            self._records[uid] = PodRecord(uid=uid, key=_key(pod), first_seen=now)

    def _admit(self, uid: str, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        self._record(uid, pod, now)
        self._gated.discard(uid)
        if self._records[uid].queued_at is None:
            self._note(uid, queued_at=now)
        self._step(uid, "queued")
        self.queue.add(uid, int(pod.get("spec", {}).get("priority") or 0))

    def _on_node(self, kind: str, node: dict[str, Any], old: dict[str, Any] | None) -> None:
        self._node_order = None
        if kind != MODIFIED or old is None or filter_inputs(old) != filter_inputs(node):
            self._verdicts.clear()
        if kind == ADDED or (old is not None and node_changed(old, node)):
            self._move_all(f"node {node['metadata'].get('name')} {kind.lower()}")

    def _move_all(self, why: str) -> None:
        if self.config.trace:
            for uid in self.queue.parked():
                self._step(uid, "moved", why)
        moved = self.queue.move_all()
        if moved:
            logger.debug("moved %d unschedulable pods: %s", moved, why)

    # -- one scheduling cycle ----------------------------------------------------------------

    async def _work(self, tg: TaskGroup) -> None:
        while True:
            uid = self.queue.pop()
            if uid is None:
                await self.queue.wait()
                continue
            pod = self._pods.objects.get(uid)
            if pod is None or not self._responsible(pod):
                self.queue.forget(uid)
                continue
            started = time.perf_counter()
            await self._schedule(uid, pod, tg)
            self._latencies["cycle"].append(time.perf_counter() - started)

    def _note(self, uid: str, **changes: Any) -> None:
        record = self._records.get(uid)
        if record is not None:
            self._records[uid] = replace(record, **changes)

    def _step(self, uid: str, what: str, detail: str = "") -> None:
        record = self._records.get(uid)
        if self.config.trace and record is not None:
            step = Step(at=time.monotonic(), what=what, detail=detail)
            self._records[uid] = replace(record, steps=(*record.steps, step))

    def _refuse(self, uid: str, message: str) -> None:
        self._step(uid, "refused", message)
        record = self._records[uid]
        self._note(uid, last_message=message, refusals=(*record.refusals, message))
        self.queue.failed(uid, unschedulable=True)

    def _error(self, uid: str, message: str) -> None:
        self._step(uid, "error", message)
        record = self._records[uid]
        self._note(uid, last_message=message, errors=(*record.errors, message))
        self.queue.failed(uid, unschedulable=False)

    def _ordered_nodes(self) -> list[dict[str, Any]]:
        if self._node_order is None:
            nodes = self._nodes.objects.values()
            self._node_order = sorted(nodes, key=lambda n: str(n["metadata"].get("name", "")))
        return self._node_order

    async def _schedule(self, uid: str, pod: dict[str, Any], tg: TaskGroup) -> None:
        self._note(uid, attempts=self._records[uid].attempts + 1)
        self._step(uid, "attempt")
        nodes = self._ordered_nodes()
        wanted = num_nodes_to_find(len(nodes), self.config.percentage_of_nodes_to_score)
        feasible, reasons, self._next_start = find_feasible(
            pod, nodes, wanted, self._next_start, self._verdicts.for_pod(pod)
        )
        interested = is_interested(pod, self.config.managed_resources)
        try:
            if feasible and interested:
                if self._records[uid].filtered_rv is None:
                    rv = pod["metadata"].get("resourceVersion")
                    self._note(uid, filtered_rv=int(rv) if str(rv).isdigit() else 0)
                feasible = await self._filter(pod, feasible, reasons)
            if not feasible:
                self._refuse(uid, fit_error(len(nodes), reasons))
                return
            node = await self._choose(pod, feasible, interested)
        except ExtenderError as exc:
            self._error(uid, str(exc))
            return
        self.queue.assume(uid)
        tg.start_soon(self._binding_cycle, uid, pod, node, interested)

    async def _call(self, verb: str, body: object) -> Any:
        if not self._extenders:
            raise RuntimeError("SchedulerEmulator.run() is not running")
        self._calls += 1
        prefix, session = self._extenders[self._calls % len(self._extenders)]
        url = f"{prefix}/{verb}"
        started = time.perf_counter()
        try:
            with anyio.fail_after(self.config.http_timeout_seconds):
                async with session.post(url, data=orjson.dumps(body)) as response:
                    status, content = response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ExtenderError(f"{verb} call to the extender failed: {exc!r}") from exc
        finally:
            self._latencies[verb].append(time.perf_counter() - started)
        if status != 200:
            raise ExtenderError(f"failed {verb} with extender at URL {url}, code {status}")
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            raise ExtenderError(f"{verb} answered something that is not JSON: {exc}") from exc

    async def _filter(
        self, pod: dict[str, Any], nodes: list[str], reasons: dict[str, str]
    ) -> list[str]:
        args = {"Pod": extender_pod(pod), "Nodes": None, "NodeNames": nodes}
        kept, failed = parse_filter(await self._call("filter", args), nodes)
        reasons.update(failed)
        return kept

    async def _choose(self, pod: dict[str, Any], nodes: list[str], interested: bool) -> str:
        if len(nodes) == 1:
            return nodes[0]
        scores: dict[str, int] = {}
        if interested:
            args = {"Pod": extender_pod(pod), "Nodes": None, "NodeNames": nodes}
            try:
                scores = parse_scores(
                    await self._call("prioritize", args), self.config.prioritize_weight
                )
            except ExtenderError as exc:
                # kube-scheduler ignores prioritize errors and lets the other scores decide.
                logger.info("prioritize ignored for %s: %s", _key(pod), exc)
        return select_host(nodes, scores, self._random)

    # -- the binding cycle -------------------------------------------------------------------

    async def _binding_cycle(
        self, uid: str, pod: dict[str, Any], node: str, interested: bool
    ) -> None:
        try:
            error = await (self._bind_by_extender if interested else self._bind_directly)(pod, node)
        except ExtenderError as exc:
            error = str(exc)
        if error:
            self._error(uid, f"binding rejected: {error}")
            # The assumed pod no longer holds its place: others may fit now (kube does the same).
            self._move_all("binding failed")
            return
        self._note(uid, bound_at=time.monotonic(), node=node, last_message="")
        self._step(uid, "bound", node)

    async def _bind_by_extender(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        result = await self._call("bind", args)
        if not isinstance(result, dict):
            return f"bind answered {type(result).__name__}, not an ExtenderBindingResult"
        return str(result.get("Error") or "")

    async def _bind_directly(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding"
        try:
            reply = await self.api.post(path, binding)
        except TRANSPORT_ERRORS as exc:
            return f"binding request failed: {exc!r}"
        return "" if reply.status == 201 else f"{reply.status} {reply.text[:300]}"
