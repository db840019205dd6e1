"""The fleet is only as good as discovery's view of the Nodes, and
that view must survive everything the apiserver does — restarts, dropped watches, ``410
Expired``, minutes of downtime — without ever dropping the last good fleet.

List, then watch from the list's resourceVersion (bookmarks keep it fresh). ``410 Expired``
means the history we need is gone: relist at once. Any other failure backs off (capped,
jittered) and resumes the watch from the last resourceVersion seen, relisting only if that
fails too. A failed list changes nothing; ``/readyz`` turns ready after the first list that
succeeds and stays ready while the apiserver is away, serving the last good fleet.

One watch on all Nodes serves both the fleet (server Nodes) and the topology (client Nodes):
a relabel that turns a node into a server arrives as one event on one stream, instead of as
a race between two, and the apiserver keeps one connection per replica, not two.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import cast

import anyio
from anyio.abc import TaskStatus
from opentelemetry import trace

from rgpu_runtime import Backoff, KubeClient, KubeError, KubeExpired, Readiness, WatchEvent

from .catalog import Catalog
from .instruments import Instruments

__all__ = ["NodeWatch"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


class NodeWatch:
    """Keeps a ``Catalog`` in step with the apiserver's Nodes."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        catalog: Catalog,
        readiness: Readiness,
        instruments: Instruments,
        backoff: Backoff,
    ) -> None:
        self._kube = kube
        self._catalog = catalog
        self._readiness = readiness
        self._instruments = instruments
        self._backoff = backoff
        self._version: str | None = None
        self._failures = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the Nodes until cancelled; started at once, ready after the first list."""
        self._readiness.set_not_ready("waiting for the first Node list")
        task_status.started()
        while True:
            try:
                await self._cycle()
            except KubeExpired:
                self._instruments.watch_restarts.labels("expired").inc()
                logger.info("Node watch expired; relisting")
                self._version = None
            except KubeError as exc:
                await self._failed(exc)

    async def _cycle(self) -> None:
        if self._version is None:
            self._version = await self._relist()
        await self._follow(self._version)

    async def _relist(self) -> str:
        with tracer.start_as_current_span("discovery.nodes.list") as span:
            listing = await self._kube.list_objects(self._kube.core.list_node)
            span.set_attribute("rgpu.nodes", len(listing.items))
            self._catalog.relist(listing.items)
        self._failures = 0
        if not self._readiness.ready:
            logger.info("first Node list: %d nodes", len(listing.items))
            self._readiness.set_ready()
        return listing.resource_version

    async def _follow(self, version: str) -> None:
        with tracer.start_as_current_span("discovery.nodes.watch") as span:
            span.set_attribute("rgpu.resource_version", version)
            stream = self._kube.watch(self._kube.core.list_node, resource_version=version)
            # The runtime's watch is an async generator; closing it closes the connection.
            async with aclosing(cast(AsyncGenerator[WatchEvent, None], stream)) as events:
                async for event in events:
                    self._failures = 0
                    self._version = event.resource_version or self._version
                    if event.type != "BOOKMARK":
                        self._catalog.observe(event.type, event.object)

    async def _failed(self, exc: KubeError) -> None:
        self._instruments.watch_restarts.labels("error").inc()
        operation = "list" if self._version is None else "watch"
        self._instruments.apiserver_errors.labels(operation, exc.code).inc()
        delay = self._backoff.delay(self._failures)
        self._failures += 1
        if not self._readiness.ready:
            self._readiness.set_not_ready(f"Node list failed: {exc.message}")
        logger.warning("Node %s failed (%s); retrying in %.1f s", operation, exc.message, delay)
        await anyio.sleep(delay)
