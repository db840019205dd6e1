"""The soak's workload owner: it creates the stream's pods through the apiserver (and so through
the admission webhook), deletes the ones it means to, and notes what it saw — which pods it
asked to delete and when, which it could not create — for the verdict to tell an eviction from
a deletion it asked for. It behaves like a controller's client: a few calls at a time, retried
with backoff while the apiserver sheds load."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import httpx

from .soak_workload import SoakPod
from .stack import Stack

__all__ = ["DRIVER_CALLS", "Driver", "stream"]

RETRY_SECONDS = 60.0
"""How long the workload's owner keeps retrying a create or delete the apiserver refuses."""
DRIVER_CALLS = 16
"""Apiserver calls the workload's owner has in flight at once."""


@dataclass(slots=True)
class Driver:
    """The workload's owner: creates pods, deletes the ones it means to, notes what it saw."""

    stack: Stack
    deleted: set[str] = field(default_factory=set)
    created: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    """Pods never created: their keys."""
    server_errors: list[str] = field(default_factory=list)
    asked: dict[str, float] = field(default_factory=dict)
    """Pod key → when the workload first sent its DELETE (monotonic)."""
    limit: anyio.Semaphore = field(default_factory=lambda: anyio.Semaphore(DRIVER_CALLS))

    async def _send(
        self, key: str, send: Callable[[], Awaitable[httpx.Response]]
    ) -> httpx.Response | None:
        deadline: float | None = None
        delay = 0.1
        while deadline is None or time.monotonic() < deadline:
            # A few calls at a time, as a controller's client rate-limits itself: thousands
            # queued in one connection pool cost the in-process apiserver's loop more than
            # the calls themselves, and a machine that falls behind would never catch up.
            async with self.limit:
                deadline = deadline or time.monotonic() + RETRY_SECONDS
                response: httpx.Response | None
                try:
                    response = await send()
                except httpx.HTTPError:
                    response = None
            if response is not None and response.status_code < 500 and response.status_code != 429:
                return response
            if response is not None and "(HTTP 5" in response.text:
                self.server_errors.append(f"webhook answered 5xx for {key}: {response.text[:200]}")
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)
        self.errors.append(f"{key}: the apiserver kept refusing for {RETRY_SECONDS:g}s")
        return None

    async def _create(self, pod: SoakPod) -> httpx.Response | None:
        response = await self._send(pod.key, lambda: self.stack.create_pod(pod.manifest()))
        if (
            response is not None
            and response.status_code == 409
            and "AlreadyExists" in response.text
        ):
            # Names are unique in a soak: an earlier attempt whose answer was lost (a timeout
            # under load) created it. Carry on with the pod as stored.
            namespace, name = pod.key.split("/")
            stored = await self._send(
                pod.key,
                lambda: self.stack.apiserver.get(f"/api/v1/namespaces/{namespace}/pods/{name}"),
            )
            if stored is not None and stored.status_code == 200:
                return httpx.Response(201, json=stored.json())
        return response

    async def run_pod(self, pod: SoakPod) -> None:
        response = await self._create(pod)
        if response is None or response.status_code != 201:
            self.refused.add(pod.key)
        if response is None:
            return
        if response.status_code != 201:
            self.errors.append(f"{pod.key}: {response.status_code} {response.text[:200]}")
            return
        self.created.add(pod.key)
        uid = str(response.json()["metadata"]["uid"])
        if pod.fate == "delete-running":
            while uid not in self.stack.kubelet.records:  # noqa: ASYNC110 (an emulator's record)
                await anyio.sleep(0.05)
            await anyio.sleep(pod.delete_after_seconds)
        elif pod.fate == "delete-pending":
            await anyio.sleep(pod.delete_after_seconds)
        else:
            return
        self.deleted.add(pod.key)
        await self.delete(pod.key)

    async def delete(self, key: str) -> None:
        namespace, name = key.split("/")
        self.asked.setdefault(key, time.monotonic())
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        await self._send(key, lambda: self.stack.apiserver.delete(path))


async def stream(driver: Driver, plans: tuple[SoakPod, ...]) -> None:
    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        for pod in plans:
            await anyio.sleep(max(0.0, start + pod.arrival_seconds - time.monotonic()))
            tg.start_soon(driver.run_pod, pod)
