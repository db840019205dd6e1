"""A pod's remote GPU is only real once a container starts with
``LUPINE_SERVER`` resolved and talks to its server. This emulator is the kubelet for that: it
starts bound pods, resolves their downward-API env *at start time* from the pod's annotations,
fails pods whose endpoint resolves empty (the bug we must see), connects them as clients of their
fake lupine server (so the server reports the cards busy) and finishes them after their run time.

Like a real kubelet it keeps retrying its status writes while the apiserver fails. A pod deleted
gracefully (``deletionTimestamp`` set) gets its containers stopped: they take the configured
shutdown time (never beyond the grace period), then the lupine client disconnects, the terminal
status is written and the kubelet deletes the pod with a grace period of 0 and a uid
precondition. A pod removed outright (a forced deletion) stops at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final

import anyio
import httpx
import orjson
from anyio.abc import TaskGroup, TaskStatus

from rgpu_contracts import ContractError
from rgpu_contracts.hami import split_endpoint
from rgpu_kubesim._informer import (
    DELETED,
    Informer,
    KubeHttp,
    base_url_of,
)
from rgpu_kubesim._lupine_errors import SimOptionError
from rgpu_kubesim.kubelet import _pod_status
from rgpu_kubesim.kubelet._config import KubeletConfig, LupineClientSink, RunRecord
from rgpu_kubesim.kubelet._connections import (
    DIAL_ANNOTATION,
    Attachment,
    attach,
    dial_all,
    dial_targets,
)
from rgpu_kubesim.kubelet._container_env import resolve_env
from rgpu_kubesim.kubelet._container_gpus import (
    StartFailure,
    containers_asking,
    devices,
    endpoint_of,
    memory_bytes,
)
from rgpu_kubesim.kubelet._pod_addresses import PodAddresses
from rgpu_kubesim.kubelet._pod_status import exited, now_rfc3339
from rgpu_kubesim.kubelet._pod_writes import Gone, PodWrites, pod_path
from rgpu_kubesim.kubelet._running import Running, grace_of, stopped_within
from rgpu_kubesim.lupine import Dialed, dial

__all__ = [
    "DIAL_ANNOTATION",
    "ENV_ANNOTATION",
    "RUN_SECONDS_ANNOTATION",
    "Dialed",
    "KubeletConfig",
    "KubeletEmulator",
    "LupineClientSink",
    "RunRecord",
    "dial",
    "resolve_env",
]

logger = logging.getLogger(__name__)

ENV_ANNOTATION: Final = "sim.rgpu.io/env"
"""Where the kubelet records every container's env as resolved at start (JSON)."""
RUN_SECONDS_ANNOTATION: Final = "sim.rgpu.io/run-seconds"
"""How long the pod runs before it succeeds (seconds, a decimal number)."""
USER_AGENT: Final = "kubelet/v1.31.0 (rgpu-kubesim)"
"""How the emulator announces itself to the apiserver (its request tally names it so)."""
BOUND_PODS: Final = "spec.nodeName!="
"""The kubelets' watch: every pod bound to some node (each real kubelet watches its own)."""


class KubeletEmulator:
    """Runs bound pods; ``records`` keeps a ``RunRecord`` per pod started, by uid.

    ``apiserver`` is the apiserver's base URL (of an httpx client, its ``base_url``: the
    emulator talks through its own aiohttp session). Run with ``await tg.start(kubelet.run)``.
    ``lupine(endpoint)`` finds the fake server a container connecting to ``endpoint`` would
    reach (``LupineFleet.get``), or ``None``.
    """

    def __init__(
        self,
        config: KubeletConfig,
        apiserver: str | httpx.AsyncClient,
        lupine: Callable[[str], LupineClientSink | None],
    ) -> None:
        self.config = config
        self.api = KubeHttp(base_url_of(apiserver), user_agent=USER_AGENT)
        self._writes = PodWrites(self.api, config)
        self.lupine = lupine
        self._records: dict[str, RunRecord] = {}
        self._running: dict[str, Running] = {}
        self._removing: set[str] = set()
        self._readying: dict[str, tuple[Any, ...]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._tg: TaskGroup | None = None
        self._addresses = PodAddresses()
        self._pods = Informer(self.api, "/api/v1/pods", self._on_pod, field_selector=BOUND_PODS)

    @property
    def records(self) -> Mapping[str, RunRecord]:
        """One record per pod started, by uid (a read-only view)."""
        return MappingProxyType(self._records)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch bound pods and run them until cancelled."""
        async with self.api, anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self._pods.run)
            task_status.started()

    def _task_group(self) -> TaskGroup:
        if self._tg is None:
            raise RuntimeError("KubeletEmulator.run() is not running")
        return self._tg

    def _on_pod(self, kind: str, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        uid = str(pod["metadata"]["uid"])
        if kind == DELETED:
            self._removing.discard(uid)
            self._stop(uid)
            return
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(uid, pod)
            return
        phase = pod.get("status", {}).get("phase", "Pending")
        if phase == "Running" and uid in self._running:
            self._check_readiness(uid, pod)
        # Pods already past Pending were started by an earlier kubelet: not ours to run again.
        if phase != "Pending" or uid in self._running or uid in self._records:
            return
        running = Running()
        self._running[uid] = running
        self._task_group().start_soon(self._run_pod, pod, running)

    def _check_readiness(self, uid: str, pod: dict[str, Any]) -> None:
        """A readiness gate's condition changed (a controller wrote it): Ready follows, as the
        kubelet's next status sync has it; one write in flight per pod and value."""
        if not pod.get("spec", {}).get("readinessGates"):
            return
        wanted = _pod_status.ready_condition(pod, now_rfc3339())
        conditions = pod.get("status", {}).get("conditions") or ()
        current = next((c for c in conditions if c.get("type") == "Ready"), None)
        key = (wanted["status"], wanted["reason"], wanted["message"])
        if _pod_status.same_readiness(current, wanted) or self._readying.get(uid) == key:
            return
        self._readying[uid] = key
        self._task_group().start_soon(self._write_readiness, pod_path(pod), uid, wanted, key)

    async def _write_readiness(
        self, path: str, uid: str, ready: dict[str, Any], key: tuple[Any, ...]
    ) -> None:
        try:
            await self._writes.write_status(path, {"conditions": [ready]})
        except Gone:
            logger.debug("kubelet: pod %s is gone", uid)
        finally:
            if self._readying.get(uid) == key:
                del self._readying[uid]

    def _terminate(self, uid: str, pod: dict[str, Any]) -> None:
        """Begin stopping a pod whose graceful deletion started (a shorter grace also counts)."""
        running = self._running.get(uid)
        if running is not None:
            running.grace = min(grace_of(pod), running.grace or math.inf)
            if running.stopping_since is not None:
                running.kill.deadline = running.stopping_since + running.grace
            running.stop.set()
            return
        if uid not in self._removing:
            # Nothing of it runs here: the deletion only needs finishing.
            self._removing.add(uid)
            self._task_group().start_soon(self._remove_quietly, pod_path(pod), uid)

    def _stop(self, uid: str) -> None:
        running = self._running.pop(uid, None)
        if running is None:
            return
        running.scope.cancel()
        self._disconnect(uid)
        record = self._records.get(uid)
        if record is not None and record.finished_at is None:
            self._records[uid] = replace(record, deleted=True, finished_at=time.monotonic())

    async def _run_pod(self, pod: dict[str, Any], running: Running) -> None:
        uid = str(pod["metadata"]["uid"])
        with running.scope:
            try:
                await self._lifecycle(pod, running)
            except Gone:
                logger.debug("kubelet: pod %s is gone", uid)
        if self._running.get(uid) is running:
            del self._running[uid]
        self._disconnect(uid)
        self._addresses.release(uid)

    async def _lifecycle(self, pod: dict[str, Any], running: Running) -> None:
        path, uid = pod_path(pod), str(pod["metadata"]["uid"])
        if await stopped_within(running, self.config.start_delay_seconds):
            await self._writes.remove(path, uid)
            return
        current = self._cached(path, uid)
        record, attachment = self._start(current)
        where = await self._placement(current)
        # The env as resolved goes with the first status write: metadata changes through
        # pods/status are kept, so one write (one event for every pod watcher) carries both.
        env = {ENV_ANNOTATION: orjson.dumps(record.env).decode()}
        if record.phase == "Failed":
            unavailable = _pod_status.unavailable(current, where, record.message, now_rfc3339())
            await self._writes.write_status(path, unavailable, env)
            return
        if attachment is not None or dial_targets(record.annotations):
            # The sandbox's address is reported before anything connects from it: only then
            # can the cluster (a NetworkPolicy, say) admit the pod's connections.
            await self._writes.write_status(path, _pod_status.starting(current, where), env)
            env = {}
        failure = await self._connect(uid, where.pod_ip, attachment)
        if failure is not None:
            unavailable = _pod_status.unavailable(current, where, failure, now_rfc3339())
            await self._writes.write_status(path, unavailable, env)
            return
        await self._dial_targets(uid, where.pod_ip, current)
        await self._writes.write_status(path, _pod_status.running(current, where), env)
        run = self._run_seconds(current)
        if not await stopped_within(running, run):
            self._finish(uid, "Succeeded", 0)
            await self._writes.write_status(path, _pod_status.terminated(current, where, exited(0)))
            return
        code = await self._shut_down(uid, running, run)
        await self._writes.write_status(path, _pod_status.terminated(current, where, exited(code)))
        await self._writes.remove(path, uid)

    async def _shut_down(self, uid: str, running: Running, run: float) -> int:
        """Stop the containers of a deleted pod; their exit code (0 when they finished)."""
        record = self._records[uid]
        now = time.monotonic()
        self._records[uid] = replace(record, terminating_at=now)
        left = record.started_at + run - now
        shutdown = self.config.shutdown_for(running.grace)
        running.stopping_since = anyio.current_time()
        running.kill.deadline = running.stopping_since + running.grace
        with running.kill:
            # The run may have ended before the deletion arrived (left < 0): no wait then.
            await anyio.sleep(max(0.0, min(left, shutdown)))
        finished = left <= shutdown and not running.kill.cancelled_caught
        self._finish(uid, "Succeeded" if finished else "Failed", 0 if finished else 137)
        if not finished:
            self._records[uid] = replace(self._records[uid], deleted=True)
        return 0 if finished else 137

    async def _placement(self, pod: Mapping[str, Any]) -> _pod_status.Placement:
        """The node's InternalIP and the pod's address in the node's pod range."""
        name = str(pod["spec"]["nodeName"])
        node = self._nodes.get(name)
        if node is None:
            reply = await self._writes.send(
                lambda: self.api.request("GET", f"/api/v1/nodes/{name}")
            )
            node = reply.json() if reply.status == 200 else {}
            if node:
                # A kubelet knows its own node: one read per node, not one per pod started.
                self._nodes[name] = node
        addresses = (node.get("status") or {}).get("addresses") or ()
        internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
        pod_ip = self._addresses.lease(str(pod["metadata"]["uid"]), node, name)
        # A node without an InternalIP gets its pod range's gateway, as a bridge would have it.
        host_ip = internal[0] if internal else self._addresses.gateway(node, name)
        return _pod_status.Placement(host_ip=host_ip, pod_ip=pod_ip, started_at=now_rfc3339())

    # -- starting and stopping containers ----------------------------------------------------

    def _start(self, pod: dict[str, Any]) -> tuple[RunRecord, Attachment | None]:
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
        attachment = None
        try:
            if names:
                endpoint = endpoint_of(record.env, names, self.config.endpoint_env)
                record = replace(record, endpoint=endpoint)
                attachment = self._attachment(record, requesting, names, str(meta["name"]))
        except StartFailure as failure:
            record = replace(
                record, phase="Failed", message=str(failure), finished_at=record.started_at
            )
        self._records[record.uid] = record
        return record, attachment

    def _attachment(
        self,
        record: RunRecord,
        requesting: list[Mapping[str, Any]],
        names: list[str],
        hostname: str,
    ) -> Attachment:
        server = self.lupine(record.endpoint)
        if server is None or server.fault == "down":
            raise StartFailure(f"cannot connect to lupine at {record.endpoint}: nothing answers")
        gpus = devices(server.gpus, record.env, names, self.config.visible_devices_env)
        memory = memory_bytes(requesting, self.config.memory_resource)
        return Attachment(server=server, gpus=tuple(gpus), memory_bytes=memory, hostname=hostname)

    async def _connect(self, uid: str, address: str, attachment: Attachment | None) -> str | None:
        """Connect the pod's lupine client from ``address``; why it could not, else None."""
        record = replace(self._records[uid], address=address)
        self._records[uid] = record
        if attachment is not None:
            record = self._records[uid] = await attach(record, attachment, self.config)
        return record.message if record.phase == "Failed" else None

    async def _dial_targets(self, uid: str, address: str, pod: Mapping[str, Any]) -> None:
        outcomes = await dial_all(pod["metadata"].get("annotations") or {}, address, self.config)
        if outcomes:
            self._records[uid] = replace(self._records[uid], dials=outcomes)

    async def dial(self, uid: str, endpoint: str) -> Dialed:
        """Connect once from running pod ``uid``'s address to ``endpoint`` (``host:port``), as
        a process of that pod would. Raises ``SimOptionError`` when the pod does not run here
        or has no address yet."""
        record = self._records.get(uid)
        if uid not in self._running or record is None or not record.address:
            raise SimOptionError("uid", f"pod {uid!r} is not running on this kubelet")
        try:
            split_endpoint(endpoint)
        except ContractError:
            raise SimOptionError("endpoint", f"{endpoint!r} is not host:port") from None
        return await dial(endpoint, record.address, timeout=self.config.lupine_dial_timeout_seconds)

    def _disconnect(self, uid: str) -> None:
        record = self._records.get(uid)
        if record is not None and record.gpus:
            server = self.lupine(record.endpoint)
            if server is not None:
                server.remove_client(uid)

    def _finish(self, uid: str, phase: str, exit_code: int) -> None:
        self._disconnect(uid)
        record = self._records[uid]
        self._records[uid] = replace(
            record, phase=phase, exit_code=exit_code, finished_at=time.monotonic()
        )

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

    def _cached(self, path: str, uid: str) -> dict[str, Any]:
        """The pod as this kubelet's watch last saw it, as a kubelet starts containers from
        its pod cache (a GET per start would cost the apiserver a request per pod)."""
        pod = self._pods.objects.get(uid)
        if pod is None:
            raise Gone(path)
        return pod

    async def _remove_quietly(self, path: str, uid: str) -> None:
        try:
            await self._writes.remove(path, uid)
        finally:
            self._removing.discard(uid)
