"""A kubelet keeps writing while the apiserver fails: every status patch and every deletion it
sends is retried on 429, 5xx and transport errors with a capped backoff, as a real kubelet's
status manager does. Apart from the emulator, so the lifecycle reads as what happens to a pod
and this as how it reaches the apiserver."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from rgpu_kubesim._informer import TRANSPORT_ERRORS, KubeHttp, Reply
from rgpu_kubesim.kubelet._config import KubeletConfig

__all__ = ["Gone", "PodWrites", "pod_path"]

logger = logging.getLogger(__name__)


class Gone(Exception):
    """The pod no longer exists (or is another pod of the same name): stop quietly."""


def pod_path(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"


def _transient(status: int) -> bool:
    return status == 429 or status >= 500


class PodWrites:
    """The kubelet's requests to the apiserver, each sent until it is answered for good."""

    def __init__(self, api: KubeHttp, config: KubeletConfig) -> None:
        self._api, self._config = api, config

    async def send(self, send: Callable[[], Awaitable[Reply]]) -> Reply:
        """Send until the apiserver answers something other than 429/5xx (a kubelet retries)."""
        delay = self._config.retry_initial_seconds
        while True:
            try:
                reply = await send()
                if not _transient(reply.status):
                    return reply
                problem = f"HTTP {reply.status}"
            except TRANSPORT_ERRORS as exc:
                problem = repr(exc)
            logger.debug("kubelet: retrying in %.2fs after %s", delay, problem)
            await anyio.sleep(delay)
            delay = min(delay * 2, self._config.retry_max_seconds)

    async def write_status(
        self, path: str, status: Mapping[str, Any], annotations: Mapping[str, str] | None = None
    ) -> None:
        """A strategic merge patch of pods/status, as a kubelet sends: conditions merge by
        type, so one a controller wrote (a readiness gate's) stays."""
        patch: dict[str, Any] = {"status": status}
        if annotations:
            patch["metadata"] = {"annotations": dict(annotations)}
        await self._patch(f"{path}/status", patch, "strategic-merge")

    async def remove(self, path: str, uid: str) -> None:
        """Finish a graceful deletion as a kubelet does: grace 0, only this very pod."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        reply = await self.send(lambda: self._api.request("DELETE", path, body))
        if reply.status not in (200, 404, 409):
            logger.warning(
                "kubelet: DELETE %s refused: %s %s", path, reply.status, reply.text[:300]
            )

    async def _patch(self, path: str, patch: Mapping[str, Any], kind: str) -> None:
        reply = await self.send(lambda: self._api.patch(path, patch, kind))
        if reply.status == 404:
            raise Gone(path)
        if reply.status >= 400:
            logger.warning("kubelet: PATCH %s refused: %s %s", path, reply.status, reply.text[:300])
